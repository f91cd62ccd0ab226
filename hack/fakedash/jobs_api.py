"""Ray's Jobs API (`/api/jobs/...`) as the stand-in answers it for one RayCluster. Called with the
state lock held; returns (HTTP status, JSON body), the body's `_rayjob` naming the RayJob for the
request log."""

from __future__ import annotations

import hashlib

from .state import TERMINAL, State, now_ms, owner_name


def driver_node_id(ns: str, cluster: str) -> str:
    """The head node's id in Ray's form (56 hex digits), one per RayCluster: where drivers run."""
    return hashlib.sha256(f"{ns}/{cluster}".encode()).hexdigest()[:56]


def job_info(job: dict) -> dict:
    sid = job["submission_id"]
    info = {
        "type": "SUBMISSION", "job_id": sid, "submission_id": sid, "status": job["status"],
        "message": job["message"] or f"Job is {job['status'].lower()} (fake dashboard).",
        "entrypoint": job["entrypoint"], "metadata": job["metadata"], "runtime_env": job["runtime_env"],
        "start_time": job["start_time"], "end_time": job["end_time"] or 0,
    }
    if job["status"] != "PENDING":  # the driver has started, on the head
        info["driver_node_id"] = driver_node_id(job["namespace"], job["cluster"])
    if job["status"] == "FAILED":
        info["error_type"] = job.get("error_type") or "JOB_ENTRYPOINT_COMMAND_ERROR"
    return info


def handle(state: State, method: str, rest: list[str], path: str, ns: str, cluster: str, body):
    """`rest`: the path's parts after `api/jobs`."""
    c = state.cluster(ns, cluster)
    if not rest:
        if method == "GET":
            return 200, [job_info(j) for _, j in sorted(c["jobs"].items())]
        if method == "POST":
            sid = (body or {}).get("submission_id") or f"raysubmit_{now_ms()}"
            job = c["jobs"].get(sid)
            if job is not None and job["submitted"]:
                return 500, {"_rayjob": job["rayjob"], "error": f"Job with submission_id {sid} already exists. "
                                                                 "Please use a different submission_id."}
            job = state.get_or_create(ns, cluster, sid, "submit")
            job.update(submitted=True, entrypoint=(body or {}).get("entrypoint", ""),
                       metadata=(body or {}).get("metadata") or {},
                       runtime_env=(body or {}).get("runtime_env") or {})
            return 200, {"_rayjob": job["rayjob"], "job_id": sid, "submission_id": sid}
        return 405, {"error": f"{method} not allowed"}
    sid, tail = rest[0], rest[1:]
    name = owner_name(sid)
    if method == "GET" and not tail:
        return 200, dict(job_info(state.get_or_create(ns, cluster, sid, "get")), _rayjob=name)
    job = c["jobs"].get(sid)
    if method == "GET" and tail == ["logs"]:
        if job is None:
            return 404, {"_rayjob": name, "error": "no such job"}
        return 200, {"_rayjob": name, "logs": f"fake logs of {sid}: {job['status']}\n"}
    if method == "POST" and tail == ["stop"]:
        if job is None:
            return 404, {"_rayjob": name, "error": "no such job"}
        job["stop_requested"] = True
        if job["status"] in TERMINAL:
            return 200, {"_rayjob": name, "stopped": False}
        job.update(status="STOPPED", message="Job was stopped (fake dashboard).", end_time=now_ms())
        return 200, {"_rayjob": name, "stopped": True}
    if method == "DELETE" and not tail:
        return 200, {"_rayjob": name, "deleted": c["jobs"].pop(sid, None) is not None}
    return 404, {"_rayjob": name, "error": f"{method} {path} not served by the fake dashboard"}
