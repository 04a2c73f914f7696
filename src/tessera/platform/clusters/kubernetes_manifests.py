"""The Kubernetes objects of one resumption, as plain manifests: what the backend creates, nothing it calls.

Kept apart from the backend (kubernetes.py: the API client, status, logs, deletion) because building
them needs no cluster and no `kubernetes` client, and every choice about the pods is made here.

One resumption is a batch/v1 Job (one node) or a JobSet (jobset.x-k8s.io/v1alpha2, several nodes: one
Indexed Job whose pods are the nodes; JobSet gives them stable DNS names, so MASTER_ADDR is pod 0's).
NODE_RANK comes from the pod's completion index, NNODES, MASTER_ADDR and MASTER_PORT are set, and with
several ranks per node the command runs under torchrun. Secrets become a Secret object: env values are
referenced with secretKeyRef (never inlined in the Job) and files are mounted at their mount path.
Parameters are a ConfigMap mounted at /etc/tessera/parameters.yaml. Excluded nodes become a node
affinity (kubernetes.io/hostname NotIn ...). Object names are fixed per resumption (`job_name`), so a
retried submit finds the objects an earlier attempt left.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

from tessera.platform.clusters.base import LaunchRequest
from tessera.platform.clusters.prelude_shell import prelude_script
from tessera.platform.errors import ClusterError

LABEL_RUN, LABEL_JOB = "tessera.dev/run", "tessera.dev/job"
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"


def _dns(name: str, limit: int = 63) -> str:
    out = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    return out[:limit].rstrip("-") or "run"


def job_name(run_name: str, resumption: int) -> str:
    suffix = f"-r{resumption}"
    return _dns("tessera-" + run_name, 40 - len(suffix)) + suffix   # JobSet pod names add ~20 characters


def _secret_key(name: str) -> str:
    return re.sub(r"[^-._a-zA-Z0-9]", "_", name)


def build_manifests(request: LaunchRequest, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects to create, in order: [Secret], ConfigMap, then the Job or JobSet."""
    spec, name = request.spec, job_name(request.run_name, request.resumption)
    namespace = config.get("namespace") or "default"
    image = spec.image or config.get("image")
    if not image:
        raise ClusterError(f"run {request.run_name}: a Kubernetes cluster needs a container image; set `image:` "
                           "in the run spec or `--image` on the cluster")
    labels = {LABEL_RUN: _dns(request.run_name), LABEL_JOB: name, "tessera.dev/resumption": str(request.resumption)}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    objects: list[dict[str, Any]] = []
    nodes, per_node = spec.compute.nodes, spec.compute.ranks_per_node
    port = str(config.get("master_port") or 29500)
    master = f"{name}-node-0-0.{name}" if nodes > 1 else "127.0.0.1"

    env = [{"name": k, "value": v} for k, v in request.env.items()
           if k not in ("TESSERA_HEARTBEAT", "TESSERA_PARAMETERS", "PATH")]
    env += [{"name": "TESSERA_HEARTBEAT", "value": "/tmp/tessera/heartbeat.json"},
            {"name": "TESSERA_PARAMETERS", "value": "/etc/tessera/parameters.yaml"},
            {"name": "NNODES", "value": str(nodes)}, {"name": "MASTER_ADDR", "value": master},
            {"name": "MASTER_PORT", "value": port},
            {"name": "NODE_RANK", "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}}]
    volumes: list[dict[str, Any]] = [{"name": "parameters", "configMap": {"name": f"{name}-params"}}]
    mounts: list[dict[str, Any]] = [{"name": "parameters", "mountPath": "/etc/tessera", "readOnly": True}]
    objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": f"{name}-params"},
                    "data": {"parameters.yaml": spec.parameters_yaml()}})
    if request.secret_env or request.secret_files:
        # Secret variables that name a file or folder on this machine (DOCKER_CONFIG, SECRET_PATH_X) must
        # name the same thing where the pod mounts it.
        in_pod = {}
        for path, mount, _ in request.secret_files:
            in_pod[str(path)] = mount
            in_pod[str(Path(path).parent)] = str(Path(mount).parent)
        data = {f"env.{_secret_key(k)}": in_pod.get(v, v) for k, v in request.secret_env.items()}
        files: dict[str, str] = {}
        items = []
        for i, (path, mount, var) in enumerate(request.secret_files):
            key = f"file.{i}.{_secret_key(path.name)}"   # two secrets may both hold a file named "secret"
            files[key] = base64.b64encode(Path(path).read_bytes()).decode()   # binary-safe (keystores, DER)
            items.append((key, mount, var))
        objects.insert(0, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                           "metadata": {**meta, "name": f"{name}-secrets"}, "stringData": data, "data": files})
        env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": f"{name}-secrets", "key": f"env.{_secret_key(k)}"}}}
                for k in request.secret_env]
        for i, (key, mount, var) in enumerate(items):
            volumes.append({"name": f"secret-file-{i}", "secret": {"secretName": f"{name}-secrets",
                                                                   "items": [{"key": key, "path": Path(mount).name}],
                                                                   "defaultMode": 0o400}})
            mounts.append({"name": f"secret-file-{i}", "mountPath": str(Path(mount).parent), "readOnly": True})
            env.append({"name": var, "value": mount})

    command = ["bash", "-c", spec.command]
    if per_node > 1:
        command = ["torchrun", f"--nnodes={nodes}", "--node-rank=$(NODE_RANK)", f"--nproc-per-node={per_node}",
                   "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", "--no-python", *command]
    prelude = prelude_script(request.prelude, request.node_workdir)
    if prelude:   # once per pod, before torchrun starts the ranks
        command = ["bash", "-c", prelude + 'exec "$@"', "tessera-prelude", *command]
    resources: dict[str, dict[str, Any]] = {}
    if spec.compute.cpus_per_node:
        resources.setdefault("requests", {})["cpu"] = str(spec.compute.cpus_per_node)
    if spec.compute.gpus_per_node:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = str(spec.compute.gpus_per_node)
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": image, "command": command, "env": env, "volumeMounts": mounts,
                        **({"resources": resources} if resources else {})}],
        "volumes": volumes,
        "terminationGracePeriodSeconds": int(spec.scheduling.stop_grace),
    }
    if request.exclude:
        pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                   "values": sorted(request.exclude)}]}]}}}
    if spec.scheduling.priority != "normal":
        pod["priorityClassName"] = f"tessera-{spec.scheduling.priority}"
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,          # the supervisor retries, after classifying the failure
        "completions": nodes, "parallelism": nodes, "completionMode": "Indexed",
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if request.time_limit:
        job_spec["activeDeadlineSeconds"] = int(request.time_limit)
    if nodes == 1:
        objects.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec})
    else:
        objects.append({"apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}", "kind": "JobSet", "metadata": meta,
                        "spec": {"network": {"enableDNSHostnames": True, "subdomain": name},
                                 "failurePolicy": {"maxRestarts": 0},
                                 "replicatedJobs": [{"name": "node", "replicas": 1,
                                                     "template": {"metadata": {"labels": labels},
                                                                  "spec": job_spec}}]}})
    return objects
