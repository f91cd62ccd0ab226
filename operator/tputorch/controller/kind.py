"""What the reconcile's steps share: what a kind brings (``Kind``, ``Extra``), the kinds of
Kueue and KubeRay it reads, who owns a child, and how an API failure is told."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any, Callable

from kubernetes.client.rest import ApiException

from ..api import crd
from .kube import Resource

Key = tuple[str, str, str]  # (kind, namespace, name)
REFUSED = "refused"  # the key of a stored object's refusal (stores.parent_slimmer); no API field


@dataclass(frozen=True)
class Kind:
    """What the steps need of both kinds alike. What one kind alone does (a job's attempts, Kueue
    check, Ray token Secret and progress reads; a service's cluster bounds, admission timeout and
    rechecks) is a step its own reconcile names (Controller.reconcile_job, reconcile_service)."""

    resource: Resource  # the object: TPUTorchJob, TPUTorchService
    child: Resource  # what it becomes: RayJob, RayService (same name and namespace)
    label: str  # carried by the child and its pods: the object's name
    parse: Callable[[dict], Any]  # body -> spec, or raises InvalidSpec
    cluster_names: Callable[[dict], set[str]]  # the RayClusters the child runs on (its pods' cluster label)
    finished: Callable[[dict], bool]  # status -> the work is done: a vanished child is not made again
    slim_child: Callable[[dict], dict]  # the child as its store keeps it (what the reconcile reads of it)
    phase_metric: str  # the jobs/services-by-phase gauge
    phases: tuple[str, ...] = ()  # every phase of its status (the phase gauge emits each, 0 included)


# The kinds this operator reconciles, and what they become (KubeRay's).
TPUTORCHJOB = Resource(crd.GROUP, crd.VERSION, crd.PLURAL, crd.KIND)
TPUTORCHSERVICE = Resource(crd.GROUP, crd.VERSION, crd.SERVICE_PLURAL, crd.SERVICE_KIND)
RAYJOB = Resource("ray.io", "v1", "rayjobs", "RayJob")
RAYSERVICE = Resource("ray.io", "v1", "rayservices", "RayService")

# Kueue's objects (kueue.x-k8s.io/v1beta2, Kueue v0.17): the Workload it makes for a queued child,
# and the priority classes spec.priorityClassName names.
WORKLOAD = Resource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
RAYCLUSTER = Resource("ray.io", "v1", "rayclusters", "RayCluster")
WORKLOAD_PRIORITY_CLASS = Resource("kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass")
# Kueue's Workload CRD is read (one object, by name) for its cap on pod sets per Workload; its store
# keeps that cap under PODSETS_MAX (stores.slim_workload_crd), not the schema.
CRD = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition")
PODSETS_MAX = "podSetsMaxItems"


@dataclass(frozen=True)
class Extra:
    """A further child every object gets besides its RayJob / RayService (its NetworkPolicy): made
    from the spec, owned by the object like the main child, put back when changed or deleted."""

    resource: Resource
    render: Callable[[Any], dict]  # spec -> object (without ownerReferences)
    # (spec, problem or None) -> what the status derivation is given as ``network``
    status: Callable[[Any, tuple[str, str] | None], Any] | None = None


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def controller_of(obj: dict) -> dict | None:
    return next((o for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")), None)


def owner_reference(kind: Kind, parent: dict) -> dict:
    meta = parent["metadata"]
    return {"apiVersion": kind.resource.api_version, "kind": kind.resource.kind, "name": meta["name"],
            "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}


def ownership(kind: Kind, parent: dict, child: dict) -> str:
    """'ours' only when the child's controller is this very object (its uid); 'previous' when it
    belongs to an earlier object of the same kind and name (deleted, its child still going);
    'foreign' otherwise, whatever labels it carries."""
    owner = controller_of(child)
    if owner is None:
        return "foreign"
    if owner.get("uid") == parent["metadata"].get("uid"):
        return "ours"
    # the group, not the whole apiVersion: a child made before a CRD version bump stays "previous"
    group = (owner.get("apiVersion") or "").split("/")[0]
    same_kind = owner.get("kind") == kind.resource.kind and group == kind.resource.group
    return "previous" if same_kind and owner.get("name") == parent["metadata"].get("name") else "foreign"


def waiting_problem(kind: Kind, namespace: str, name: str, owned: str) -> tuple[str, str]:
    child = kind.child.kind
    if owned == "previous":
        return (f"Previous{child}Terminating",
                f"the {child} {name} of an earlier {kind.resource.kind} of this name is still being deleted; "
                f"this one creates its own once it is gone")
    return (f"{child}NameTaken",
            f"a {child} named {name} already exists in {namespace} and does not belong to this "
            f"{kind.resource.kind}: delete that {child} or give the {kind.resource.kind} another name")


def create_problem(kind: Kind, err: Exception) -> tuple[str, str]:
    child = kind.child.kind
    status = getattr(err, "status", None)
    if status == 404:
        return ("KubeRayNotInstalled", f"the {child} kind ({kind.child.api_version}) is not served: install "
                f"KubeRay's CRDs and operator; the {child} will be created once they exist")
    if status == 403:
        # RBAC, or an admission webhook's denial (Kueue's, for one): the API's message says which.
        return ("Forbidden", f"the {child} was refused: {api_message(err) or getattr(err, 'reason', '')}")
    if isinstance(err, ApiException):
        return (f"{child}CreateFailed", f"creating the {child} failed: HTTP {err.status} {err.reason}: "
                f"{(err.body or '')[:500]}")
    return (f"{child}CreateFailed", f"creating the {child} failed: {type(err).__name__}: {str(err)[:300]}")



def gone_or_replaced(err: ApiException) -> bool:
    """404, or the 422 of our uid test (another object holds the name now): the API server answers
    a failed JSON-patch test with a bare Invalid, a status that breaks the schema with its causes."""
    return err.status == 404 or (err.status == 422 and '"causes"' not in (err.body or ""))


def api_message(err: Exception) -> str:
    """The message of a Status answer (what an admission webhook or RBAC said), if there is one."""
    try:
        return str(json.loads(getattr(err, "body", None) or "{}").get("message") or "")[:1000]
    except (ValueError, AttributeError):
        return ""


def describe(err: Exception) -> str:
    if isinstance(err, ApiException):  # the body says which field a 422 refused
        return f"HTTP {err.status} {err.reason}: {(err.body or '')[:300]}"
    return f"{type(err).__name__}: {str(err)[:200]}"

