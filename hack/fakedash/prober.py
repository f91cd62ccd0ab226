"""The readiness prober the stand-in cluster lacks: KWOK marks every pod Ready, GKE's kubelet runs
the readiness probe KubeRay wrote. KubeRay 1.5 gives a RayService's worker pods a probe that also
asks the Serve proxy (`wget ... localhost:8000/-/healthz`), and Serve runs a proxy only on nodes
that host a Serve replica: a TPU host that runs only vLLM workers stays NotReady while the model
serves. This thread applies that rule to stand-in clusters (no real Ray backend): a worker pod whose
probe includes the proxy check is Ready only while its RayCluster's Serve applications run and the
pod is the host the LLM replica is taken to run on (the first host, by name, of each slice replica),
and NotReady otherwise, by patching the pod's status as kubelet would."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.parse

from . import serve_api
from .kube import Kube
from .state import State

SERVE_PROXY_PATH = "/-/healthz"
WORKER_SELECTOR = "ray.io/node-type=worker"
CLUSTER_LABEL = "ray.io/cluster"
REPLICA_LABEL = "ray.io/worker-group-replica-name"


def probes_serve_proxy(pod: dict) -> bool:
    """Whether a container's readiness probe (as KubeRay wrote it) asks the Serve proxy."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        command = (((c.get("readinessProbe") or {}).get("exec") or {}).get("command")) or []
        if any(SERVE_PROXY_PATH.lstrip("/") in part for part in command):
            return True
    return False


def replica_hosts(pods: list[dict]) -> set[str]:
    """The pods taken to host the LLM replica: the first (by name) of each slice replica, or of
    the whole cluster when KubeRay's replica label is absent."""
    groups: dict[tuple[str, str], list[str]] = {}
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        groups.setdefault((labels.get(CLUSTER_LABEL, ""), labels.get(REPLICA_LABEL, "")), []).append(p["metadata"]["name"])
    return {min(names) for names in groups.values()}


def ready_of(pod: dict) -> bool | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return None


def _cluster_key(pod: dict) -> tuple[str, str]:
    return pod["metadata"]["namespace"], (pod["metadata"].get("labels") or {}).get(CLUSTER_LABEL, "")


def desired_readiness(pods: list[dict], serving: dict[tuple[str, str], bool],
                      real: set[tuple[str, str]] = frozenset()) -> dict[tuple[str, str], bool]:
    """(namespace, pod) -> Ready, for the running worker pods whose probe asks the Serve proxy.
    `serving`: (namespace, RayCluster) -> whether its Serve applications run; `real`: RayClusters
    with a real Ray backend, left alone."""
    probed = [p for p in pods if probes_serve_proxy(p) and (p.get("status") or {}).get("phase") == "Running"
              and not p["metadata"].get("deletionTimestamp") and _cluster_key(p) not in real]
    hosts = replica_hosts(probed)
    out = {}
    for p in probed:
        ns = p["metadata"]["namespace"]
        cluster = (p["metadata"].get("labels") or {}).get(CLUSTER_LABEL, "")
        out[(ns, p["metadata"]["name"])] = serving.get((ns, cluster), False) and p["metadata"]["name"] in hosts
    return out


def status_patch(ready: bool, now: str) -> dict:
    """A strategic merge patch of the pod's status (conditions merge by type), as kubelet writes it."""
    status = "True" if ready else "False"
    extra = {} if ready else {"reason": "ContainersNotReady", "message": "containers with unready status: [ray-worker]"}
    return {"status": {"conditions": [{"type": t, "status": status, "lastTransitionTime": now, **extra}
                                      for t in ("ContainersReady", "Ready")]}}


class Prober(threading.Thread):
    def __init__(self, state: State, kube: Kube, log, interval: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log, self.interval = state, kube, log, interval

    def run(self) -> None:
        while True:
            time.sleep(self.interval)
            try:
                self.tick()
            except Exception as exc:  # keep going; the API server may be restarting
                self.log(f"prober: {exc!r}")

    def tick(self) -> None:
        sel = urllib.parse.quote(WORKER_SELECTOR)
        pods = self.kube.call("GET", f"/api/v1/pods?labelSelector={sel}")["items"]
        now = time.time()
        with self.state.lock:
            serving = {key: serve_api.serve_running(c["serve"], self.state.serve_ready_after, now)
                       for key, c in self.state.clusters.items()}
            real = {_cluster_key(p) for p in pods if self.state.backend(*_cluster_key(p)) is not None}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        by_key = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        for key, ready in desired_readiness(pods, serving, real).items():
            if ready_of(by_key[key]) == ready:
                continue
            try:
                self.kube.call("PATCH", f"/api/v1/namespaces/{key[0]}/pods/{key[1]}/status", status_patch(ready, stamp),
                               "application/strategic-merge-patch+json")
                self.log(f"prober: pod {key[0]}/{key[1]} Ready={ready} (Serve proxy {'up' if ready else 'absent'})")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:
                    raise
