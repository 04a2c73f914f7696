"""The Kubernetes backend (experimental: tested against a stub API server, never a real cluster).

One resumption is a Job (one node) or a JobSet (several), with a ConfigMap for its parameters and a
Secret for its secrets: kubernetes_manifests.py builds them; this module creates, watches and deletes
them through the API. Object names are fixed per resumption, so a retried submit replaces the
Secret/ConfigMap an earlier attempt left and adopts its Job/JobSet (HTTP 409).

Not done here (see docs/platform.md): gang admission (needs Kueue or a co-scheduler), hang detection
(the heartbeat path is inside the pod; pointing TESSERA_HEARTBEAT at a URL the supervisor serves is the
way forward), and preemption signals beyond pod eviction reasons.

Config keys: namespace (default "default"), image (default image; a spec's `image` wins), kubeconfig,
context, host (API server URL instead of a kubeconfig), verify_ssl, master_port (default 29500).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tessera.platform.clusters.base import (
    ClusterBackend,
    JobState,
    JobStatus,
    LaunchRequest,
    NodeExit,
    NodeInfo,
)
from tessera.platform.clusters.kubernetes_manifests import (
    INDEX_ANNOTATION,
    JOBSET_GROUP,
    JOBSET_VERSION,
    LABEL_JOB,
    build_manifests,
)
from tessera.platform.errors import ClusterError
from tessera.platform.spec.run_spec import RunSpec

LOG_SYNC_EVERY = 15.0   # seconds between log copies while a job runs (and once at the end)


def _unless_exists(create: Any) -> Any:
    """`create` returning True, or False where it would raise HTTP 409 AlreadyExists."""
    from kubernetes.client.exceptions import ApiException

    def call(*args: Any) -> bool:
        try:
            create(*args)
        except ApiException as exc:
            if exc.status != 409:
                raise
            return False
        return True
    return call


class KubernetesBackend(ClusterBackend):
    type = "kubernetes"

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        super().__init__(name, config)
        try:
            import kubernetes  # noqa: F401
        except ImportError:
            raise ClusterError("the Kubernetes backend needs the `kubernetes` client: pip install "
                               "'tessera[k8s]'") from None
        self._api: Any = None

    @property
    def namespace(self) -> str:
        return self.config.get("namespace") or "default"

    def api_client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config
            if self.config.get("host"):
                configuration = client.Configuration()
                configuration.host = self.config["host"]
                configuration.verify_ssl = bool(self.config.get("verify_ssl", True))
                self._api = client.ApiClient(configuration)
            else:
                try:
                    self._api = config.new_client_from_config(config_file=self.config.get("kubeconfig"),
                                                              context=self.config.get("context"))
                except Exception as exc:   # the client raises ConfigException, OSError, ...
                    raise ClusterError(f"cluster {self.name!r}: cannot load kubeconfig: {exc}") from None
        return self._api

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise ClusterError(f"cluster {self.name!r}: {what} failed: {exc.status} {exc.reason}") from None
        except OSError as exc:
            raise ClusterError(f"cluster {self.name!r}: {what} failed: {exc}") from None

    def check(self, spec: RunSpec) -> None:
        if not (spec.image or self.config.get("image")):
            raise ClusterError(f"cluster {self.name!r} runs containers: set `image:` in the run spec or add the "
                               "cluster with --image")

    def _handle(self, request: LaunchRequest, objects: list[dict[str, Any]]) -> dict[str, Any]:
        job = objects[-1]
        return {"job_id": job["metadata"]["name"], "kind": job["kind"], "namespace": self.namespace,
                "folder": str(request.folder), "nodes": [], "grace": int(request.spec.scheduling.stop_grace),
                "objects": [(o["kind"], o["metadata"]["name"]) for o in objects]}

    def submit(self, request: LaunchRequest) -> dict[str, Any]:
        """Create the Secret, ConfigMap and Job/JobSet. A retry of the same resumption (same names) after
        an attempt that failed or died half-way succeeds: see `_create`. If a create fails, the objects
        this call created are deleted before the error is raised."""
        objects = build_manifests(request, self.config)
        handle = self._handle(request, objects)
        created: list[tuple[str, str]] = []
        try:
            for obj in objects:
                if self._create(obj):
                    created.append((obj["kind"], obj["metadata"]["name"]))
        except ClusterError as exc:
            raise ClusterError(f"{exc}{self._undo(handle, created)}") from None
        return handle

    def _create(self, obj: dict[str, Any]) -> bool:
        """Create `obj`; True if this call created it. One that exists (HTTP 409) was made by an earlier
        attempt at this submission: a Secret or ConfigMap is replaced (its content may differ, e.g. a
        rotated secret), a Job/JobSet is that attempt's job and is kept (never a second one)."""
        from kubernetes import client
        api, ns = self.api_client(), self.namespace
        kind, name = obj["kind"], obj["metadata"]["name"]
        what = f"creating the {kind} {name}"
        if kind == "Job":
            return self._call(what, _unless_exists(client.BatchV1Api(api).create_namespaced_job), ns, obj)
        if kind == "JobSet":
            create = client.CustomObjectsApi(api).create_namespaced_custom_object
            return self._call(what, _unless_exists(create), JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets", obj)
        core = client.CoreV1Api(api)
        create, replace = ((core.create_namespaced_secret, core.replace_namespaced_secret) if kind == "Secret"
                           else (core.create_namespaced_config_map, core.replace_namespaced_config_map))
        if self._call(what, _unless_exists(create), ns, obj):
            return True
        self._call(f"replacing the {kind} {name}", replace, name, ns, obj)
        return False

    def _undo(self, handle: dict[str, Any], created: list[tuple[str, str]]) -> str:
        """Delete what a failed submit created (best effort); a note for its error message. Not if the
        job exists after all (a create can fail, e.g. time out, after the API server applied it): those
        objects are its own, and `find` adopts it."""
        if not created:
            return ""
        try:
            if self._job_conditions(handle) is not None:
                return ""
        except ClusterError:
            return f"; left {', '.join(f'{k} {n}' for k, n in created)} (cannot tell if the job was created)"
        failed = self._delete_objects(handle["namespace"], created)
        return f"; could not delete {', '.join(failed)}" if failed else ""

    def find(self, request: LaunchRequest) -> dict[str, Any] | None:
        """The Job or JobSet of `request`, by its name (one per resumption), if it was created."""
        handle = self._handle(request, build_manifests(request, self.config))
        return handle if self._job_conditions(handle) is not None else None

    def _pods(self, handle: dict[str, Any]) -> list[Any]:
        from kubernetes import client
        core = client.CoreV1Api(self.api_client())
        pods = self._call("listing pods", core.list_namespaced_pod, handle["namespace"],
                          label_selector=f"{LABEL_JOB}={handle['job_id']}")
        return list(pods.items or [])

    def _job_conditions(self, handle: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Conditions of the Job/JobSet ([{type, status, reason}]), or None if it is gone."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException
        api = self.api_client()
        try:
            if handle["kind"] == "Job":
                job = client.BatchV1Api(api).read_namespaced_job_status(handle["job_id"], handle["namespace"])
                conditions = job.status.conditions if job.status else None
                return [{"type": c.type, "status": c.status, "reason": c.reason or ""} for c in conditions or []]
            body = client.CustomObjectsApi(api).get_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, handle["namespace"], "jobsets", handle["job_id"])
            return [{"type": c.get("type"), "status": c.get("status"), "reason": c.get("reason") or ""}
                    for c in (body.get("status") or {}).get("conditions") or []]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ClusterError(f"cluster {self.name!r}: reading {handle['job_id']} failed: {exc.status} "
                               f"{exc.reason}") from None

    def status(self, handle: dict[str, Any]) -> JobStatus:
        conditions = self._job_conditions(handle)
        if conditions is None:
            state = JobState.CANCELLED if handle.get("cancelled") else JobState.LOST
            return JobStatus(state, nodes=handle.get("nodes") or [], reason="the job object is gone")
        pods = self._pods(handle)
        exits, nodes, phases, reasons = [], {}, [], []
        for pod in pods:
            rank = int((pod.metadata.annotations or {}).get(INDEX_ANNOTATION, 0))
            node = (pod.spec.node_name or "") if pod.spec else ""
            nodes[rank] = node
            phases.append(pod.status.phase if pod.status else "Pending")
            reasons.append((pod.status.reason or "") if pod.status else "")
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                term = cs.state.terminated if cs.state else None
                if term is not None:
                    exits.append(NodeExit(rank, node, int(term.exit_code),
                                          int(term.signal) if term.signal else None))
                    reasons.append(term.reason or "")
        handle["nodes"] = [nodes[r] for r in sorted(nodes)]
        done = {c["type"]: c for c in conditions if c["status"] == "True"}
        started = [p for p in phases if p != "Pending"]
        state = JobState.RUNNING if started else JobState.QUEUED    # pods done but no condition yet: running
        if "Complete" in done or "Completed" in done:
            state = JobState.COMPLETED
        elif "Failed" in done:
            reason = done["Failed"]["reason"]
            state = JobState.TIMEOUT if reason == "DeadlineExceeded" else JobState.FAILED
            if "OOMKilled" in reasons:
                state = JobState.OUT_OF_MEMORY
            elif any(r in ("Evicted", "Preempting", "PreemptionByScheduler") for r in reasons):
                state = JobState.PREEMPTED
            elif any(r in ("NodeLost", "NodeShutdown", "Terminated") for r in reasons):
                state = JobState.NODE_FAIL
        failed = [e.exit_code for e in exits if e.exit_code != 0]
        exit_code = (failed[0] if failed else 0) if state.done and exits else None
        if state.done or state.value != handle.get("last_state") or \
                time.time() - handle.get("logs_synced", 0) > LOG_SYNC_EVERY:
            self._sync_logs(handle, pods)
        handle["last_state"] = state.value
        return JobStatus(state, exit_code, handle["nodes"], reason=done.get("Failed", {}).get("reason", ""),
                         node_exits=sorted(exits, key=lambda e: e.rank))

    def _sync_logs(self, handle: dict[str, Any], pods: list[Any]) -> None:
        """Copy each pod's log to node-R.log in the resumption folder (where `run logs` reads)."""
        from kubernetes import client
        core = client.CoreV1Api(self.api_client())
        folder = Path(handle["folder"])
        for pod in pods:
            rank = int((pod.metadata.annotations or {}).get(INDEX_ANNOTATION, 0))
            try:
                # raw bytes: the client's own decoding of text/plain answers yields "b'...'" strings
                response = core.read_namespaced_pod_log(pod.metadata.name, handle["namespace"], container="main",
                                                        _preload_content=False)
                data = response.data
            except Exception:   # a pod not started yet has no log; the next sync gets it
                continue
            (folder / f"node-{rank}.log").write_bytes(data or b"")
        handle["logs_synced"] = time.time()

    def _delete(self, handle: dict[str, Any], grace: int) -> None:
        from kubernetes import client
        api = self.api_client()
        body = client.V1DeleteOptions(grace_period_seconds=grace, propagation_policy="Background")
        if handle["kind"] == "Job":
            self._call("deleting the Job", client.BatchV1Api(api).delete_namespaced_job, handle["job_id"],
                       handle["namespace"], body=body)
        else:
            self._call("deleting the JobSet", client.CustomObjectsApi(api).delete_namespaced_custom_object,
                       JOBSET_GROUP, JOBSET_VERSION, handle["namespace"], "jobsets", handle["job_id"], body=body)

    def terminate(self, handle: dict[str, Any]) -> None:
        """Delete the job with the run's grace period: the kubelet sends SIGTERM, then SIGKILL."""
        try:
            self._sync_logs(handle, self._pods(handle))
        except ClusterError:
            pass
        self._delete(handle, int(handle.get("grace", 30)))

    def kill(self, handle: dict[str, Any]) -> None:
        try:
            self._delete(handle, 0)
        except ClusterError:
            pass

    def cleanup(self, handle: dict[str, Any]) -> None:
        self._delete_objects(handle["namespace"], handle.get("objects", []))

    def _delete_objects(self, namespace: str, objects: list[tuple[str, str]]) -> list[str]:
        """Delete the Secrets and ConfigMaps among `objects`; those that could not be deleted."""
        from kubernetes import client
        core = client.CoreV1Api(self.api_client())
        calls = {"Secret": core.delete_namespaced_secret, "ConfigMap": core.delete_namespaced_config_map}
        failed = []
        for kind, name in objects:
            if kind in calls:
                try:
                    self._call(f"deleting the {kind} {name}", calls[kind], name, namespace)
                except ClusterError:
                    failed.append(f"{kind} {name}")
        return failed

    def nodes(self) -> list[NodeInfo]:
        from kubernetes import client
        items = self._call("listing nodes", client.CoreV1Api(self.api_client()).list_node).items or []
        out = []
        for node in items:
            conditions = {c.type: c for c in (node.status.conditions or [])} if node.status else {}
            ready = conditions.get("Ready")
            unschedulable = bool(node.spec and node.spec.unschedulable)
            healthy = bool(ready and ready.status == "True") and not unschedulable
            state = ("ready" if ready and ready.status == "True" else "not-ready") + \
                ("+cordoned" if unschedulable else "")
            allocatable = (node.status.allocatable or {}) if node.status else {}
            labels = node.metadata.labels or {}
            out.append(NodeInfo(node.metadata.name, state, healthy, (ready.message or "") if ready else "",
                                gpus=int(allocatable.get("nvidia.com/gpu", 0) or 0),
                                gpu_type=labels.get("nvidia.com/gpu.product")))
        return out
