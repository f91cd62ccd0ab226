"""Where a queued child stands in Kueue, read from the Workload Kueue made for it (pure).

Kueue (v0.17, kueue.x-k8s.io/v1beta2) makes one Workload per RayJob / RayService that carries the
kueue.x-k8s.io/queue-name label, owned by it (controller ownerReference), and reports admission in
the Workload's conditions: QuotaReserved (False while pending, with the reason and message of its
scheduler: "couldn't assign flavors to pod set tpu-slice: insufficient unused quota for
google.com/tpu in flavor v6e-4x4, 16 more needed"; v0.19 may set none on a Workload it skipped as
equivalent to one that did not fit: docs/tasks/kueue.md), Admitted, Evicted (reason Preempted,
Deactivated, ...), Requeued and Finished. This module turns that into the operator's `Admitted`
condition and, while the child may not run, the phase `Queued` or `Preempted`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.phases import PREEMPTED, QUEUED

# Reasons of the Admitted condition that only say "still waiting" (no event each time).
QUIET_REASONS = {"WaitingForKueue"}


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str
    message: str
    phase: str | None  # QUEUED / PREEMPTED while the child may not run; None: the child's own phase holds
    cluster_queue: str | None = None
    workload: str | None = None
    admitted_at: str | None = None  # the Admitted condition's lastTransitionTime (while admitted)


WORKLOAD_CRD = "workloads.kueue.x-k8s.io"  # Kueue's Workload CRD: its schema caps pod sets per Workload


def podsets_max_items(crd: dict) -> int | None:
    """spec.podSets maxItems in Kueue's Workload CRD (8 in Kueue 0.17, 18 in 0.19): the smallest over
    its served versions, None when no served version's schema says."""
    caps = []
    for version in (crd.get("spec") or {}).get("versions") or []:
        if not isinstance(version, dict) or version.get("served") is False:
            continue
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        podsets = (((schema.get("properties") or {}).get("spec") or {}).get("properties") or {}).get("podSets") or {}
        cap = podsets.get("maxItems") if isinstance(podsets, dict) else None
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            caps.append(cap)
    return min(caps) if caps else None


def owner_of(workload: dict) -> tuple[str, str] | None:
    """(kind, name) of the object the Workload was made for (its controller ownerReference)."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("kind") or "", ref.get("name") or ""
    return None


# Kueue's elastic jobs (a queued autoscaled service): a scale-up is a new Workload, a slice naming
# (namespace/name) the admitted one it replaces once admitted itself (Kueue 0.19.1 workloadslicing).
SLICE_REPLACEMENT_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"


def workload_for(workloads: list[dict], child: dict) -> dict | None:
    """The Workload owned by this very child (its uid), the newest if Kueue made several; but while
    the newest is an elastic job's scale-up slice not yet admitted, the slice it replaces, which the
    child still runs on (it waits for quota to grow, not to run)."""
    uid = (child.get("metadata") or {}).get("uid")
    owned = [w for w in workloads
             if any(r.get("controller") and r.get("uid") == uid
                    for r in (w.get("metadata") or {}).get("ownerReferences") or [])]
    owned.sort(key=lambda w: (w.get("metadata") or {}).get("creationTimestamp") or "")
    if not owned:
        return None
    newest = owned[-1]
    replaces = ((newest.get("metadata") or {}).get("annotations") or {}).get(SLICE_REPLACEMENT_ANNOTATION)
    if replaces and not _true(_conditions(newest).get("Admitted")):
        replaced = next((w for w in owned if _key(w) == replaces), None)
        if replaced is not None and not _true(_conditions(replaced).get("Finished")):
            return replaced
    return newest


def _key(workload: dict) -> str:
    meta = workload.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _conditions(workload: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}


def _true(cond: dict | None) -> bool:
    return bool(cond) and cond.get("status") == "True"


def _checks(workload: dict) -> str:
    """Admission checks not yet Ready (e.g. a ProvisioningRequest for flex-start capacity)."""
    pending = [f"{c.get('name')}: {c.get('state')}" + (f" ({c['message']})" if c.get("message") else "")
               for c in (workload.get("status") or {}).get("admissionChecks") or [] if c.get("state") != "Ready"]
    return "; ".join(pending)


def admission(queue: str, child_kind: str, child_name: str, workload: dict | None,
              priority_class: str | None = None, priority_class_exists: bool = True) -> Admission:
    """The child's standing in LocalQueue ``queue`` from its Workload (None: Kueue made none yet)."""
    if workload is None:
        if priority_class and not priority_class_exists:
            return Admission(False, "WorkloadPriorityClassNotFound",
                             f"WorkloadPriorityClass {priority_class} does not exist: Kueue queues the {child_kind} "
                             f"once it is created (kubectl get workloadpriorityclasses)", QUEUED)
        return Admission(False, "WaitingForKueue",
                         f"waiting for Kueue to queue the {child_kind} {child_name} in LocalQueue {queue} "
                         f"(no Workload yet)", QUEUED)
    name = (workload.get("metadata") or {}).get("name")
    conds = _conditions(workload)
    cq = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
    evicted, reserved = conds.get("Evicted"), conds.get("QuotaReserved")

    def result(admitted: bool, reason: str, message: str, phase: str | None) -> Admission:
        return Admission(admitted, reason, message, phase, cq, name)

    if _true(conds.get("Finished")):
        return result(True, "Finished", conds["Finished"].get("message") or "the workload finished", None)
    if _true(evicted) and _true(reserved):
        # Being evicted: Kueue has suspended the child; its quota is released once its pods are gone.
        reason = evicted.get("reason") or "Evicted"
        message = evicted.get("message") or "evicted by Kueue"
        if reason == "Preempted":
            return result(False, "Preempted", message, PREEMPTED)
        return result(False, reason, message, None if reason == "Deactivated" else QUEUED)
    if _true(conds.get("Admitted")):
        where = f" by ClusterQueue {cq}" if cq else ""
        return Admission(True, "Admitted", f"admitted{where} from LocalQueue {queue}", None, cq, name,
                         conds["Admitted"].get("lastTransitionTime"))
    if _true(evicted) and evicted.get("reason") == "Deactivated":
        return result(False, "Deactivated", evicted.get("message") or "deactivated", None)
    if _true(reserved):  # quota reserved, admission checks pending (e.g. a ProvisioningRequest)
        checks = _checks(workload)
        return result(False, "AdmissionChecksPending",
                      f"quota reserved in ClusterQueue {cq}; waiting for admission checks" + (f": {checks}" if checks else ""),
                      QUEUED)
    reason = (reserved or {}).get("reason") or "Pending"
    message = (reserved or {}).get("message") or f"waiting in LocalQueue {queue}"
    if _true(conds.get("Requeued")) and (conds.get("Requeued") or {}).get("reason") == "Preempted":
        message = f"preempted earlier, queued again: {message}"
    return result(False, reason, message, QUEUED)
