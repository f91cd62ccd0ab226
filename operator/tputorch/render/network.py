"""The NetworkPolicy of a Ray cluster: who reaches the dashboard, Serve and metrics ports."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.network import Peer
from ..api.spec import ServiceSpec
from .names import JOB_LABEL, SERVE_PORT, SERVICE_LABEL, Spec, pod_labels

DASHBOARD_PORT = 8265
METRICS_PORT = 8080  # Ray's metrics export port (KubeRay's "metrics" port; vLLM's series are there too)
# The NetworkPolicy of a job and of a service: names that never meet (neither suffix ends the other),
# so that a job and a service of the same name each keep their own.
JOB_NETWORK_POLICY_SUFFIX = "-rayjob"
SERVICE_NETWORK_POLICY_SUFFIX = "-ray"


@dataclass(frozen=True)
class NetworkPolicyConfig:
    """The operator's choice of sources for every Ray cluster's NetworkPolicy (tputorch run's
    --network-policy-* flags, the chart's networkPolicy values)."""

    mode: str = "open"  # network.POLICY_MODES
    peers: tuple[Peer, ...] = ()  # KubeRay's and the operator's: the dashboard (strict) and a service's Serve port
    metrics: tuple[Peer, ...] = ()  # metric scrapers: Ray's metrics port

    def admits_everyone_to_dashboard(self) -> bool:
        return self.mode != "strict"


def network_policy_name(spec: Spec) -> str:
    suffix = SERVICE_NETWORK_POLICY_SUFFIX if isinstance(spec, ServiceSpec) else JOB_NETWORK_POLICY_SUFFIX
    return spec.name + suffix


def _port_rule(ports: list[int], peers: tuple[Peer, ...] | None) -> dict:
    """Ingress on ``ports`` from ``peers`` (None: from any source)."""
    rule = {"ports": [{"protocol": "TCP", "port": n} for n in ports]}
    return rule if peers is None else {"from": [p.selector() for p in peers], **rule}


def network_policy(spec: Spec, config: NetworkPolicyConfig) -> dict:
    """The NetworkPolicy of a Ray cluster. Its own pods (head, TPU hosts, KubeRay's submitter) reach
    every port: Ray's GCS, client, dashboard agent, raylet, object-manager and multi-slice ports take
    work from whoever reaches them, so nobody else does. The dashboard (8265) from any source in open
    mode (Ray token auth refuses every call without the cluster's token, and where GKE's hosted
    KubeRay calls from is not documented), else from ``config.peers`` only; a service's Serve port
    per its spec.exposure and from the peers (KubeRay reads Serve's health); the metrics port from
    ``config.metrics``."""
    serving = isinstance(spec, ServiceSpec)
    owner = SERVICE_LABEL if serving else JOB_LABEL
    own = {"podSelector": {"matchLabels": {owner: spec.name}}}
    ingress = [{"from": [own]}]
    if config.admits_everyone_to_dashboard():
        ingress.append(_port_rule([DASHBOARD_PORT], None))
    if config.peers:
        ports = ([] if config.admits_everyone_to_dashboard() else [DASHBOARD_PORT]) + ([SERVE_PORT] if serving else [])
        if ports:
            ingress.append(_port_rule(ports, config.peers))
    if config.metrics:
        ingress.append(_port_rule([METRICS_PORT], config.metrics))
    if serving:
        exposure = spec.exposure
        if exposure.clients == "Anywhere":
            ingress.append(_port_rule([SERVE_PORT], None))
        elif exposure.clients == "InNamespace":
            ingress.append(_port_rule([SERVE_PORT], (Peer(),)))  # every pod of the service's namespace
        else:
            ingress.append(_port_rule([SERVE_PORT], exposure.peers))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": network_policy_name(spec), "namespace": spec.namespace,
                     "labels": pod_labels(spec)},
        "spec": {"podSelector": {"matchLabels": {owner: spec.name}}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
