"""Real Ray backends: one dashboard call forwarded unchanged to a real Ray dashboard on 127.0.0.1
(a job submission gets the RayCluster's head container env first), and the Reaper that stops the
unfinished Ray jobs of a RayCluster that is gone. The websocket splice is in server.py (it works on
the handler's connection)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from .kube import Kube
from .state import TERMINAL, State

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def with_driver_env(body: dict, env: dict[str, str]) -> dict:
    """A job submission whose runtime_env carries `env` under the submitter's own env_vars."""
    runtime_env = dict(body.get("runtime_env") or {})
    runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
    return {**body, "runtime_env": runtime_env} if runtime_env["env_vars"] else body



def forward(backend: str, method: str, path: str, query: str, body: bytes | None, headers: dict, *,
            timeout: float = 30, token: str | None = None):
    """Send one dashboard call to a real Ray dashboard: (status, content type, body bytes). The
    caller's credential was for its RayCluster; the real head gets its own `token`."""
    url = backend.rstrip("/") + path + (f"?{query}" if query else "")
    req = urllib.request.Request(url, data=body, method=method)
    for k in ("Content-Type", "Accept"):
        if headers.get(k):
            req.add_header(k, headers[k])
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with _no_proxy.open(req, timeout=timeout) as resp:
            return resp.status, resp.headers.get("Content-Type", "application/json"), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", "application/json"), exc.read()
    except OSError as exc:
        return 502, "application/json", json.dumps({"error": f"real Ray dashboard {backend}: {exc}"}).encode()



class Reaper(threading.Thread):
    """Stops the unfinished Ray jobs of a real backend whose RayCluster is gone: a real Ray cluster
    dies with its head pod (KubeRay suspends a RayJob by deleting its RayCluster, without a stop)."""

    def __init__(self, state: State, kube: Kube, log) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log = state, kube, log

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            with self.state.lock:
                todo = [(c["namespace"], c["name"], sid, self.state.backend(c["namespace"], c["name"]),
                         self.state.backend_tokens.get(self.state.backend(c["namespace"], c["name"]) or ""))
                        for c in self.state.clusters.values() for sid, j in c["jobs"].items()
                        if j.get("real") and not j.get("reaped") and j["status"] not in TERMINAL]
            for ns, cluster, sid, backend, token in todo:
                try:
                    if backend is None or self.kube.raycluster(ns, cluster) is not None:
                        continue
                    code, _, body = forward(backend, "POST", f"/api/jobs/{sid}/stop", "", b"", {}, token=token)
                    self.log(f"reaper: RayCluster {ns}/{cluster} is gone: stop {sid} -> {code} {body[:200]!r}")
                    if code in (200, 404):
                        with self.state.lock:
                            self.state.clusters[(ns, cluster)]["jobs"][sid]["reaped"] = True
                except Exception as exc:
                    self.log(f"reaper: {ns}/{cluster}/{sid}: {exc!r}")
