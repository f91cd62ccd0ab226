"""The informers' stores the reconcile's steps read, and what each keeps of an object: only what
the reconcile reads (the slimmers; a store of whole objects was most of the operator's memory)
and only objects of ours (the keep filters). Each step is given the one ``Stores`` object, so
that a store set after the controller was made, as the handlers do, is seen by every step."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import status as statuses
from ..render.names import JOB_LABEL, RAYSERVICE_ANNOTATIONS, SERVICE_LABEL
from ..render import stamp as stamps
from ..api import spec as specs
from ..status import kueue
from .informer import Informer
from .kind import PODSETS_MAX, RAYCLUSTER, REFUSED, TPUTORCHJOB, TPUTORCHSERVICE, Kind


@dataclass
class Stores:
    parents: dict[str, Informer]  # kind -> its objects' informer
    children: dict[str, Informer]  # kind -> its children's (RayJobs, RayServices)
    pods: Informer | None
    workloads: Informer | None = None  # None: Kueue is not read
    priority_classes: Informer | None = None
    workload_crd: Informer | None = None  # Kueue's Workload CRD (its pod-set cap); None: not read
    extras: dict[str, Informer] = field(default_factory=dict)  # resource plural -> its informer


# --- what the stores keep: what the reconcile reads, nothing else ---------------------------------

# A spec larger than this is parsed as it is stored: a refused one keeps only its refusal (300
# CRD-valid 1.4 MB TPUTorchJobs that the parser refuses were 410 MB kept whole).
SPEC_KEPT_UNPARSED = 64 * 1024


def parent_slimmer(kind: Kind):
    """An object of ours as its store keeps it (slim_object); a large spec the parser refuses is
    replaced by the refusal, which is all its status needs (specs.py reads it)."""
    def slim(obj: dict) -> dict:
        kept = slim_object(obj)
        if _larger_than(kept["spec"], SPEC_KEPT_UNPARSED):
            try:
                kind.parse(kept)
            except specs.InvalidSpec as err:
                kept["spec"], kept[REFUSED] = {}, err.compact()
        return kept
    return slim


def _larger_than(value, limit: int) -> bool:
    """Whether ``value`` as JSON would be over about ``limit`` characters, walked only until it is."""
    budget, stack = limit, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            budget -= len(item) + 2
        elif isinstance(item, dict):
            budget -= 2 + sum(len(str(k)) + 4 for k in item)
            stack.extend(item.values())
        elif isinstance(item, list):
            budget -= 2 + len(item)
            stack.extend(item)
        else:
            budget -= 8
        if budget < 0:
            return True
    return False


def controlled_by(*resources: Resource):
    """A store's ``keep``: the object's controller ownerReference is of one of these kinds. What is
    selected by our managed-by label, which any tenant can set, is otherwise dropped unstored.
    Checking the kind needs no state; a forged owner uid is collected by Kubernetes' garbage
    collector, and an ownerReference only names an owner in the object's own namespace."""
    wanted = {(r.group, r.kind) for r in resources}

    def keep(obj: dict) -> bool:
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("controller"):
                return (str(ref.get("apiVersion") or "").split("/")[0], ref.get("kind")) in wanted
        return False
    return keep


keep_pod = controlled_by(RAYCLUSTER)  # KubeRay's RayCluster controls every Ray pod
keep_extra = controlled_by(TPUTORCHJOB, TPUTORCHSERVICE)  # ours directly

def slim_object(obj: dict) -> dict:
    """An object of ours: metadata without managedFields and annotations (kubectl's copy of the
    whole object is a third of the memory per object) but the user's request for the new rendering
    (render/stamp.py), spec, status."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("managedFields", "annotations")}
    asked = stamps.requested(obj)
    if asked:
        meta["annotations"] = {stamps.RERENDER_ANNOTATION: asked}
    return {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


_CHILD_META = ("name", "namespace", "uid", "resourceVersion", "generation", "labels", "ownerReferences",
               "deletionTimestamp", "creationTimestamp")  # created: the goodput ledger's moment (status/goodput.py)


# The stamp of a child's rendering (render/stamp.py) but the rendering itself: what a job's
# RayJob is kept with (its running attempt is never re-rendered, so its rendering is never restored)
# unless another operator version made it.
_STAMP_BUT_RENDERING = (stamps.VERSION_ANNOTATION, stamps.GENERATION_ANNOTATION, stamps.RERENDER_ANNOTATION)


def _slim_child(obj: dict, spec: dict, annotations_kept: tuple[str, ...]) -> dict:
    """A RayJob or RayService as its store keeps it: identity, owner, our spec hash, ``spec``, status."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in _CHILD_META if k in meta}
    annotations = meta.get("annotations") or {}
    # our spec hash, the initializing timeout a queued service gets on admission, the stamp
    ours = {k: annotations[k] for k in (*RAYSERVICE_ANNOTATIONS, *annotations_kept) if annotations.get(k)}
    if ours:
        kept["annotations"] = ours
    return {"metadata": kept, "spec": spec, "status": obj.get("status") or {}}


def slim_rayjob(obj: dict) -> dict:
    """A RayJob: of its spec, suspend (the one field a live RayJob is patched) and authOptions as
    stored: its cluster's token (the progress reads), and whether KubeRay's CRD dropped it
    (status/auth.py)."""
    spec = obj.get("spec") or {}
    read = {"suspend": spec["suspend"]} if "suspend" in spec else {}
    auth = (spec.get("rayClusterSpec") or {}).get("authOptions")
    if isinstance(auth, dict):
        read["rayClusterSpec"] = {"authOptions": dict(auth)}
    # its rendering only when another operator version made it: what RenderingCurrent compares
    # (reconcile_job); a RayJob of this version's is this version's rendering
    another = ((obj.get("metadata") or {}).get("annotations") or {}).get(stamps.VERSION_ANNOTATION) not in (
        None, stamps.OPERATOR_VERSION)
    return _slim_child(obj, read, stamps.STAMP_ANNOTATIONS if another else _STAMP_BUT_RENDERING)


def slim_rayservice(obj: dict) -> dict:
    """A RayService with its whole spec and its stamp: its patch (render/service.py
    rayservice_patch) replaces the spec, with its own stamped rendering unless the spec changed (render/stamp.py)."""
    return _slim_child(obj, obj.get("spec") or {}, stamps.STAMP_ANNOTATIONS)


def slim_extra(obj: dict) -> dict:
    """An extra child as its store keeps it: identity, owner, spec (what the reconcile compares)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in _CHILD_META if k in meta}, "spec": obj.get("spec") or {}}


# The labels that name the object a pod serves (kinds.JOB.label, kinds.SERVICE.label).
_OBJECT_LABELS = (JOB_LABEL, SERVICE_LABEL)
_POD_LABELS = _OBJECT_LABELS + statuses.POD_LABELS_READ


def slim_pod(obj: dict) -> dict:
    """A Ray pod of ours: which object and cluster it serves, its role, its conditions, and what
    says it is being lost (deletion, a node's ending of it) or cannot start (a container waiting)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = obj.get("status") or {}
    # lastTransitionTime: when a pod was scheduled and became Ready (the goodput ledger's moments)
    conditions = [{k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
                  for c in status.get("conditions") or []]
    slim_meta = {"name": meta.get("name"), "namespace": meta.get("namespace"),
                 "resourceVersion": meta.get("resourceVersion"),
                 "labels": {k: labels[k] for k in _POD_LABELS if k in labels}}
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
        if meta.get("deletionGracePeriodSeconds") is not None:  # when the deletion was asked (status/attempts.py)
            slim_meta["deletionGracePeriodSeconds"] = meta["deletionGracePeriodSeconds"]
        if meta.get("finalizers"):  # what holds a pod being deleted: the next attempt waits for it (status/attempts.py)
            slim_meta["finalizers"] = list(meta["finalizers"])
    slim_status = {"conditions": conditions}
    for key in ("phase", "reason", "message"):
        if status.get(key):
            slim_status[key] = status[key]
    for key in ("initContainerStatuses", "containerStatuses"):  # the waiting ones (an init container's holds the pod)
        waiting = [{"name": c.get("name"), "image": c.get("image"), "state": {"waiting": c["state"]["waiting"]}}
                   for c in status.get(key) or []
                   if isinstance((c.get("state") or {}).get("waiting"), dict) and c["state"]["waiting"].get("reason")]
        if waiting:
            slim_status[key] = waiting
    slim = {"metadata": slim_meta, "status": slim_status}
    spec = obj.get("spec") or {}
    slim_spec = {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {}
    # The TPU containers and which TPU_ variables they got: did the GKE TPU webhook see the pod?
    tpu = [{"name": c.get("name"), "resources": {"limits": {statuses.TPU_RESOURCE: c["resources"]["limits"][statuses.TPU_RESOURCE]}},
            "env": [{"name": e["name"]} for e in c.get("env") or [] if str(e.get("name", "")).startswith("TPU_")]}
           for c in spec.get("containers") or [] if statuses.TPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {})]
    if tpu:
        slim_spec["containers"] = tpu
    if slim_spec:
        slim["spec"] = slim_spec
    return slim


def pod_index(pod: dict) -> tuple[str, str, str] | None:
    """(kind label, namespace, object name) of the object the pod serves."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    for label in _OBJECT_LABELS:
        if label in labels:
            return label, meta.get("namespace") or "", labels[label]
    return None


# --- Kueue's Workloads and WorkloadPriorityClasses -----------------------------------------------

def slim_workload(obj: dict) -> dict:
    """A Workload as the status reads it: owner, spec.active, conditions, admission, checks."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = [{k: c[k] for k in ("type", "status", "reason", "message", "lastTransitionTime") if k in c}
                  for c in status.get("conditions") or []]
    checks = [{k: c[k] for k in ("name", "state", "message") if k in c} for c in status.get("admissionChecks") or []]
    admission = {"clusterQueue": (status.get("admission") or {}).get("clusterQueue")} if status.get("admission") else None
    spec = obj.get("spec") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
                                               "ownerReferences") if k in meta},
            "spec": {k: spec[k] for k in ("active", "queueName") if k in spec},
            "status": {k: v for k, v in (("conditions", conditions), ("admissionChecks", checks),
                                         ("admission", admission)) if v}}


def slim_workload_crd(obj: dict) -> dict:
    """Kueue's Workload CRD as its store keeps it: its name, version and cap on pod sets per
    Workload (none: its schema does not say), never the schema itself (about 0.5 MB)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "resourceVersion", "uid") if k in meta},
            PODSETS_MAX: kueue.podsets_max_items(obj)}


def workload_index(workload: dict) -> tuple[str, str, str] | None:
    """(namespace, owner kind, owner name) of the child a Workload was made for."""
    owner = kueue.owner_of(workload)
    if owner is None:
        return None
    return (workload.get("metadata") or {}).get("namespace") or "", owner[0], owner[1]


def slim_name(obj: dict) -> dict:
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "resourceVersion") if k in meta}}
