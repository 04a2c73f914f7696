"""A stub of the few Kubernetes API endpoints the backend calls (no API server can run here). It stores
what is created (409 on a duplicate, PUT replaces), serves pods and conditions the test sets, fails the
requests a test asks it to (`fail_next`), and records every request."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_ROUTES = [
    (r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps)(?:/([^/]+))?$", "core"),
    (r"^/apis/batch/v1/namespaces/([^/]+)/(jobs)(?:/([^/]+?))?(?:/status)?$", "jobs"),
    (r"^/apis/jobset.x-k8s.io/v1alpha2/namespaces/([^/]+)/(jobsets)(?:/([^/]+))?$", "jobsets"),
    (r"^/api/v1/namespaces/([^/]+)/(pods)(?:/([^/]+))?(/log)?$", "pods"),
    (r"^/api/v1/(nodes)$", "nodes"),
]


class KubeStub:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}    # (namespace, plural, name) -> body
        self.pods: dict[str, list[dict[str, Any]]] = {}                 # job name -> pods
        self.logs: dict[str, str] = {}                                  # pod name -> log text
        self.conditions: dict[str, list[dict[str, Any]]] = {}           # job name -> conditions
        self.nodes: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.faults: dict[tuple[str, str], list[int]] = {}              # (method, plural) -> next codes
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, text: bool = False) -> None:
                data = body.encode() if text else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                stub.requests.append((method, self.path, body))
                for pattern, kind in _ROUTES:
                    m = re.match(pattern, url.path)
                    if m:
                        return self._send(*stub.route(method, kind, m.groups(), body, parse_qs(url.query)))
                self._send(404, {"kind": "Status", "code": 404, "message": f"no route {url.path}"})

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _status(self, code: int, message: str) -> tuple[int, Any]:
        return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": message}

    def route(self, method: str, kind: str, groups: tuple, body: Any, query: dict) -> tuple:
        if kind == "nodes":
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": self.nodes}
        ns, plural, name = groups[0], groups[1], groups[2]
        if self.faults.get((method, plural)):
            return self._status(self.faults[(method, plural)].pop(0), f"injected failure of {method} {plural}")
        if kind == "pods":
            if groups[3]:
                return 200, self.logs.get(name, ""), True
            selector = query.get("labelSelector", [""])[0]
            job = selector.split("=", 1)[1] if "=" in selector else ""
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self.pods.get(job, [])}
        key = (ns, plural, name)
        if method == "POST":
            name = body["metadata"]["name"]
            if (ns, plural, name) in self.objects:
                return self._status(409, f"{plural} {name} already exists")
            self.objects[(ns, plural, name)] = body
            return 201, body
        if method == "PUT":
            if key not in self.objects:
                return self._status(404, f"{plural} {name} not found")
            self.objects[key] = body
            return 200, body
        if method == "DELETE":
            if self.objects.pop(key, None) is None:
                return self._status(404, f"{plural} {name} not found")
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        obj = self.objects.get(key)
        if obj is None:
            return self._status(404, f"{plural} {name} not found")
        return 200, {**obj, "status": {"conditions": self.conditions.get(name, [])}}

    # --- helpers for tests ------------------------------------------------------------------------

    def fail_next(self, method: str, plural: str, code: int = 500) -> None:
        """Answer the next `method` request on `plural` (e.g. "POST", "jobs") with HTTP `code`, storing nothing."""
        self.faults.setdefault((method, plural), []).append(code)

    def stored(self, plural: str) -> list[str]:
        return sorted(name for _, p, name in self.objects if p == plural)

    def set_pod(self, job: str, rank: int, phase: str, node: str = "node-a", exit_code: int | None = None,
                reason: str | None = None) -> None:
        pods = [p for p in self.pods.get(job, []) if p["metadata"]["name"] != f"{job}-{rank}"]
        status: dict[str, Any] = {"phase": phase}
        if exit_code is not None:
            status["containerStatuses"] = [{"name": "main", "image": "x", "imageID": "", "ready": False,
                                            "restartCount": 0,
                                            "state": {"terminated": {"exitCode": exit_code,
                                                                     "reason": reason or ""}}}]
        pods.append({"metadata": {"name": f"{job}-{rank}", "annotations": {
            "batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": status})
        self.pods[job] = sorted(pods, key=lambda p: p["metadata"]["name"])
