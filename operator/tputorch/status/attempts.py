"""Why an attempt of a TPUTorchJob ended, and whether another one starts. Pure functions.

An attempt is one RayJob: a fresh Ray cluster on a whole slice. It ends for the infrastructure
(a host or the head of the slice lost: preemption, a node shut down or deleted, an eviction), for
the application (the script failed while every host was healthy), or as a hang (no training step
ended in time: status/hang.py). Each class has its own retry
budget (spec.retries); a lost host restarts the whole slice as a unit, since a multi-host TPU slice
cannot run with a host missing.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from .. import timestamps
from .pods import ROLE_LABEL

INFRASTRUCTURE = "Infrastructure"
APPLICATION = "Application"
SUCCEEDED = "Succeeded"
FINAL = "Final"  # ended in a way another attempt would not change (a deadline, an invalid RayJob)
# The hang sentinel (spec.hangDetection, status/hang.py) ended it: no step ended in time. Its own
# budget (spec.retries.hang), so that a deterministic hang never spends the infrastructure's.
HANG = "Hang"
HUNG = "Hung"  # its reason

# Kubernetes' DisruptionTarget pod condition (>= 1.26): why the pod is about to go.
DISRUPTION_REASONS = {
    "PreemptionByScheduler": "PodPreempted",
    "DeletionByTaintManager": "NodeUnreachable",  # a NoExecute taint: node not ready / unreachable
    "EvictionByEvictionAPI": "PodEvicted",
    "DeletionByPodGC": "NodeDeleted",  # the pod's node is gone
    "TerminationByKubelet": "NodeShutdown",  # graceful node shutdown, or the kubelet preempted it
}
# status.reason of a pod that the node (not its containers) ended.
FAILED_POD_REASONS = {
    "Evicted": "PodEvicted",
    "NodeShutdown": "NodeShutdown",
    "Shutdown": "NodeShutdown",
    "Terminated": "NodeShutdown",
    "NodeLost": "NodeDeleted",
    "NodeAffinity": "NodeLabelsChanged",
    "OutOfcpu": "PodEvicted",
    "OutOfmemory": "PodEvicted",
}
# KubeRay's RayJob failure reasons that another attempt would not change.
FINAL_KUBERAY_REASONS = {"DeadlineExceeded", "ValidationFailed", "SubmissionFailed"}

_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Warning))(?::\s*(.*))?$")


@dataclass(frozen=True)
class Ending:
    result: str  # INFRASTRUCTURE, APPLICATION, HANG, SUCCEEDED or FINAL
    reason: str  # CamelCase, for the condition and the event
    message: str
    hung_since: str | None = None  # HANG: when the last step ended (or the attempt began running), RFC 3339


def _meta(pod: Mapping) -> Mapping:
    return pod.get("metadata") or {}


def _role(pod: Mapping) -> str:
    return "head" if (_meta(pod).get("labels") or {}).get(ROLE_LABEL) == "head" else "TPU host"


def pod_lost(pod: Mapping) -> tuple[str, str] | None:
    """(reason, message) when the pod of a running attempt is going for a reason of the node's or
    the cluster's, not of its containers; None while it is healthy."""
    name = _meta(pod).get("name", "?")
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    where = f" on node {node}" if node else ""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            reason = DISRUPTION_REASONS.get(cond.get("reason", ""), "PodDisrupted")
            return reason, f"{_role(pod)} pod {name}{where}: {cond.get('reason', 'disrupted')}: {cond.get('message', '')}".rstrip(": ")
    if status.get("phase") == "Failed" and status.get("reason") in FAILED_POD_REASONS:
        reason = FAILED_POD_REASONS[status["reason"]]
        return reason, f"{_role(pod)} pod {name}{where}: {status['reason']}: {status.get('message', '')}".rstrip(": ")
    if _meta(pod).get("deletionTimestamp"):
        return "PodDeleted", f"{_role(pod)} pod {name}{where} is being deleted"
    return None


def deleted_after(pod: Mapping, ended_at: str | None) -> bool:
    """Whether the pod's deletion was asked for at or after ``ended_at`` (the RayJob's endTime):
    KubeRay tearing down a finished job's cluster, not a cause of the job's end. The API server sets
    deletionTimestamp to the request's time plus the grace period; a pod last seen without one
    cannot be told apart and counts as lost (so does one whose times do not parse)."""
    stamp, ended = timestamps.parse(_meta(pod).get("deletionTimestamp")), timestamps.parse(ended_at)
    if stamp is None or ended is None:
        return False
    asked = stamp - datetime.timedelta(seconds=_meta(pod).get("deletionGracePeriodSeconds") or 0)
    return asked >= ended


def host_lost(pods: Iterable[Mapping], deleted: Iterable[Mapping] = (), ended_at: str | None = None) -> Ending | None:
    """The first pod of the attempt's cluster that is lost (head first, then by name), or one that
    was deleted outright (``deleted``: the pods as last seen before they vanished). With
    ``ended_at`` (the Ray job has ended), a pod only deleted, and that after the end, is not lost."""
    found = []
    for pod in pods:
        lost = pod_lost(pod)
        if lost and not (lost[0] == "PodDeleted" and deleted_after(pod, ended_at)):
            found.append((_role(pod) != "head", _meta(pod).get("name", ""), lost))
    for pod in deleted:
        lost = pod_lost(pod) or ("PodDeleted", f"{_role(pod)} pod {_meta(pod).get('name', '?')} was deleted")
        if lost[0] == "PodDeleted" and deleted_after(pod, ended_at):
            continue
        found.append((_role(pod) != "head", _meta(pod).get("name", ""), lost))
    if not found:
        return None
    not_head, _, (reason, message) = min(found)
    if not not_head and reason == "PodDeleted":
        reason = "HeadLost"
    return Ending(INFRASTRUCTURE, reason, message)


def exception_of(message: str) -> str | None:
    """The last 'SomethingError: text' line of a Ray job's message (which ends with the driver's log)."""
    for line in reversed((message or "").splitlines()):
        m = _EXCEPTION_LINE.match(line)
        if m:
            return f"{m.group(1)}: {m.group(2)}".rstrip(": ") if m.group(2) else m.group(1)
    return None


def classify(rayjob_status: Mapping, pods: Iterable[Mapping], deleted: Iterable[Mapping] = ()) -> Ending | None:
    """Why the attempt ended, or None while it runs. A lost host or head wins over the Ray job's
    own end: a job that failed because its slice broke is the infrastructure's failure."""
    deployment = rayjob_status.get("jobDeploymentStatus") or ""
    job_status = rayjob_status.get("jobStatus") or ""
    if deployment == "Complete" and job_status == "SUCCEEDED":
        return Ending(SUCCEEDED, "JobSucceeded", rayjob_status.get("message") or "the Ray job succeeded")
    # Watches are not ordered: under load the pods KubeRay deletes once the job has ended (its
    # shutdownAfterJobFinishes) can be seen before the RayJob's end, and must not make a script's
    # failure the infrastructure's (seen once: a failing job retried on a new cluster).
    ended_at = rayjob_status.get("endTime") if deployment in ("Complete", "Failed") else None
    lost = host_lost(pods, deleted, ended_at)
    if lost is not None:
        return lost
    if deployment not in ("Complete", "Failed", "ValidationFailed"):
        return None
    reason = rayjob_status.get("reason") or "JobFailed"
    message = rayjob_status.get("message") or f"the Ray job ended {job_status or 'in failure'}"
    if reason in FINAL_KUBERAY_REASONS or deployment == "ValidationFailed":
        return Ending(FINAL, reason, message)
    raised = exception_of(message)
    if raised:
        # The exception first, so that a cut message still names it; Ray's own message (the exit
        # code and the driver's log tail) after it.
        message = f"the script raised {raised}; {message}"
    return Ending(APPLICATION, reason, message)


def retries_left(result: str, history: Iterable[Mapping], budget: Mapping[str, int]) -> int:
    """Retries of this class still allowed after the attempts in ``history`` (``budget`` is
    spec.retries: {"infrastructure": n, "application": m, "hang": h}; other endings are never retried)."""
    used = sum(1 for a in history if a.get("result") == result)
    return budget.get(result.lower(), 0) - used


# --- attempts never overlap -----------------------------------------------------------------------
# The next attempt's RayJob is created only once every pod of the earlier ones is gone from the API:
# deleting the RayJob (propagationPolicy Background) removes it at once while its pods, possibly
# still writing a checkpoint, outlive it. A pod's object goes only once its kubelet has confirmed
# its containers stopped (or it was force-deleted), so no two attempts ever run side by side.
EARLIER_PODS_WAITING = "PreviousAttemptTerminating"
EARLIER_PODS_STUCK = "PreviousAttemptStuck"
# Past this long, a pod still there is held by something other than its own shutdown: 10 minutes
# is far beyond the 30 s default grace period and the minutes a large checkpoint's last upload may
# take, yet short enough that a finalizer or a node that stopped answering is named the same hour.
# The next attempt still waits (overlap would be worse); the status names the pod that holds it.
EARLIER_PODS_DEADLINE_S = 600
MAX_PODS_NAMED = 5


@dataclass(frozen=True)
class EarlierPods:
    """The pods of earlier attempts the next one waits for."""

    reason: str  # EARLIER_PODS_WAITING, or EARLIER_PODS_STUCK past the deadline
    message: str
    recheck_s: float | None  # seconds until the deadline (None: past it, or no clock to count from)


def _why_held(pod: Mapping) -> str:
    meta, node = _meta(pod), (pod.get("spec") or {}).get("nodeName")
    parts = [f"being deleted since {meta['deletionTimestamp']}" if meta.get("deletionTimestamp") else "not yet deleted"]
    if meta.get("finalizers"):
        parts.append(f"held by finalizer(s) {', '.join(meta['finalizers'])}")
    if node:
        parts.append(f"on node {node}")
    return "; ".join(parts)


def earlier_pods(pods: Iterable[Mapping], number: int, since: str | None, now: str,
                 deadline_s: float = EARLIER_PODS_DEADLINE_S) -> EarlierPods | None:
    """Whether attempt ``number``'s RayJob must wait: ``pods`` are the pods labelled with the job's
    name (kept only when a RayCluster controls them) while the job has no RayJob, so every one of
    them is an earlier attempt's (or an earlier object's of that name, which as surely holds the
    slice and may write to the same checkpoints). ``since``: when the wait began (the previous
    attempt's end; else the earliest deletion asked of the pods), from which the deadline counts."""
    pods = sorted(pods, key=lambda p: (_role(p) != "head", _meta(p).get("name", "")))
    if not pods:
        return None
    started = timestamps.parse(since) or min(
        (timestamps.parse(_meta(p).get("deletionTimestamp")) - datetime.timedelta(
            seconds=_meta(p).get("deletionGracePeriodSeconds") or 0)
         for p in pods if timestamps.parse(_meta(p).get("deletionTimestamp"))), default=None)
    clock = timestamps.parse(now)
    waited = (clock - started).total_seconds() if started is not None and clock is not None else None
    names = ", ".join(_meta(p).get("name", "?") for p in pods[:MAX_PODS_NAMED]) + \
        (f" and {len(pods) - MAX_PODS_NAMED} more" if len(pods) > MAX_PODS_NAMED else "")
    earlier = "an earlier attempt" if number > 1 else "an earlier TPUTorchJob of this name"
    if waited is None or waited < deadline_s:
        left = deadline_s - waited if waited is not None else None
        return EarlierPods(EARLIER_PODS_WAITING, f"attempt {number} starts once the {len(pods)} pod(s) of {earlier} "
                           f"are gone (never two attempts at once): {names} still terminating", left)
    holder = next((p for p in pods if _meta(p).get("finalizers")), pods[0])  # a finalizer holds it surely
    return EarlierPods(EARLIER_PODS_STUCK, f"attempt {number} has waited {int(waited // 60)} min for the pods of {earlier} "
                       f"to go: pod {_meta(holder).get('name', '?')} holds it ({_why_held(holder)}); "
                       f"{len(pods)} pod(s) left: {names}. Attempts never overlap: remove what holds the pod "
                       f"(its finalizer, or the node that no longer answers)", None)
