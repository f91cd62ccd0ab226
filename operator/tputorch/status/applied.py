"""Whether the running service is what its spec says, read from KubeRay 1.6's RayService (pure).

KubeRay 1.6 (rayservice_controller.go) says Ready for a new generation before it has applied it,
and applies some edits never:

- An edit of the Serve config only is applied in place. In the reconcile that first sees the new
  generation KubeRay reads the Serve application statuses *before* it PUTs the new config
  (reconcileServe: getAndCheckServeStatus, then updateServeDeployment) and writes them with the new
  observedGeneration: the first status of the new generation is the old config's. Ray 2.60 Serve
  rebuilds an application whose args changed (every serve config this operator renders puts the
  whole model in the args) and reports it DEPLOYING until the new replicas are HEALTHY, so the
  reload is seen once the application is reported not RUNNING for the new generation; or, for a
  reload too quick for that, once KubeRay has written no status for RELOAD_QUIET_S after that
  first one: it reads the applications every 2 s (ServiceDefaultRequeueDuration) and writes any
  change, so its reads since the PUT all found the same RUNNING. An edit of the deployments
  override alone (replicas, targetOngoingRequests, ingressReplicas) leaves the args as they were:
  Serve applies it to the running replicas, the application stays RUNNING, and the quiet rule
  decides.
- An edit of the slice's pod spec makes a new RayCluster (UpgradeInProgress) unless
  spec.upgradeStrategy is None: then KubeRay neither replaces nor updates the running cluster and
  stays Ready on the old spec.
- GenerateHashWithoutReplicasAndWorkersToDelete (utils/util.go) leaves tolerations and scheduling
  gates out of the cluster hash (Kueue injects them), so a tolerations-only edit reaches neither
  the running RayCluster nor a new one, under either strategy.

The operator keeps, in status.appliedConfig, the hashes of what it has seen applied; this module
decides from them and the observed RayService.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .. import timestamps
from ..api.service import NO_UPGRADE
from ..render.names import SERVE_APP
from ..render.output import spec_hash
from .conditions import condition_of

APPLIED_FIELD = "appliedConfig"  # status field: what the operator has seen the running service apply

# The SpecApplied condition's reasons.
APPLIED = "Applied"
WAITING_FOR_KUBERAY = "WaitingForKubeRay"
WAITING_FOR_SERVE_RELOAD = "WaitingForServeReload"
UPGRADING = "Upgrading"
UPGRADE_STRATEGY_NONE = "UpgradeStrategyNone"
TOLERATIONS_NOT_APPLIED = "TolerationsNotApplied"
UNSCHEDULABLE = "Unschedulable"
# KubeRay requeues a RayService every 2 s: this long without a status write after the first one of
# a generation, its reads since its PUT have all found the applications as that write says.
RELOAD_QUIET_S = 10.0
# Reasons after which the service keeps serving the old spec for ever (no phase change).
NEVER_APPLIED = (UPGRADE_STRATEGY_NONE, TOLERATIONS_NOT_APPLIED)
# Reasons while an edit is under way (the phase is Updating).
IN_PROGRESS = (WAITING_FOR_KUBERAY, WAITING_FOR_SERVE_RELOAD, UPGRADING, UNSCHEDULABLE)


def _pod_specs(cluster: dict) -> list[dict]:
    groups = [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or [])]
    return [((g.get("template") or {}).get("spec")) or {} for g in groups if isinstance(g, dict)]


def cluster_hash(cluster_spec: dict) -> str:
    """A hash of a rayClusterConfig over what KubeRay 1.6's cluster hash covers: without replicas,
    min/max replicas, workersToDelete, tolerations, scheduling gates and upgradeStrategy."""
    muted = copy.deepcopy(cluster_spec or {})
    muted.pop("upgradeStrategy", None)
    for group in muted.get("workerGroupSpecs") or []:
        for key in ("replicas", "minReplicas", "maxReplicas"):
            group.pop(key, None)
        (group.get("scaleStrategy") or {}).pop("workersToDelete", None)
    for pod in _pod_specs(muted):
        pod.pop("tolerations", None)
        pod.pop("schedulingGates", None)
    return spec_hash(muted)


def tolerations_hash(cluster_spec: dict) -> str:
    """A hash of what cluster_hash leaves out of the pod specs: tolerations and scheduling gates."""
    return spec_hash([{k: pod.get(k) for k in ("tolerations", "schedulingGates")}
                             for pod in _pod_specs(cluster_spec or {})])


def serve_hash(serve_config: str) -> str:
    return spec_hash(serve_config or "")


@dataclass(frozen=True)
class Applied:
    reason: str  # APPLIED or one of the reasons above
    message: str
    record: dict  # the new status.appliedConfig

    @property
    def applied(self) -> bool:
        return self.reason == APPLIED


def recheck_in(status: dict, now: str, rayservice: dict | None) -> float | None:
    """Seconds until a service waiting for its Serve reload should be looked at again (no event
    comes when KubeRay writes nothing), or None."""
    cond = condition_of(status, "SpecApplied")
    if cond.get("reason") != WAITING_FOR_SERVE_RELOAD:
        return None
    written = timestamps.seconds(((rayservice or {}).get("status") or {}).get("lastUpdateTime"))
    at = timestamps.seconds(now)
    if written is None or at is None:
        return RELOAD_QUIET_S
    return max(1.0, written + RELOAD_QUIET_S - at)


def applied(rayservice: dict, previous_record: dict | None, upgrade_strategy: str,
            pending_problem: str | None = None, now: str | None = None) -> Applied:
    """Whether the RayService's current spec is what its serving cluster runs; ``previous_record``
    is the last status.appliedConfig, ``pending_problem`` why the pending cluster's pods wait (the
    scheduler's message), if they do."""
    spec = rayservice.get("spec") or {}
    meta = rayservice.get("metadata") or {}
    st = rayservice.get("status") or {}
    active = st.get("activeServiceStatus") or {}
    pending = st.get("pendingServiceStatus") or {}
    active_name, pending_name = active.get("rayClusterName"), pending.get("rayClusterName")
    want = {"serveConfig": serve_hash(spec.get("serveConfigV2") or ""),
           "cluster": cluster_hash(spec.get("rayClusterConfig") or {}),
           "tolerations": tolerations_hash(spec.get("rayClusterConfig") or {})}
    prev = dict(previous_record or {})
    seen, wanted = st.get("observedGeneration"), meta.get("generation")
    observed = seen is None or wanted is None or seen >= wanted  # a store without them: judged as seen

    if not active_name:  # not serving yet: the first deploy's status says the rest
        record = {**want, "rayClusterName": None} if not prev else prev
        return Applied(APPLIED, "no cluster serves yet", {k: v for k, v in record.items() if v is not None})
    if not observed:
        return Applied(WAITING_FOR_KUBERAY, f"KubeRay has not yet seen generation {wanted} of the RayService "
                       f"(observedGeneration {seen})", prev)
    if pending_name:
        if pending_problem:
            return Applied(UNSCHEDULABLE, f"the new RayCluster {pending_name} cannot start: {pending_problem}; "
                           f"{active_name} keeps serving the old spec", prev)
        return Applied(UPGRADING, f"KubeRay is starting RayCluster {pending_name} with the new spec; "
                       f"{active_name} keeps serving the old spec", prev)
    if prev.get("rayClusterName") != active_name:
        # The first cluster, a promoted one, or a record from before this field: KubeRay made the
        # cluster from the spec it shows and deployed this Serve config on it.
        return Applied(APPLIED, f"RayCluster {active_name} runs the current spec", {**want, "rayClusterName": active_name})
    record = dict(prev)
    if want["serveConfig"] != prev.get("serveConfig"):
        app = (((active.get("applicationStatuses") or {}).get(SERVE_APP)) or {}).get("status")
        written, at = timestamps.seconds(st.get("lastUpdateTime")), timestamps.seconds(now)
        quiet = written is not None and at is not None and at - written >= RELOAD_QUIET_S
        if app in (None, "RUNNING") and not quiet:
            return Applied(WAITING_FOR_SERVE_RELOAD,
                           "KubeRay has not been seen to reload the edited Serve config: its first status of a new "
                           "generation carries the application statuses it read before sending the new config", prev)
        record["serveConfig"] = want["serveConfig"]  # Serve is redeploying the new config, or has
    if want["cluster"] != prev.get("cluster"):
        if upgrade_strategy == NO_UPGRADE:
            return Applied(UPGRADE_STRATEGY_NONE,
                           f"spec.upgradeStrategy is None: KubeRay applies no edit of the slice's pods, RayCluster "
                           f"{active_name} keeps running the old spec (use NewCluster, or delete and re-create the "
                           "service)", record)
        # KubeRay makes no new cluster for this edit: it is not one it would act on either
        return Applied(APPLIED, f"RayCluster {active_name} runs the current spec", {**record, "cluster": want["cluster"]})
    if want["tolerations"] != prev.get("tolerations"):
        return Applied(TOLERATIONS_NOT_APPLIED,
                       "KubeRay 1.6 leaves tolerations and scheduling gates out of its cluster hash (Kueue injects "
                       f"them), so this edit reaches neither RayCluster {active_name} nor a new one: delete and "
                       "re-create the service to apply it", record)
    return Applied(APPLIED, f"RayCluster {active_name} runs the current spec", record)
