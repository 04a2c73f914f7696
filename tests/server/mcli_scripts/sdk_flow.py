"""MosaicML's SDK flow, run by the mcli client's own Python (tests/server/test_mcli_client.py): prints one
JSON line of what it saw. Arguments: the run YAML's path, the API key (given to mcli.initialize, as
MosaicML's docs show; MOSAICML_API_KEY is not set)."""

import json
import sys

import mcli
from mcli import (
                  RunConfig,
                  create_run,
                  create_secret,
                  delete_run,
                  delete_secrets,
                  get_run,
                  get_run_logs,
                  get_runs,
                  get_secrets,
                  stop_run,
                  update_run,
                  wait_for_run_status,
)
from mcli.models import SecretType
from mcli.objects.secrets import MCLIEnvVarSecret

path, key = sys.argv[1], sys.argv[2]
out = {}
mcli.initialize(api_key=key)

config = RunConfig.from_file(path)
config.compute = {"cluster": "cpu", "gpus": 0}
run = create_run(config)
out["created"] = {"name": run.name, "status_known": run.status.name != "UNKNOWN", "cluster": run.cluster}
out["waited"] = wait_for_run_status(run, "COMPLETED", timeout=90).status.value
out["logs"] = "".join(get_run_logs(run))
updated = update_run(run, priority="low", max_retries=2, preemptible=True, retry_on_system_failure=False)
out["updated"] = {"priority": updated.priority, "max_retries": updated.max_retries,
                  "preemptible": updated.preemptible, "retry_on_system_failure": updated.retry_on_system_failure}
out["completed_on_cpu"] = sorted({(r.name, r.status.value) for r in get_runs(cluster_names=["cpu"],
                                                                            statuses=["COMPLETED"])})

long = create_run(RunConfig(name="sdk-long", image="python:3.11", command="sleep 120",
                            compute={"cluster": "cpu", "gpus": 0}))
wait_for_run_status(long, "RUNNING", timeout=90)
stop_run(long)
out["stopped"] = wait_for_run_status(long, "STOPPED", timeout=90).status.value
out["deleted"] = delete_run(get_run("sdk-long")).is_deleted
out["after_delete"] = [r.name for r in get_runs(runs=["sdk-long"])]
out["with_deleted"] = [[r.name, r.is_deleted] for r in get_runs(runs=["sdk-long"], include_deleted=True)]

made = create_secret(MCLIEnvVarSecret(name="sdk-token", secret_type=SecretType.environment, key="SDK_TOKEN",
                                      value="t0ps3cret-value"))
listed = {s.name: s for s in get_secrets()}["sdk-token"]
out["secret_made"] = {"name": made.name, "type": listed.secret_type.value, "key": listed.key}
delete_secrets(["sdk-token"])
out["secrets_after_delete"] = [s.name for s in get_secrets()]
print(json.dumps(out))
