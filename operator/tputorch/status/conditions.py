"""What both kinds' status derivations share about conditions: making and stamping them (the
types are api/phases.py's), Kueue's part of the phase, invalid(), patch_for() and events(). What
the pods say is status/pods.py's.

Pure functions: the reconcile feeds them what the watches saw and patches what comes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from ..api.phases import (
    ADMITTED, CHIP_ISOLATION, FAILED, MAX_CONDITION_MESSAGE, PREEMPTED, QUEUE_PHASES, RAYJOB_CREATED, RAYSERVICE_CREATED,
    SERVICE_STATUS_FIELDS, STATUS_FIELDS, TERMINAL_PHASES, VALIDATED,
)
from ..api.spec import FieldError
from . import attempts, kueue

# The RayAuth condition's reasons (status/auth.py).
TOKEN_AUTH, AUTH_OPTIONS_DROPPED, AUTH_SECRET_NAME_DROPPED = "TokenAuth", "AuthOptionsDropped", "AuthSecretNameDropped"
# The RenderingCurrent condition's reasons (status/rendering.py).
OLDER_RENDERING = "OlderRendering"
REFUSED_BY_THIS_VERSION = "RefusedByThisVersion"
DEFAULT_SERVICE_ACCOUNT = "DefaultServiceAccount"  # StorageIdentity=False: reaches gs:// as the default account
STORAGE_ACCESS_DENIED = "StorageAccessDenied"  # StorageIdentity=False: Cloud Storage answered 403 (status/storage_access.py)
# HangSentinel (status/hang.py): watching the steps, or not able to (a script that reports none).
ARMED = "Armed"
NO_PROGRESS_REPORTED = "NoProgressReported"
WAITING_FOR_FIRST_REPORT = "WaitingForFirstReport"
# ReplicasOnWholeSlices (status/slices.py): each multi-host LLM replica on one whole slice, or not.
ONE_SLICE_PER_REPLICA, REPLICA_SPLIT_ACROSS_SLICES = "OneSlicePerReplica", "ReplicaSplitAcrossSlices"

# Condition states that are bad news: their events are Warnings.
_WARNING_STATES = {
    (VALIDATED, "False"),
    (FAILED, "True"),
    (RAYJOB_CREATED, "False"),
    (RAYSERVICE_CREATED, "False"),
    (CHIP_ISOLATION, "False"),
}
_WARNING_REASONS = {"Unschedulable", "NoMatchingNodePool", "TPUWebhookMissing", "PodsForbidden", "ApplicationUnhealthy", "ZeroServeEndpoints", "ErrImagePull", "ImagePullBackOff",
                    "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                    "CrashLoopBackOff", "Preempted", "WorkloadPriorityClassNotFound", "Inadmissible",
                    "QuotaExceeded", "PodCreationFailed", AUTH_OPTIONS_DROPPED, AUTH_SECRET_NAME_DROPPED,
                    "UpgradeStrategyNone", "TolerationsNotApplied", REFUSED_BY_THIS_VERSION,
                    DEFAULT_SERVICE_ACCOUNT, STORAGE_ACCESS_DENIED, attempts.HUNG, NO_PROGRESS_REPORTED,
                    REPLICA_SPLIT_ACROSS_SLICES}
# Reasons that only describe waiting; they change often and get no event of their own.
# "Valid" is every job's first state: an event per job for it would only add a write to each create.
# Kueue's "Pending" is told by the Queued phase's event.
# ("Applied": a NetworkPolicy in force is no news; one that could not be made is.)
_QUIET_REASONS = {"Valid", "Creating", "WaitingForHosts", "WaitingForKubeRay", "NoRayService", "Pending", "Applied",
                  TOKEN_AUTH, "WaitingForServeReload", "Upgrading", *kueue.QUIET_REASONS,
                  ARMED, WAITING_FOR_FIRST_REPORT, attempts.EARLIER_PODS_WAITING}  # the Retrying phase's event says it; past the deadline, a Warning
# Phases whose start is an event of its own (the others have a condition event that says it).
_PHASE_EVENTS = ("Running", "Retrying", "Suspended", "Deploying", "Ready", "Updating", "Degraded", "Recovering", *QUEUE_PHASES)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase
    message: str


# metav1.Condition's reason: what the API server validates it against (where a CRD declares it)
# and what every tool expects; a reason copied from KubeRay, Kueue or a pod is made to fit.
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
MAX_REASON = 1024


def reason_of(text: object) -> str:
    """``text`` as a condition reason: as it is when it is one, else its words joined in CamelCase
    ("back-off 5m" -> "BackOff5m"); "Unknown" when nothing of it is left."""
    text = str(text or "")
    if _REASON.match(text) and len(text) <= MAX_REASON:
        return text
    words = re.findall(r"[A-Za-z0-9]+", text)
    joined = "".join(w[:1].upper() + w[1:] for w in words).lstrip("0123456789")[:MAX_REASON]
    return joined[:1].upper() + joined[1:] or "Unknown"


def condition_of(status: dict, ctype: str) -> dict:
    """The condition of type ``ctype`` in ``status`` (ours, a previous one, or a KubeRay object's),
    {} when it has none."""
    return next((c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == ctype), {})


def condition(ctype: str, status: bool | None, reason: str, message: str, generation: int) -> dict:
    if len(message) > MAX_CONDITION_MESSAGE:
        message = message[: MAX_CONDITION_MESSAGE - 3] + "..."
    return {
        "type": ctype,
        "status": {True: "True", False: "False", None: "Unknown"}[status],
        "reason": reason_of(reason),
        "message": message,
        "observedGeneration": generation,
    }


def stamp(conditions: Iterable[dict], previous: dict, now: str) -> list[dict]:
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
        "conditions": stamp(
            [
                condition(VALIDATED, False, "ValidationFailed", message, generation),
                condition(FAILED, True, "ValidationFailed", message, generation),
            ],
            previous,
            now,
        ),
    }


def child_created(ctype: str, child_kind: str, name: str, child: dict | None, problem: tuple[str, str] | None,
                   generation: int) -> dict:
    """<Child>Created: the child exists, or why it does not (yet), or what it still lacks (a problem
    while it exists: its Ray token Secret could not be made)."""
    if child is not None and problem is None:
        return condition(ctype, True, "Created", f"{child_kind} {name} exists", generation)
    if problem is not None:
        return condition(ctype, False, problem[0], problem[1], generation)
    return condition(ctype, False, "Creating", f"creating the {child_kind}", generation)



def admitted_condition(queue: kueue.Admission, generation: int) -> dict:
    return condition(ADMITTED, queue.admitted, queue.reason, queue.message, generation)


def queue_fields(spec, queue: kueue.Admission | None) -> dict:
    """The status fields that say where a queued object stands (none without spec.queueName)."""
    fields = {"queue": spec.queue_name, "priorityClass": spec.priority_class_name}
    if queue is not None:
        fields.update(clusterQueue=queue.cluster_queue, workload=queue.workload)
    return {k: v for k, v in fields.items() if v}


def queue_phase(phase: str, suspended_by_user: bool, queue: kueue.Admission | None) -> str:
    """The phase once Kueue is heard: Queued / Preempted while it holds the child back (unless the
    child ended, or the user suspended it); a child Kueue admitted that KubeRay still shows
    suspended is about to start, not suspended."""
    if queue is None or phase in TERMINAL_PHASES or suspended_by_user:
        return phase
    if queue.phase:
        return queue.phase
    return "Pending" if phase == "Suspended" else phase


def queue_message(spec, queue: kueue.Admission) -> str:
    if queue.phase == PREEMPTED:
        return f"preempted by Kueue: {queue.message}"
    return f"queued in LocalQueue {spec.queue_name}: {queue.message}"


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
    for key in dict.fromkeys(STATUS_FIELDS + SERVICE_STATUS_FIELDS):
        if key in previous and key not in current:
            patch[key] = None
    return patch


def events(previous: dict, current: dict) -> list[Event]:
    """One event per condition whose status or reason changed, and one per phase change unless a
    condition's event already carries that reason (a suspend is one `Suspended` event, not two)."""
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
    phase = current.get("phase")
    if previous.get("phase") != phase and phase in _PHASE_EVENTS and phase not in {e.reason for e in result}:
        result.append(Event("Normal", phase, current.get("message", "")))
    return result
