"""Just enough of a Kubernetes client (bearer token over TLS) for pods and RayClusters, and the
reads of a pod's or RayCluster's env the other parts need."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.request

from .state import EXIT_ANNOTATION


class Kube:
    def __init__(self, server: str, token: str, ca: str) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca)
        # Never proxy the API server, whatever the environment says.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPSHandler(context=self.ctx))

    def call(self, method: str, path: str, body: dict | None = None, ctype: str = "application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", ctype)
        with self.opener.open(req, timeout=10) as resp:
            return json.loads(resp.read() or b"{}")

    def get(self, path: str):
        """The object, or None on 404."""
        try:
            return self.call("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def annotate_pod(self, ns: str, pod: str, code: int | str) -> None:
        self.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}",
                  {"metadata": {"annotations": {EXIT_ANNOTATION: str(code)}}}, "application/merge-patch+json")

    def raycluster(self, ns: str, name: str):
        return self.get(f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}")


class Poller(threading.Thread):
    """A daemon thread that calls tick() every `interval` seconds; an error is logged under `what`
    and the loop goes on (the API server may be restarting)."""

    what = "poller"

    def __init__(self, kube: Kube, log, interval: float) -> None:
        super().__init__(daemon=True)
        self.kube, self.log, self.interval = kube, log, interval

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.tick()
            except Exception as exc:
                self.log(f"{self.what}: {exc!r}")

    def tick(self) -> None:
        raise NotImplementedError


def plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}


def container_env(kube: Kube, ns: str, container: dict) -> dict[str, str] | None:
    """A container's env as kubelet resolves it: plain values and `secretKeyRef`s (KubeRay's
    RAY_AUTH_TOKEN); None when a non-optional Secret or key is missing (kubelet would not start
    it: CreateContainerConfigError, kubelet.py), an optional one is left out."""
    env = plain_env(container)
    for e in container.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            data = (kube.get(f"/api/v1/namespaces/{ns}/secrets/{ref['name']}") or {}).get("data") or {}
            if ref.get("key") in data:
                env[e["name"]] = base64.b64decode(data[ref["key"]]).decode()
            elif not ref.get("optional"):
                return None
    return env


def head_env(raycluster: dict | None) -> dict[str, str]:
    if not raycluster:
        return {}
    containers = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    return plain_env(containers[0])


def submission_id_of(pod: dict) -> str | None:
    containers = pod.get("spec", {}).get("containers") or [{}]
    return plain_env(containers[0]).get("RAY_JOB_SUBMISSION_ID")
