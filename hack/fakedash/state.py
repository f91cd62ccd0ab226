"""What the stand-in dashboard remembers: per (namespace, RayCluster) Ray jobs and Serve config, the
real backends, the submitter runs and the requests seen. Every access holds `State.lock`."""

from __future__ import annotations

import re
import threading
import time

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
VALID = {"PENDING", "RUNNING"} | TERMINAL
EXIT_ANNOTATION = "tputorch.local/fake-exit-code"
# KubeRay names a RayJob's submission id and a RayJob's/RayService's RayCluster `<name>-<5 chars>`.
_SUFFIX = re.compile(r"^(?P<name>.+)-[a-z0-9]{5}$")


def now_ms() -> int:
    return int(time.time() * 1000)


def owner_name(generated: str) -> str:
    """The RayJob/RayService name inside a KubeRay-generated name (`<name>-<5 chars>`)."""
    m = _SUFFIX.match(generated)
    return m.group("name") if m else generated


def parse_host(host: str) -> tuple[str, str]:
    """(namespace, raycluster) of a head service host `<cluster>-head-svc.<ns>.svc...[:port]`."""
    hostname = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    labels = hostname.split(".")
    ns = labels[1] if len(labels) >= 3 and labels[2] == "svc" else "default"
    return ns, labels[0].removesuffix("-head-svc")


class State:
    def __init__(self, serve_ready_after: float = 2.0) -> None:
        self.lock = threading.Lock()
        self.clusters: dict[tuple[str, str], dict] = {}
        self.presets: dict[tuple[str, str], dict] = {}   # (ns, rayjob) -> status for its first job
        self.requests: list[dict] = []
        self.default_status = "RUNNING"
        self.serve_ready_after = serve_ready_after
        self.backends: dict[tuple[str, str], str] = {}    # (ns, cluster or "") -> real dashboard URL
        # (ns, cluster or "") -> {"url": the real head's Serve HTTP proxy, "variant": "cpu" or None}
        self.serve_backends: dict[tuple[str, str], dict] = {}
        # (ns, cluster or "") -> the readiness probe's period (s) the prober uses instead of the pod's
        self.probe_periods: dict[tuple[str, str], float] = {}
        self.backend_tokens: dict[str, str] = {}           # real dashboard URL -> its head's auth token
        self.runs: dict[tuple[str, str], dict] = {}       # (ns, pod) -> submitter run
        self.seq = 0
        # Whether a prober reads the pods (a stand-in with an API server): only then is a cluster's
        # "hosts_up" known; without one every cluster's hosts count as up.
        self.hosts_watched = False

    def cluster(self, ns: str, name: str) -> dict:
        c = self.clusters.get((ns, name))
        if c is None:
            self.seq += 1
            c = self.clusters[(ns, name)] = {"namespace": ns, "name": name, "jobs": {}, "serve": None,
                                              "seq": self.seq}
        return c

    def backend(self, ns: str, cluster: str) -> str | None:
        return self.backends.get((ns, cluster)) or self.backends.get((ns, ""))

    def probe_period(self, ns: str, cluster: str) -> float | None:
        if (ns, cluster) in self.backends:
            return self.probe_periods.get((ns, cluster))
        return self.probe_periods.get((ns, ""))

    def serve_backend(self, ns: str, cluster: str) -> dict | None:
        if (ns, cluster) in self.backends:
            return self.serve_backends.get((ns, cluster))
        return self.serve_backends.get((ns, ""))

    def get_or_create(self, ns: str, cluster: str, submission_id: str, created_by: str) -> dict:
        jobs = self.cluster(ns, cluster)["jobs"]
        job = jobs.get(submission_id)
        if job is None:
            self.seq += 1
            rayjob = owner_name(submission_id)
            job = jobs[submission_id] = {
                "namespace": ns, "cluster": cluster, "rayjob": rayjob, "submission_id": submission_id,
                "status": self.default_status, "message": "", "entrypoint": "", "metadata": {},
                "runtime_env": {}, "submitted": False, "created_by": created_by, "seq": self.seq,
                "start_time": now_ms(), "end_time": 0, "submitter_exit_code": 0,
                "signalled_pods": [], "stop_requested": False,
            }
            preset = self.presets.pop((ns, rayjob), None)
            if preset:
                apply_status(job, preset)
            elif job["status"] in TERMINAL:
                job["end_time"] = now_ms()
        return job

    def jobs(self):
        return [j for c in self.clusters.values() for j in c["jobs"].values()]

    def newest_job(self, ns: str, rayjob: str) -> dict | None:
        mine = [j for j in self.jobs() if j["namespace"] == ns and j["rayjob"] == rayjob]
        return max(mine, key=lambda j: j["seq"]) if mine else None

    def serve_cluster(self, ns: str, name: str) -> dict | None:
        """RayCluster `name`, else the newest RayCluster of RayService `name`, with Serve state."""
        c = self.clusters.get((ns, name))
        if c is not None and c["serve"] is not None:
            return c
        mine = [c for c in self.clusters.values()
                if c["namespace"] == ns and owner_name(c["name"]) == name and c["serve"] is not None]
        return max(mine, key=lambda c: c["seq"]) if mine else None


def apply_status(job: dict, body: dict) -> None:
    st = body["status"]
    job["status"] = st
    job["message"] = body.get("message", "")
    job["submitter_exit_code"] = int(body.get("submitter_exit_code", 0))
    if body.get("error_type"):
        job["error_type"] = body["error_type"]
    job["end_time"] = now_ms() if st in TERMINAL else 0
    job["submitter_finished"] = False
