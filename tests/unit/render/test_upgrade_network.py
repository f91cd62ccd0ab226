"""The NetworkPolicy across an operator upgrade (issue 59). The operator re-renders every Ray
cluster's NetworkPolicy from its spec at once (controller/extras.py), while the RayJob / RayService
keeps its stamped rendering until the user's next edit (render/stamp.py). That is safe only if the
new policy cuts no flow the running cluster uses, so this check asks cyclonus (the NetworkPolicy
engine the local chain enforces with, hack/fakedash/network.py) for every example and golden input,
under each operator configuration below: the previous release's policy (hack/releases.tsv, rendered
by its own code) and this tree's, on the same flows. Every flow the old policy admits must be
admitted by the new one; a widening is not a cut.

The flows are those a running cluster uses, built from render/network.py's ports and peer lists and
the pods the previous release rendered: its own pods (head, TPU hosts, KubeRay's submitter) to each
other on every Ray port; KubeRay and the operator (the configuration's peers, and the chain's
identities) to the dashboard and a service's Serve port; the metrics scrapers to Ray's metrics port;
a service's clients (its spec.exposure peers, a pod of its namespace, one elsewhere, a hosted
address) to the Serve port and the dashboard.

Design choice: if this check fails, the release must not let the NetworkPolicy follow the operator
at once: it must keep each running cluster's NetworkPolicy at its own rendering until the user's
edit (a new generation), as the RayJob / RayService do (docs/tasks/upgrade.md)."""

from __future__ import annotations

import copy
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tputorch.api.network import ANY_NAMESPACE, NAMESPACE_NAME_LABEL, Peer, parse_peer_text
from tputorch.api.spec import ServiceSpec, parse_any
from tputorch.render import render_any
from tputorch.render.names import SERVE_PORT
from tputorch.render.network import DASHBOARD_PORT, METRICS_PORT, NetworkPolicyConfig, network_policy

from .render_policies import pods
from .test_upgrade_diff import ROOT, example_bodies, golden_bodies, previous, previous_operator, render  # noqa: F401

sys.path.append(str(ROOT / "hack"))
from fakedash import network as chain  # noqa: E402

RENDER_POLICIES = Path(__file__).with_name("render_policies.py")
ELSEWHERE = "elsewhere"  # a namespace no peer names
ANYWHERE = "anywhere"  # the namespace of a source a peer "*" admits


def _identity_text(identity: dict) -> str:
    """A chain identity (hack/fakedash/network.py) as the operator's --network-policy-peer takes it."""
    if "hosted" in identity:
        return str(ipaddress.ip_network(identity["hosted"] + "/24", strict=False))
    return identity["namespace"] + ":" + ",".join(f"{k}={v}" for k, v in sorted(identity["labels"].items()))


def _configs() -> dict[str, dict]:
    """The operator configurations a running cluster's policy was rendered under (helm upgrade keeps
    the values): tputorch run's defaults, the chart's defaults, and strict mode with every kind of
    peer the chart sets (this operator, KubeRay in-cluster with the chart's labels and hosted)."""
    values = yaml.safe_load((ROOT / "charts" / "tputorch-operator" / "values.yaml").read_text())["networkPolicy"]
    kuberay = {"namespace": "ray-system", "labels": values["kuberay"]["podLabels"]}
    operator = _identity_text(chain.DEFAULT_IDENTITIES["operator"])
    return {
        "open, no peer": {"mode": "open", "peers": [], "metrics": []},
        "open, the chart's peer": {"mode": values["mode"], "peers": [operator], "metrics": []},
        "strict, every peer": {"mode": "strict", "peers": [operator, _identity_text(kuberay),
                                                             _identity_text(chain.DEFAULT_IDENTITIES["kuberay"])],
                               "metrics": ["gmp-system"]},
    }


CONFIGS = _configs()


def config(name: str) -> NetworkPolicyConfig:
    """CONFIGS[name] as this tree's operator reads its flags (render_policies.py does the same in each tree)."""
    c = CONFIGS[name]
    return NetworkPolicyConfig(c["mode"], tuple(parse_peer_text(p) for p in c["peers"]),
                               tuple(parse_peer_text(p) for p in c["metrics"]))


@dataclass(frozen=True)
class Endpoint:
    """A flow's end: a pod (namespace and labels) or a hosted address (namespace None)."""

    name: str
    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    ip: str = "10.8.1.10"

    def traffic(self) -> dict:
        """As cyclonus's traffic file takes it."""
        if self.namespace is None:
            return {"IP": self.ip}
        return {"Internal": {"PodLabels": dict(self.labels), "Namespace": self.namespace,
                             "NamespaceLabels": {NAMESPACE_NAME_LABEL: self.namespace}}, "IP": self.ip}


@dataclass(frozen=True)
class Flow:
    """One TCP connection a running cluster takes."""

    source: Endpoint
    destination: Endpoint
    port: int

    def __str__(self) -> str:
        return f"{self.source.name} -> {self.destination.name}:{self.port}"

    def traffic(self) -> dict:
        return {"Source": self.source.traffic(), "Destination": self.destination.traffic(), "Protocol": "TCP",
                "ResolvedPort": self.port}


def _pod(name: str, namespace: str, labels: dict | None) -> Endpoint:
    return Endpoint(name, namespace, tuple(sorted((labels or {}).items())))


def _peer(name: str, peer: Peer, namespace: str) -> Endpoint:
    """A source a peer admits (``namespace``: the policy's own)."""
    if peer.cidr is not None:
        net = ipaddress.ip_network(peer.cidr)
        return Endpoint(f"{name} {peer}", ip=str(net[1] if net.num_addresses > 1 else net[0]))
    where = namespace if peer.namespace is None else ANYWHERE if peer.namespace == ANY_NAMESPACE else peer.namespace
    return Endpoint(f"{name} {peer}", where, peer.labels)


def _chain(name: str, namespace: str) -> Endpoint:
    identity = chain.DEFAULT_IDENTITIES[name]
    if "hosted" in identity:
        return Endpoint(f"{name} (hosted)", ip=identity["hosted"])
    return _pod(f"{name} ({identity['namespace']})", identity["namespace"], identity["labels"])


def running_flows(spec, cluster: dict, config: NetworkPolicyConfig, namespace: str) -> list[Flow]:
    """The flows a running Ray cluster of ``spec`` uses, its pods as ``cluster`` (render_policies.pods)
    says and placed in ``namespace``, under the operator's ``config``."""
    serving = isinstance(spec, ServiceSpec)
    head = _pod("head", namespace, cluster["head"])
    hosts = [head] + [_pod(f"worker[{i}]", namespace, labels) for i, labels in enumerate(cluster["workers"])]
    own = hosts + ([_pod("submitter", namespace, cluster["submitter"])] if cluster["submitter"] is not None else [])
    ray_ports = sorted(set(cluster["ports"]) | {DASHBOARD_PORT, METRICS_PORT} | ({SERVE_PORT} if serving else set()))
    flows = [Flow(a, b, port) for a in own for b in hosts for port in ray_ports]
    # KubeRay and the operator: the dashboard, a service's Serve port (KubeRay reads Serve's health)
    callers = [_peer("peer", p, namespace) for p in config.peers] + [_chain(n, namespace) for n in ("kuberay", "operator")]
    flows += [Flow(c, head, DASHBOARD_PORT) for c in callers]
    flows += [Flow(s, h, METRICS_PORT) for s in (_peer("scraper", p, namespace) for p in config.metrics) for h in hosts]
    clients = [_chain("client", namespace), _pod("a pod of its namespace", namespace, {}),
               _pod("a pod elsewhere", ELSEWHERE, {})]
    if serving:
        clients += [_peer("client", p, namespace) for p in spec.exposure.peers]
        flows += [Flow(c, h, SERVE_PORT) for c in callers + clients for h in hosts]
    flows += [Flow(c, head, DASHBOARD_PORT) for c in clients]
    return list(dict.fromkeys(flows))


def placed(policy: dict, namespace: str) -> dict:
    """``policy`` moved to ``namespace`` (each case has its own, so that one cyclonus run decides
    them all), a peer naming its old namespace naming the new one."""
    was = policy["metadata"]["namespace"]

    def walk(node):
        if isinstance(node, dict):
            if node.get("matchLabels") == {NAMESPACE_NAME_LABEL: was}:
                return {**node, "matchLabels": {NAMESPACE_NAME_LABEL: namespace}}
            return {k: walk(v) for k, v in node.items()}
        return [walk(v) for v in node] if isinstance(node, list) else node

    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": policy["metadata"]["name"], "namespace": namespace}, "spec": walk(copy.deepcopy(policy["spec"]))}


def cuts(binary: str, cases: dict[str, tuple[dict, dict, list[Flow]]], versions: tuple[str, str]) -> list[str]:
    """Each flow the old policy admits and the new one does not, as "case: flow: verdicts".
    ``cases``: name -> (old policy, new policy, flows), each case's policies and flows in a namespace
    of its own. Two cyclonus runs in all."""
    names = list(cases)
    flows = [(name, flow) for name in names for flow in cases[name][2]]
    traffic = [flow.traffic() for _, flow in flows]
    old = chain.query(binary, [cases[n][0] for n in names], traffic)
    new = chain.query(binary, [cases[n][1] for n in names], traffic)
    return [f"{name}: {flow}: {versions[0]} admits, {versions[1]} denies"
            for (name, flow), was, now in zip(flows, old, new) if was and not now]


@pytest.fixture(scope="module")
def cyclonus() -> str:
    binary = chain.cyclonus_binary()
    if binary is None:
        pytest.fail("no cyclonus binary, and this check asks cyclonus: build it with `hack/build.sh cyclonus` "
                    "(~2 min cold; `make test` builds it), or set CYCLONUS to one")
    return binary


def _case_namespace(i: int) -> str:
    return f"case-{i}"


def test_no_flow_a_running_cluster_uses_is_cut_by_this_releases_networkpolicy(previous, previous_operator, cyclonus):
    bodies = {**golden_bodies(), **example_bodies()}
    given = {"bodies": bodies, "configs": CONFIGS}
    old = render(previous_operator, given, RENDER_POLICIES)
    new = render(ROOT / "operator", given, RENDER_POLICIES)
    assert new["refused"] == {}, "this version refuses an example or golden input"
    cases = {}
    for key in old["policies"]:  # a body the previous release refuses has no running cluster
        spec = parse_any(bodies[key])
        for config_name in CONFIGS:
            namespace = _case_namespace(len(cases))
            cases[f"{key} [{config_name}]"] = (placed(old["policies"][key][config_name], namespace),
                                               placed(new["policies"][key][config_name], namespace),
                                               running_flows(spec, old["pods"][key], config(config_name), namespace))
    assert len(old["policies"]) >= len(golden_bodies()), "the previous release rendered too few bodies to compare"
    cut = cuts(cyclonus, cases, (previous[0], "this tree"))
    assert not cut, (
        f"this release's NetworkPolicy cuts {len(cut)} flow(s) a running cluster of {previous[0]} uses; the operator "
        f"re-renders NetworkPolicies at once, so this release must keep each running cluster's policy at its own "
        f"rendering until the user's edit (docs/tasks/upgrade.md):\n" + "\n".join(f"  {c}" for c in cut[:40])
        + (f"\n  ... {len(cut) - 40} more" if len(cut) > 40 else ""))


def _one_case(body: dict, config_name: str) -> tuple[dict, list[Flow]]:
    spec = parse_any(body)
    namespace = _case_namespace(0)
    return (placed(network_policy(spec, config(config_name)), namespace),
            running_flows(spec, pods(render_any(spec)), config(config_name), namespace))


def _service_body() -> dict:
    return next(b for k, b in golden_bodies().items() if b["kind"] == "TPUTorchService")


def test_a_narrowed_policy_is_reported_with_the_cut_flow_and_both_verdicts(cyclonus):
    """The check can fail: the chart's policy without its open dashboard rule cuts the operator's
    progress reads, and the policy with its own pods' rule narrowed to GCS cuts head -> worker."""
    policy, flows = _one_case(_service_body(), "open, the chart's peer")
    no_dashboard = copy.deepcopy(policy)
    no_dashboard["spec"]["ingress"] = [r for r in policy["spec"]["ingress"]
                                       if r.get("ports") != [{"protocol": "TCP", "port": DASHBOARD_PORT}]]
    assert len(no_dashboard["spec"]["ingress"]) == len(policy["spec"]["ingress"]) - 1
    cut = cuts(cyclonus, {"narrowed": (policy, no_dashboard, flows)}, ("old", "new"))
    assert "narrowed: operator (tputorch-system) -> head:8265: old admits, new denies" in cut
    assert "narrowed: client (hosted) -> head:8265: old admits, new denies" in cut
    assert not [c for c in cut if ":8265:" not in c], cut  # the Serve port and Ray's own ports stay open

    gcs_only = copy.deepcopy(policy)
    gcs_only["spec"]["ingress"][0]["ports"] = [{"protocol": "TCP", "port": 6379}]
    cut = cuts(cyclonus, {"narrowed": (policy, gcs_only, flows)}, ("old", "new"))
    assert "narrowed: head -> worker[0]:10001: old admits, new denies" in cut
    assert "narrowed: head -> worker[0]:6379: old admits, new denies" not in cut


def test_a_widened_or_unchanged_policy_cuts_nothing(cyclonus):
    policy, flows = _one_case(_service_body(), "strict, every peer")
    widened = copy.deepcopy(policy)
    widened["spec"]["ingress"].append({"ports": [{"protocol": "TCP", "port": 6379}]})
    assert cuts(cyclonus, {"same": (policy, policy, flows), "widened": (policy, widened, flows)}, ("old", "new")) == []


def test_the_flows_follow_the_policys_own_ports_and_peers():
    """Each port and peer the policy names is among the flows: a new port or peer in render/network.py
    reaches the check without a copy here."""
    policy, flows = _one_case(_service_body(), "strict, every peer")
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports") or []}
    assert ports and ports <= {f.port for f in flows}
    sources = {f.source.name for f in flows}
    assert {"head", "worker[0]", "scraper gmp-system", "peer ray-system:app.kubernetes.io/name=kuberay-operator",
            "peer 203.0.113.0/24", "kuberay (hosted)", "operator (tputorch-system)", "a pod elsewhere"} <= sources
    job_policy, job_flows = _one_case(next(b for b in golden_bodies().values() if b["kind"] == "TPUTorchJob"),
                                      "open, no peer")
    assert "submitter" in {f.source.name for f in job_flows}
