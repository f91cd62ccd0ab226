"""Observed RayJob (+ its pods) -> TPUTorchJob status, and the events a status change deserves.

Pure functions: the handlers feed them what the watches saw and patch what comes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .spec import FieldError, JobSpec

# Condition types, in the order they are written.
VALIDATED = "Validated"
RAYJOB_CREATED = "RayJobCreated"
SLICE_READY = "SliceReady"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CONDITION_TYPES = (VALIDATED, RAYJOB_CREATED, SLICE_READY, SUCCEEDED, FAILED)

TERMINAL_PHASES = ("Succeeded", "Failed")
ROLE_LABEL = "ray.io/node-type"  # KubeRay labels each pod head or worker

# Every status field this module writes (the CRD declares each one).
STATUS_FIELDS = (
    "phase", "message", "observedGeneration", "conditions", "workers", "hosts", "readyHosts",
    "hostsReady", "rayJobName", "rayClusterName", "dashboardURL", "jobId", "jobStatus",
    "jobDeploymentStatus", "startTime", "completionTime",
)

# Condition states that are bad news: their events are Warnings.
_WARNING_STATES = {
    (VALIDATED, "False"),
    (FAILED, "True"),
    (RAYJOB_CREATED, "False"),
}
_WARNING_REASONS = {"Unschedulable"}
# Reasons that only describe waiting; they change often and get no event of their own.
# "Valid" is every job's first state: an event per job for it would only add a write to each create.
_QUIET_REASONS = {"Valid", "Creating", "WaitingForHosts"}


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase
    message: str


def _condition(ctype: str, status: bool | None, reason: str, message: str, generation: int) -> dict:
    return {
        "type": ctype,
        "status": {True: "True", False: "False", None: "Unknown"}[status],
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _stamp(conditions: Iterable[dict], previous: dict, now: str) -> list[dict]:
    """lastTransitionTime moves only when a condition's status flips."""
    before = {c.get("type"): c for c in previous.get("conditions") or [] if isinstance(c, dict)}
    stamped = []
    for cond in conditions:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime")
        stamped.append({**cond, "lastTransitionTime": old["lastTransitionTime"] if same else now})
    return stamped


def invalid(errors: list[FieldError], generation: int, previous: dict, now: str) -> dict:
    message = "invalid spec: " + "; ".join(str(e) for e in errors)
    return {
        "phase": "Failed",
        "message": message,
        "observedGeneration": generation,
        "conditions": _stamp(
            [
                _condition(VALIDATED, False, "ValidationFailed", message, generation),
                _condition(FAILED, True, "ValidationFailed", message, generation),
            ],
            previous,
            now,
        ),
    }


def _pod_name(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def _pod_condition(pod: dict, ctype: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


def scheduling_problem(pods: Iterable[dict]) -> str | None:
    """The scheduler's message for the first unschedulable pod of the job, if any."""
    for pod in sorted(pods, key=_pod_name):
        cond = _pod_condition(pod, "PodScheduled")
        if cond.get("status") == "False":
            return f"pod {_pod_name(pod)}: {cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip()
    return None


def ready_hosts(pods: Iterable[dict], cluster_status: dict) -> int:
    """TPU host pods that are Ready. The pods are fresher than the RayJob's copy of the
    RayCluster's status, which is only the fallback once the pods are gone (job finished)."""
    workers = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL) == "worker"]
    if workers:
        return sum(1 for p in workers if _pod_condition(p, "Ready").get("status") == "True")
    return int(cluster_status.get("readyWorkerReplicas") or 0)


def _phase(deployment: str, job_status: str) -> str:
    if deployment == "Complete":
        return "Succeeded" if job_status == "SUCCEEDED" else "Failed"
    if deployment in ("Failed", "ValidationFailed"):
        return "Failed"
    if deployment in ("Suspended", "Suspending"):
        return "Suspended"
    if deployment == "Running":
        return "Running"
    return "Pending"


def derive(
    job: JobSpec,
    generation: int,
    rayjob: dict | None,
    pods: Iterable[dict],
    previous: dict,
    now: str,
    create_error: tuple[str, str] | None = None,
) -> dict:
    """The whole status of a valid TPUTorchJob from what is observed now.

    ``create_error`` is (reason, message) when the RayJob could not be created (e.g. KubeRay's
    CRDs are missing); ``pods`` are the job's pods (metadata.name, metadata.labels, status.conditions
    as the API returns them).
    """
    s = job.slice
    shape = (
        f"{s.generation.name} {s.topology} slice: {s.hosts} host(s) x {s.chips_per_host} chips, "
        f"{job.workers} worker(s) x {job.chips_per_worker} chip(s)"
    )
    rj_status = (rayjob or {}).get("status") or {}
    cluster_status = rj_status.get("rayClusterStatus") or {}
    deployment = rj_status.get("jobDeploymentStatus") or ""
    job_status = rj_status.get("jobStatus") or ""
    phase = _phase(deployment, job_status) if rayjob is not None else "Pending"
    pods = list(pods)
    ready = ready_hosts(pods, cluster_status)
    kuberay_message = rj_status.get("message") or rj_status.get("reason") or ""

    conditions = [_condition(VALIDATED, True, "Valid", shape, generation)]
    if rayjob is not None:
        conditions.append(_condition(RAYJOB_CREATED, True, "Created", f"RayJob {job.name} exists", generation))
    elif create_error is not None:
        conditions.append(_condition(RAYJOB_CREATED, False, create_error[0], create_error[1], generation))
    else:
        conditions.append(_condition(RAYJOB_CREATED, False, "Creating", "creating the RayJob", generation))

    problem = scheduling_problem(pods)
    if phase in TERMINAL_PHASES:
        slice_ready = _condition(SLICE_READY, False, "JobFinished", "the job has finished", generation)
    elif phase == "Suspended":
        slice_ready = _condition(SLICE_READY, False, "Suspended", "the job is suspended", generation)
    elif rayjob is not None and ready >= s.hosts:
        slice_ready = _condition(SLICE_READY, True, "AllHostsReady", f"{ready}/{s.hosts} TPU hosts ready", generation)
    elif problem:
        slice_ready = _condition(SLICE_READY, False, "Unschedulable", problem, generation)
    else:
        slice_ready = _condition(SLICE_READY, False, "WaitingForHosts", f"{ready}/{s.hosts} TPU hosts ready", generation)
    conditions.append(slice_ready)

    if phase == "Succeeded":
        conditions.append(_condition(SUCCEEDED, True, "JobSucceeded", kuberay_message or "the Ray job succeeded", generation))
    if phase == "Failed":
        reason = rj_status.get("reason") or "JobFailed"
        conditions.append(_condition(FAILED, True, reason, kuberay_message or f"the Ray job ended {job_status or 'in failure'}", generation))

    if phase == "Running":
        message = f"{job.workers} worker(s) on a {shape.split(':')[0]}, {ready}/{s.hosts} hosts ready"
    elif phase in TERMINAL_PHASES:
        message = conditions[-1]["message"]
    elif phase == "Suspended":
        message = "suspended: the RayJob holds no slice"
    elif rayjob is None:
        message = conditions[1]["message"]
    else:
        message = slice_ready["message"]

    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": generation,
        "conditions": _stamp(conditions, previous, now),
        "workers": job.workers,
        "hosts": s.hosts,
        "readyHosts": ready,
        "hostsReady": f"{ready}/{s.hosts}",
        "rayJobName": job.name,
    }
    optional = {
        "rayClusterName": rj_status.get("rayClusterName"),
        "dashboardURL": rj_status.get("dashboardURL"),
        "jobId": rj_status.get("jobId"),
        "jobStatus": job_status or None,
        "jobDeploymentStatus": deployment or None,
        "startTime": rj_status.get("startTime"),
        "completionTime": (rj_status.get("endTime") or previous.get("completionTime") or now) if phase in TERMINAL_PHASES else None,
    }
    status.update({k: v for k, v in optional.items() if v})
    return status


def finished(status: dict) -> bool:
    """The Ray job ran to an end (not merely a spec that failed validation): never run it again."""
    return bool(status.get("completionTime"))


def without_times(status: dict) -> dict:
    """Status minus fields that only say when: used to decide whether a patch is needed."""
    return {
        **status,
        "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []],
    }


def patch_for(previous: dict, current: dict) -> dict | None:
    """Merge patch that turns ``previous`` into ``current``; None when only timestamps would change.

    Fields of ours that ``current`` no longer has are set to null (a merge patch keeps them otherwise).
    """
    if without_times(previous) == without_times(current):
        return None
    patch = dict(current)
    for key in STATUS_FIELDS:
        if key in previous and key not in current:
            patch[key] = None
    return patch


def events(previous: dict, current: dict) -> list[Event]:
    """One event per condition whose status or reason changed, and one per phase change."""
    before = {c.get("type"): c for c in previous.get("conditions") or [] if isinstance(c, dict)}
    result = []
    for cond in current.get("conditions") or []:
        old = before.get(cond["type"]) or {}
        if (old.get("status"), old.get("reason")) == (cond["status"], cond["reason"]):
            continue
        if cond["reason"] in _QUIET_REASONS:
            continue
        warning = (cond["type"], cond["status"]) in _WARNING_STATES or cond["reason"] in _WARNING_REASONS
        result.append(Event("Warning" if warning else "Normal", cond["reason"], f"{cond['type']}={cond['status']}: {cond['message']}"))
    if previous.get("phase") != current.get("phase") and current.get("phase") in ("Running", "Suspended"):
        result.append(Event("Normal", current["phase"], current.get("message", "")))
    return result
