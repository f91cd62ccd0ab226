"""`tputorch doctor`'s network checks: whether NetworkPolicies are enforced, and whether the
operator's policy mode admits KubeRay to the Ray dashboard.
"""

from __future__ import annotations

from ...api import network
from ...render.network import NetworkPolicyConfig
from .result import DOC_NETWORK, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown
from .cluster import operator_args


# kube-system pods of CNIs that enforce NetworkPolicy (GKE Dataplane V2 is anetd, i.e. Cilium).
ENFORCING_CNI_PODS = {"anetd": "GKE Dataplane V2", "cilium": "Cilium", "calico-node": "Calico",
                      "antrea-agent": "Antrea", "kube-router": "kube-router"}


def check_network(kube_system_pods: list[dict] | Unread, operator_deployments: list[dict] | Unread,
                  kuberay_deployments: list[dict] | Unread) -> list[Result]:
    """Whether NetworkPolicies are enforced (a heuristic: an enforcing CNI's pods in kube-system)
    and what the operator's policy mode admits."""
    results = []
    if isinstance(kube_system_pods, Unread):
        results.append(_unknown("network-policy", "kube-system's pods", kube_system_pods))
        enforced = None
    else:
        seen = sorted({label for p in kube_system_pods for prefix, label in ENFORCING_CNI_PODS.items()
                       if ((p.get("metadata") or {}).get("name") or "").startswith(prefix + "-")})
        enforced = bool(seen)
        if seen:
            results.append(Result("network-policy", UNKNOWN, f"NetworkPolicy probably enforced ({', '.join(seen)} pods "
                                  "in kube-system); `tputorch doctor --smoke` would tell"))
        else:
            results.append(Result("network-policy", WARN, "no NetworkPolicy engine seen in kube-system (no anetd/"
                                  "Dataplane V2, Cilium, Calico, Antrea): the Ray clusters' NetworkPolicies are "
                                  "probably not enforced; Ray token auth still guards the heads", doc=DOC_NETWORK))
    if isinstance(operator_deployments, Unread) or not operator_deployments:
        return results
    results.append(check_policy_mode(operator_args(operator_deployments[0]), kuberay_deployments, enforced))
    return results


def _flag_values(args: list[str], flag: str) -> list[str]:
    return ([args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
            + [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")])


def policy_config(args: list[str]) -> "NetworkPolicyConfig | None":
    """The NetworkPolicy the operator with these flags gives a Ray cluster (None: --no-network-policy),
    for --smoke to give its probe the same; ValueError on a peer the operator would refuse too."""
    if "--no-network-policy" in args:
        return None
    mode = (_flag_values(args, "--network-policy-mode") or ["open"])[-1]
    return NetworkPolicyConfig(mode, tuple(network.parse_peer_text(p) for p in _flag_values(args, "--network-policy-peer")),
                                      tuple(network.parse_peer_text(p) for p in _flag_values(args, "--network-policy-metrics-peer")))


def check_policy_mode(args: list[str], kuberay_deployments: list[dict] | Unread, enforced: bool | None) -> Result:
    """What the operator's NetworkPolicy mode (its Deployment's flags) admits to the Ray dashboard,
    which KubeRay must reach (it polls jobs and deploys Serve applications through it)."""
    if "--no-network-policy" in args:
        return Result("operator-policy", WARN, "the operator runs with --no-network-policy: its Ray clusters get no "
                      "NetworkPolicy (any pod may reach their ports; Ray token auth still guards the dashboard)",
                      doc=DOC_NETWORK)
    mode = (_flag_values(args, "--network-policy-mode") or ["open"])[-1]
    if mode != "strict":
        return Result("operator-policy", OK, f"the operator's NetworkPolicy mode is {mode}: the Ray dashboard (8265) "
                      "admits any source (KubeRay included), Ray token auth guards it")
    try:
        peers = [network.parse_peer_text(p) for p in _flag_values(args, "--network-policy-peer")]
    except ValueError as err:
        return Result("operator-policy", UNKNOWN, f"the operator's --network-policy-peer: {err}")
    shown = ", ".join(_flag_values(args, "--network-policy-peer")) or "no peer"
    kuberay_ns = None
    if not isinstance(kuberay_deployments, Unread) and kuberay_deployments:
        kuberay_ns = kuberay_deployments[0]["metadata"]["namespace"]
    admits = any(p.cidr is not None or p.namespace in (network.ANY_NAMESPACE, kuberay_ns) for p in peers)
    fix = ("list KubeRay's pods (chart: networkPolicy.kuberay.namespace, podLabels, or kuberay.cidrs for a hosted "
           "KubeRay), or use networkPolicy.mode=open")
    if kuberay_ns is None:
        return Result("operator-policy", WARN if peers else (FAIL if enforced else WARN),
                      f"strict NetworkPolicy mode admits {shown} to the Ray dashboard; no KubeRay Deployment found to "
                      "tell whether that admits KubeRay (GKE's add-on runs it where it is not documented)",
                      fix, DOC_NETWORK)
    if not admits:
        return Result("operator-policy", FAIL if enforced else WARN,
                      f"strict NetworkPolicy mode admits {shown}, not KubeRay's namespace {kuberay_ns}: "
                      "KubeRay could not reach the Ray dashboard", fix, DOC_NETWORK)
    return Result("operator-policy", OK, f"strict NetworkPolicy mode admits {shown} (KubeRay runs in {kuberay_ns})")
