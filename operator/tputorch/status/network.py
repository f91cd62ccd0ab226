"""What the status says about an object's NetworkPolicy: whether it could be made, and when the
network is the likely cause of what KubeRay reports (it could not reach the Ray dashboard).
Pure functions."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.phases import NETWORK_POLICY_READY
from .conditions import condition

# KubeRay 1.6 (rayjob_controller.go): the submitter ended and the dashboard never answered
# GetJobInfo within the grace period after it; the Ray job itself may well have succeeded.
GRACE_PERIOD_EXCEEDED = "JobDeploymentStatusTransitionGracePeriodExceeded"
DASHBOARD_UNREACHABLE = "DashboardUnreachable"
# What admits KubeRay: the chart's values (tputorch run's flags say the same).
ADMIT_KUBERAY = ("set the chart's networkPolicy.kuberay.namespace and podLabels to where KubeRay's pods run, or "
                 "networkPolicy.kuberay.cidrs to the address range its calls come from (--network-policy-peer), "
                 "or networkPolicy.mode=open (the dashboard from any source, Ray token auth guarding it)")


@dataclass(frozen=True)
class NetworkPolicyState:
    """An object's NetworkPolicy as the reconcile left it."""

    namespace: str
    name: str
    dashboard_open: bool  # admits every source to the dashboard port
    peers: tuple[str, ...] = ()  # the sources admitted there otherwise
    problem: tuple[str, str] | None = None  # (reason, message): it could not be made as rendered

    @property
    def restricts_dashboard(self) -> bool:
        """The policy is in force (made as rendered) and admits only some sources to the dashboard."""
        return self.problem is None and not self.dashboard_open


def ready_condition(state: NetworkPolicyState, generation: int) -> dict:
    if state.problem is not None:
        return condition(NETWORK_POLICY_READY, False, state.problem[0], state.problem[1], generation)
    admits = ("the dashboard from any source (Ray token auth guards it)" if state.dashboard_open else
              "the dashboard only from " + (", ".join(state.peers) or "no peer"))
    return condition(NETWORK_POLICY_READY, True, "Applied",
                     f"NetworkPolicy {state.name}: the cluster's own pods on every port, {admits}", generation)


def dashboard_cause(state: NetworkPolicyState | None) -> str | None:
    """Why KubeRay may not have reached the Ray dashboard, when the NetworkPolicy is the likely cause."""
    if state is None or not state.restricts_dashboard:
        return None
    return (f"KubeRay could not reach the Ray dashboard (port 8265); the likely cause is the NetworkPolicy "
            f"{state.namespace}/{state.name}, which admits it only from {', '.join(state.peers) or 'no peer'} "
            f"(strict mode): {ADMIT_KUBERAY}")
