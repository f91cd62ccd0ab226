"""The kinds this operator reconciles, and what of each object its stores keep."""

from __future__ import annotations

from . import crd, render, spec as specs, status as statuses
from .kube import Resource
from .reconcile import CLUSTER_LABEL, Kind

RAYJOB = Resource("ray.io", "v1", "rayjobs", "RayJob")
TPUTORCHJOB = Resource(crd.GROUP, crd.VERSION, crd.PLURAL, crd.KIND)
SPEC_HASH_ANNOTATION = "tputorch.io/spec-hash"


def _rayjob_patch(job: specs.JobSpec, rayjob: dict) -> dict | None:
    # Every other field of a TPUTorchJob is immutable (CRD rules); suspend is the one a live RayJob takes.
    if bool((rayjob.get("spec") or {}).get("suspend")) == job.suspend:
        return None
    return {"spec": {"suspend": job.suspend}}


def _rayjob_clusters(rayjob: dict) -> set[str]:
    name = (rayjob.get("status") or {}).get("rayClusterName")
    return {name} if name else set()


JOB = Kind(
    resource=TPUTORCHJOB, child=RAYJOB, label=render.JOB_LABEL,
    parse=specs.parse, render=render.rayjob, derive=statuses.derive,
    child_patch=_rayjob_patch, cluster_names=_rayjob_clusters, finished=statuses.finished,
    phase_metric="tputorch_jobs",
)

KINDS = [JOB]


# --- what the stores keep: what the reconcile reads, nothing else ---------------------------------

def slim_object(obj: dict) -> dict:
    """An object of ours: metadata without managedFields and annotations (kubectl's copy of the
    whole object is a third of the memory per object), spec, status."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("managedFields", "annotations")}
    return {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


_CHILD_META = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp")


def slim_child(obj: dict) -> dict:
    """A RayJob or RayService: identity, owner, our spec hash, suspend, and KubeRay's status."""
    meta = obj.get("metadata") or {}
    slim = {k: meta[k] for k in _CHILD_META if k in meta}
    annotation = (meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    if annotation:
        slim["annotations"] = {SPEC_HASH_ANNOTATION: annotation}
    spec = obj.get("spec") or {}
    return {"metadata": slim, "spec": {"suspend": spec["suspend"]} if "suspend" in spec else {},
            "status": obj.get("status") or {}}


_POD_LABELS = tuple(k.label for k in KINDS) + (statuses.ROLE_LABEL, CLUSTER_LABEL)


def slim_pod(obj: dict) -> dict:
    """A Ray pod of ours: which object and cluster it serves, its role, its conditions."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    conditions = [{k: c[k] for k in ("type", "status", "reason", "message") if k in c}
                  for c in (obj.get("status") or {}).get("conditions") or []]
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion"),
                         "labels": {k: labels[k] for k in _POD_LABELS if k in labels}},
            "status": {"conditions": conditions}}


def pod_index(pod: dict) -> tuple[str, str, str] | None:
    """(kind label, namespace, object name) of the object the pod serves."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    for kind in KINDS:
        if kind.label in labels:
            return kind.label, meta.get("namespace") or "", labels[kind.label]
    return None
