"""The two kinds this operator reconciles (``JOB``, ``SERVICE``: what the shared steps need of
each), and the further children every object gets (its NetworkPolicy)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from ..api import spec as specs
from ..api.phases import JOB_PHASES, SERVICE_PHASES
from .. import status as statuses
from ..render.names import JOB_LABEL, SERVICE_LABEL
from ..render.network import NetworkPolicyConfig, network_policy, network_policy_name
from ..status import network as network_status
from .kube import Resource
from .kind import RAYJOB, RAYSERVICE, TPUTORCHJOB, TPUTORCHSERVICE, Extra, Kind
from .stores import slim_rayjob, slim_rayservice


def _rayjob_clusters(rayjob: dict) -> set[str]:
    name = (rayjob.get("status") or {}).get("rayClusterName")
    return {name} if name else set()


def _rayservice_clusters(rayservice: dict) -> set[str]:
    # the serving cluster and, during an upgrade, the one being prepared
    status = rayservice.get("status") or {}
    names = {(status.get(s) or {}).get("rayClusterName") for s in ("activeServiceStatus", "pendingServiceStatus")}
    return names - {None, ""}


def _never_finished(_status: dict) -> bool:
    return False  # a service serves until it is deleted: a vanished RayService is always made again


JOB = Kind(
    resource=TPUTORCHJOB, child=RAYJOB, label=JOB_LABEL, parse=specs.parse,
    cluster_names=_rayjob_clusters, finished=statuses.finished, slim_child=slim_rayjob,
    phase_metric="tputorch_jobs", phases=JOB_PHASES,
)
SERVICE = Kind(
    resource=TPUTORCHSERVICE, child=RAYSERVICE, label=SERVICE_LABEL, parse=specs.parse_service,
    cluster_names=_rayservice_clusters, finished=_never_finished, slim_child=slim_rayservice,
    phase_metric="tputorch_services", phases=SERVICE_PHASES,
)

KINDS = [JOB, SERVICE]


def bounded(kinds: list[Kind], max_pods: int) -> list[Kind]:
    """``kinds`` whose parse refuses an object of more than ``max_pods`` pods (--max-pods-per-job)."""
    return [replace(kind, parse=partial(kind.parse, max_pods=max_pods)) for kind in kinds]


NETWORKPOLICY = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")


def extras(policy: NetworkPolicyConfig | None) -> list[Extra]:
    """The further children of every object: its NetworkPolicy, unless switched off (None)."""
    if policy is None:
        return []
    def state(spec, problem):
        return network_status.NetworkPolicyState(spec.namespace, network_policy_name(spec),
                                                 policy.admits_everyone_to_dashboard(),
                                                 tuple(str(p) for p in policy.peers), problem)
    return [Extra(NETWORKPOLICY, lambda spec: network_policy(spec, policy), state)]
