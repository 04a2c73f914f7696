"""The experimental Kubernetes backend: its manifests, and its client calls against a stub API server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from k8s_stub import KubeStub

from tessera.platform.clusters.base import JobState, LaunchRequest
from tessera.platform.clusters.kubernetes import KubernetesBackend
from tessera.platform.clusters.kubernetes_manifests import build_manifests, job_name
from tessera.platform.errors import ClusterError
from tessera.platform.spec.run_spec import parse_spec

SECRET = "k8s-secret-value-93a1"


def request(tmp_path: Path, nodes: int = 1, procs: int = 1, exclude: list[str] | None = None) -> LaunchRequest:
    spec = parse_spec(f"name: kube\ncommand: python train.py --lr 0.1\nimage: ghcr.io/tessera/train:1\n"
                      f"compute: {{nodes: {nodes}, procs_per_node: {procs}, cpus_per_node: 4, gpus_per_node: 2}}\n"
                      "parameters: {lr: 0.1}\nscheduling: {stop_grace: 45s}\n")
    key = tmp_path / "key.pem"
    key.write_text("PRIVATE KEY\n")
    folder = tmp_path / "r0"
    folder.mkdir(exist_ok=True)
    return LaunchRequest("rid", "kube", 0, folder, spec, {"RUN_NAME": "kube", "TESSERA_RUN_ID": "rid", "FOO": "bar"},
                         secret_env={"API_TOKEN": SECRET}, secret_files=[(key, "/var/run/secrets/k/key.pem", "KEY")],
                         exclude=exclude or [], time_limit=3600)


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_single_node_job_manifest(tmp_path: Path) -> None:
    secret, params, job = build_manifests(request(tmp_path, exclude=["bad-node"]), {"namespace": "ml"})
    assert (secret["kind"], params["kind"], job["kind"]) == ("Secret", "ConfigMap", "Job")
    assert secret["stringData"]["env.API_TOKEN"] == SECRET
    assert SECRET not in json.dumps(job) and SECRET not in json.dumps(params)     # referenced, not inlined
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["completions"], spec["completionMode"]) == (0, 1, "Indexed")
    assert spec["activeDeadlineSeconds"] == 3600
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert container["image"] == "ghcr.io/tessera/train:1"
    assert container["command"] == ["bash", "-c", "python train.py --lr 0.1"]
    env = _env(container)
    assert env["API_TOKEN"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "env.API_TOKEN"}}
    assert env["NODE_RANK"]["fieldRef"]["fieldPath"].endswith("job-completion-index']")
    assert env["RUN_NAME"] == "kube" and env["FOO"] == "bar" and env["NNODES"] == "1"
    assert env["KEY"] == "/var/run/secrets/k/key.pem" and env["TESSERA_PARAMETERS"] == "/etc/tessera/parameters.yaml"
    assert container["resources"] == {"requests": {"cpu": "4"}, "limits": {"nvidia.com/gpu": "2"}}
    assert pod["terminationGracePeriodSeconds"] == 45 and pod["restartPolicy"] == "Never"
    [term] = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-node"]}]
    assert params["data"]["parameters.yaml"].strip() == "lr: 0.1"


def test_multi_node_jobset_manifest(tmp_path: Path) -> None:
    *_, jobset = build_manifests(request(tmp_path, nodes=3, procs=2), {})
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    name = jobset["metadata"]["name"]
    assert name == job_name("kube", 0) == "tessera-kube-r0"
    [rjob] = jobset["spec"]["replicatedJobs"]
    spec = rjob["template"]["spec"]
    assert (spec["completions"], spec["parallelism"], spec["completionMode"]) == (3, 3, "Indexed")
    [container] = spec["template"]["spec"]["containers"]
    env = _env(container)
    assert env["MASTER_ADDR"] == f"{name}-node-0-0.{name}" and env["NNODES"] == "3"
    assert container["command"][:3] == ["torchrun", "--nnodes=3", "--node-rank=$(NODE_RANK)"]
    assert "--nproc-per-node=2" in container["command"] and container["command"][-3:] == [
        "bash", "-c", "python train.py --lr 0.1"]


def test_image_is_required(tmp_path: Path) -> None:
    req = request(tmp_path)
    req.spec = req.spec.model_copy(update={"image": None})
    with pytest.raises(ClusterError, match="image"):
        build_manifests(req, {})


@pytest.fixture
def stub():
    server = KubeStub()
    yield server
    server.close()


def test_client_calls_against_stub(stub: KubeStub, tmp_path: Path) -> None:
    backend = KubernetesBackend("kube", {"host": stub.url, "namespace": "ml"})
    req = request(tmp_path)
    handle = backend.submit(req)
    name = handle["job_id"]
    posted = [(m, p.split("?")[0]) for m, p, _ in stub.requests if m == "POST"]
    assert posted == [("POST", "/api/v1/namespaces/ml/secrets"), ("POST", "/api/v1/namespaces/ml/configmaps"),
                      ("POST", "/apis/batch/v1/namespaces/ml/jobs")]
    assert SECRET not in json.dumps(stub.objects[("ml", "jobs", name)])

    assert backend.status(handle).state is JobState.QUEUED
    stub.set_pod(name, 0, "Running", node="node-a")
    stub.logs[f"{name}-0"] = "step 1\nstep 2\n"
    status = backend.status(handle)
    assert status.state is JobState.RUNNING and status.nodes == ["node-a"]
    assert (req.folder / "node-0.log").read_text() == "step 1\nstep 2\n"
    stub.set_pod(name, 0, "Failed", node="node-a", exit_code=137, reason="OOMKilled")
    stub.conditions[name] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]
    status = backend.status(handle)
    assert (status.state, status.exit_code) == (JobState.OUT_OF_MEMORY, 137)
    assert [(e.rank, e.node, e.exit_code) for e in status.node_exits] == [(0, "node-a", 137)]

    backend.terminate(handle)
    method, path, body = stub.requests[-1]
    assert (method, path) == ("DELETE", f"/apis/batch/v1/namespaces/ml/jobs/{name}")
    assert body["gracePeriodSeconds"] == 45 and body["propagationPolicy"] == "Background"
    handle["cancelled"] = True
    assert backend.status(handle).state is JobState.CANCELLED
    backend.cleanup(handle)
    assert not [k for k in stub.objects if k[1] in ("secrets", "configmaps")]


def test_jobset_status_and_nodes(stub: KubeStub, tmp_path: Path) -> None:
    backend = KubernetesBackend("kube", {"host": stub.url})
    handle = backend.submit(request(tmp_path, nodes=2))
    name = handle["job_id"]
    assert ("default", "jobsets", name) in stub.objects
    for rank, node in ((0, "a"), (1, "b")):
        stub.set_pod(name, rank, "Succeeded", node=node, exit_code=0)
    stub.conditions[name] = [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]
    status = backend.status(handle)
    assert (status.state, status.exit_code, status.nodes) == (JobState.COMPLETED, 0, ["a", "b"])
    stub.nodes = [
        {"metadata": {"name": "a"}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "b"}, "spec": {"unschedulable": True},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "c"}, "spec": {},
         "status": {"conditions": [{"type": "Ready", "status": "False", "message": "kubelet stopped"}]}}]
    nodes = {n.name: (n.healthy, n.state) for n in backend.nodes()}
    assert nodes == {"a": (True, "ready"), "b": (False, "ready+cordoned"), "c": (False, "not-ready")}


def test_api_errors_are_cluster_errors(stub: KubeStub, tmp_path: Path) -> None:
    backend = KubernetesBackend("kube", {"host": stub.url})
    stub.fail_next("POST", "secrets", 403)
    with pytest.raises(ClusterError, match="403"):
        backend.submit(request(tmp_path))
    assert stub.objects == {}


def test_failed_submit_deletes_what_it_created_and_a_retry_succeeds(stub: KubeStub, tmp_path: Path) -> None:
    backend = KubernetesBackend("kube", {"host": stub.url, "namespace": "ml"})
    req, name = request(tmp_path), job_name("kube", 0)
    stub.fail_next("POST", "jobs", 500)
    with pytest.raises(ClusterError, match="500") as failure:
        backend.submit(req)
    assert SECRET not in str(failure.value)
    assert stub.objects == {}      # the Secret and ConfigMap this call created are gone
    deleted = sorted(p for m, p, _ in stub.requests if m == "DELETE")
    assert deleted == [f"/api/v1/namespaces/ml/configmaps/{name}-params",
                       f"/api/v1/namespaces/ml/secrets/{name}-secrets"]
    handle = backend.submit(req)
    assert handle["job_id"] == name
    assert (stub.stored("secrets"), stub.stored("jobs")) == ([f"{name}-secrets"], [name])


def test_retry_replaces_a_secret_an_earlier_attempt_left(stub: KubeStub, tmp_path: Path) -> None:
    """The supervisor died (or the Job create failed) after the Secret was made; the Secret was rotated since."""
    backend = KubernetesBackend("kube", {"host": stub.url, "namespace": "ml"})
    req = request(tmp_path)
    secret, *_ = build_manifests(req, {"namespace": "ml"})
    secret_name = secret["metadata"]["name"]
    stub.objects[("ml", "secrets", secret_name)] = {**secret, "stringData": {"env.API_TOKEN": "old-token"}}
    handle = backend.submit(req)
    assert stub.objects[("ml", "secrets", secret_name)]["stringData"]["env.API_TOKEN"] == SECRET
    assert ("PUT", f"/api/v1/namespaces/ml/secrets/{secret_name}") in [(m, p) for m, p, _ in stub.requests]
    assert stub.stored("jobs") == [handle["job_id"]] and stub.stored("secrets") == [secret_name]
    assert handle == backend.find(req)


@pytest.mark.parametrize("nodes, plural", [(1, "jobs"), (2, "jobsets")])
def test_submit_adopts_a_job_that_exists(stub: KubeStub, tmp_path: Path, nodes: int, plural: str) -> None:
    """An earlier attempt created the Job/JobSet (then failed to record it): no second one is made."""
    backend = KubernetesBackend("kube", {"host": stub.url})
    req = request(tmp_path, nodes=nodes)
    *_, job = build_manifests(req, {})
    name = job["metadata"]["name"]
    stub.objects[("default", plural, name)] = {**job, "metadata": {**job["metadata"], "uid": "earlier"}}
    handle = backend.submit(req)
    assert handle == backend.find(req) and (handle["job_id"], handle["kind"]) == (name, job["kind"])
    assert stub.stored(plural) == [name] and stub.objects[("default", plural, name)]["metadata"]["uid"] == "earlier"
    assert [m for m, p, _ in stub.requests if p.split("?")[0].endswith(f"/{plural}")] == ["POST"]


def test_failed_job_create_that_was_applied_keeps_its_objects(stub: KubeStub, tmp_path: Path) -> None:
    """A Job create can fail (504) after the API server took it: its Secret and ConfigMap must stay."""
    backend = KubernetesBackend("kube", {"host": stub.url})
    req = request(tmp_path)
    *_, job = build_manifests(req, {})
    stub.objects[("default", "jobs", job["metadata"]["name"])] = job
    stub.fail_next("POST", "jobs", 504)
    with pytest.raises(ClusterError, match="504"):
        backend.submit(req)
    assert len(stub.stored("secrets")) == len(stub.stored("configmaps")) == 1
    assert backend.find(req) is not None


def test_find_adopts_a_created_job_by_its_name(stub: KubeStub, tmp_path: Path) -> None:
    """What a supervisor restarted between submit and recording the handle relies on (docs/platform.md)."""
    backend = KubernetesBackend("kube", {"host": stub.url, "namespace": "ml"})
    req = request(tmp_path)
    assert backend.find(req) is None
    handle = backend.submit(req)
    found = backend.find(req)
    assert found is not None and (found["job_id"], found["kind"]) == (handle["job_id"], "Job")
    assert found["objects"] == handle["objects"]


def test_secret_files_are_binary_safe_distinct_and_their_folders_point_into_the_pod(tmp_path: Path) -> None:
    """Two secrets each holding a file called `secret` do not overwrite each other, bytes that are not
    UTF-8 survive, and a variable naming the local folder of a file (DOCKER_CONFIG) names the pod's."""
    import base64

    base = request(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "secret").write_bytes(b"\x00\xff binary keystore")
    (tmp_path / "b" / "secret").write_text("ssh key\n")
    files = [(tmp_path / "a" / "secret", "/secrets/a/secret", "SECRET_PATH_A"),
             (tmp_path / "b" / "secret", "/secrets/b/secret", "SECRET_PATH_B")]
    req = LaunchRequest("rid", "kube", 0, base.folder, base.spec, base.env,
                        secret_env={"DOCKER_CONFIG": str(tmp_path / "b")}, secret_files=files)
    secret, _, job = build_manifests(req, {"namespace": "ml"})
    contents = sorted(base64.b64decode(v) for v in secret["data"].values())
    assert contents == [b"\x00\xff binary keystore", b"ssh key\n"]
    assert secret["stringData"]["env.DOCKER_CONFIG"] == "/secrets/b"
    env = _env(job["spec"]["template"]["spec"]["containers"][0])
    assert (env["SECRET_PATH_A"], env["SECRET_PATH_B"]) == ("/secrets/a/secret", "/secrets/b/secret")
