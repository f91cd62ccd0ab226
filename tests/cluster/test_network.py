"""The pod network as GKE Dataplane V2 enforces it (issue 41): the stand-in dashboard asks cyclonus,
a real NetworkPolicy engine, whether the NetworkPolicies in force admit each connection it carries
to a Ray pod, and drops the denied ones (hack/fakedash/network.py). KubeRay is "hosted": it calls
from an address outside the pod network, as GKE's Ray Operator add-on may. What KubeRay then does is
the real binary's.

- the chart's defaults (open mode): test_operator_e2e.py's 4x4 job runs under them and reaches
  Succeeded through KubeRay's own status path; from another namespace a pod is denied GCS, the
  client port and a raylet port of the job's cluster, and a call to 8265 without the token is
  refused by Ray auth (there too);
- a service's Serve port follows its spec.exposure (cyclonus's verdicts on the policies the
  operator writes);
- strict mode with no KubeRay peer: KubeRay's GetJobInfo calls are dropped, the run succeeds and
  its submitter ends, and KubeRay 1.6 marks the RayJob Failed 30 s later (grace period exceeded);
  the TPUTorchJob's condition names its NetworkPolicy and the values that admit KubeRay; a
  service's slice comes up, KubeRay's Serve calls are dropped, and it says why while Deploying
  (one strict operator for both, the service's slice coming up while the job waits out KubeRay).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import yaml

from namespaces import delete_namespace, make_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)

from tputorch.render.names import JOB_LABEL, SERVICE_LABEL
from tputorch.render.network import NetworkPolicyConfig, network_policy
from tputorch.api import spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from fakedash import network  # noqa: E402

GROUP, VERSION = "tputorch.io", "v1alpha1"


def job(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-torch-tpu:2.60.0",
                     "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
                     "worker": {"cpu": "4", "memory": "16Gi"}}}


def status_of(kube, ns, name) -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "tputorchjobs", name).get("status") or {}


def wait_phase(kube, ns, name, phase, timeout):
    return kube.wait(lambda: (lambda s: s if s.get("phase") == phase else None)(status_of(kube, ns, name)),
                     timeout, f"{ns}/{name} {phase}")


def condition(st, ctype) -> dict:
    return next((c for c in st.get("conditions") or [] if c["type"] == ctype), {})


def verdicts(policies, flows) -> list[bool]:
    """cyclonus's verdict per (source pod, destination pod, port) under ``policies``."""
    def end(pod):
        ns = pod["metadata"]["namespace"]
        return {"Internal": {"PodLabels": pod["metadata"]["labels"], "Namespace": ns,
                             "NamespaceLabels": {"kubernetes.io/metadata.name": ns}}, "IP": "10.8.0.9"}
    clean = [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": p["metadata"]["name"], "namespace": p["metadata"]["namespace"]}, "spec": p["spec"]}
             for p in policies]
    return network.query(network.cyclonus_binary(), clean,
                         [{"Source": end(a), "Destination": end(b), "Protocol": "TCP", "ResolvedPort": n} for a, b, n in flows])


@pytest.mark.parametrize("exposure,admitted", [
    ({}, {"same", "web-front", "web-other", "elsewhere"}),
    ({"clients": "InNamespace"}, {"same"}),
    ({"clients": "Listed", "from": [{"namespace": "web", "podLabels": {"app": "front"}}]}, {"web-front"}),
])
def test_a_services_serve_port_follows_its_exposure(exposure, admitted):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": "chat", "namespace": "ml"},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/vllm:1",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, **({"exposure": exposure} if exposure else {})}}
    policy = network_policy(spec.parse_service(body), NetworkPolicyConfig())
    head = {"metadata": {"namespace": "ml", "labels": {SERVICE_LABEL: "chat"}}}
    clients = {"same": ("ml", {"app": "x"}), "web-front": ("web", {"app": "front"}), "web-other": ("web", {"app": "y"}),
               "elsewhere": ("other", {})}
    got = verdicts([policy], [({"metadata": {"namespace": ns, "labels": labels}}, head, 8000)
                              for ns, labels in clients.values()])
    assert {name for name, ok in zip(clients, got) if ok} == admitted
    # GCS stays closed to every one of them, whatever the exposure
    assert not any(verdicts([policy], [({"metadata": {"namespace": ns, "labels": labels}}, head, 6379)
                                       for ns, labels in clients.values()]))


def enforce(dashboard) -> dict:
    """Policies enforced, KubeRay hosted (the stand-in dashboard's defaults, said here)."""
    net = dashboard._call("PUT", "/network", {"enforce": True, "reset": True})
    if not net["enforce"]:
        pytest.fail(f"NetworkPolicies are not enforced by the stand-in dashboard: {net}")
    assert "hosted" in net["identities"]["kuberay"]
    return net


def service(name: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm-torchtpu:2.60.0",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "head": {"cpu": "1", "memory": "2Gi"},
                     "worker": {"cpu": "4", "memory": "16Gi"}}}


@pytest.fixture(scope="module")
def strict(kube, kube_env, tputorch_crd, dashboard, tmp_path_factory):
    """One operator in strict mode with no KubeRay peer, watching two namespaces: a job in one, a
    service in the other, both applied at once (two v6e 2x2 pools), so the service's slice comes up
    while the job waits out KubeRay's grace period. Each test waits for its own object's outcome."""
    enforce(dashboard)
    spaces = {kind: make_namespace(kube, f"network-strict-{kind}-{uuid.uuid4().hex[:5]}") for kind in ("job", "svc")}
    op = OperatorProcess(kube.kubeconfig, tmp_path_factory.mktemp("network-strict") / "operator.log",
                         list(spaces.values()), extra_args=["--network-policy-mode", "strict"],
                         dashboard_url=kube_env["dashboard_url"]).start()
    try:
        kubectl(kube.kubeconfig, "apply", "-n", spaces["job"], "-f", "-", input=yaml.safe_dump(job("strict")))
        kubectl(kube.kubeconfig, "apply", "-n", spaces["svc"], "-f", "-", input=yaml.safe_dump(service("chat")))
        yield spaces
    finally:
        op.stop()
        for ns in spaces.values():
            delete_namespace(kube, ns, wait=False)
        for ns in spaces.values():
            delete_namespace(kube, ns)
    assert "Traceback" not in op.log(), op.log()[-5000:]


def test_strict_mode_without_a_kuberay_peer_fails_the_job_as_kuberay_does_and_says_why(kube, dashboard, strict):
    namespace = strict["job"]
    wait_phase(kube, namespace, "strict", "Running", 120)  # Initializing -> Running needs no dashboard call
    dashboard.set_job_status(namespace, "strict", "SUCCEEDED")  # the run succeeds; its submitter ends
    st = wait_phase(kube, namespace, "strict", "Failed", 150)  # KubeRay: 30 s after the submitter ended
    rayjob = kube.custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", "strict")
    assert rayjob["status"]["reason"] == "JobDeploymentStatusTransitionGracePeriodExceeded"
    failed = condition(st, "Failed")
    assert failed["reason"] == "DashboardUnreachable"
    assert f"NetworkPolicy {namespace}/strict-rayjob" in failed["message"]
    assert "networkPolicy.kuberay" in failed["message"]
    dropped = [r for r in dashboard.requests(namespace=namespace) if r.get("dropped")]
    assert dropped and all(r["path"].startswith("/api/") for r in dropped)


def test_strict_mode_without_a_kuberay_peer_a_service_says_why_while_deploying(kube, dashboard, strict):
    namespace = strict["svc"]
    # KubeRay's PUT of the Serve config is dropped: the slice comes up, no application is reported
    st = kube.wait(lambda: (lambda s: s if condition(s, "Ready").get("reason") == "DashboardUnreachable" else None)(
        kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "tputorchservices", "chat").get("status") or {}),
        120, "the service's Ready condition naming the network")
    assert st["phase"] == "Deploying" and f"NetworkPolicy {namespace}/chat-ray" in st["message"]
    serve_api = kube.wait(lambda: [r for r in dashboard.requests(namespace=namespace)
                                   if r["path"].startswith("/api/serve/")], 60, "KubeRay's Serve API calls")
    assert all(r.get("dropped") for r in serve_api), serve_api[-3:]  # every one dropped


class _Kube:
    """The API server as network.Network reads it: a namespace's policies, namespaces."""

    def __init__(self, policies):
        self.policies, self.reads = policies, 0

    def get(self, path):
        self.reads += 1
        if path.endswith("/networkpolicies"):
            return {"items": self.policies}
        return {"metadata": {"labels": {}}}


def test_the_stand_in_asks_cyclonus_once_per_policy_set_and_flow():
    strict = network_policy(spec.parse({**job("a"), "metadata": {"name": "a", "namespace": "ml"}}),
                                   NetworkPolicyConfig("strict"))
    other = network_policy(spec.parse({**job("b"), "metadata": {"name": "b", "namespace": "ml"}}),
                                  NetworkPolicyConfig())
    net = network.Network(_Kube([strict, other]), log=lambda _: None)
    head = {"metadata": {"name": "a-head", "namespace": "ml", "labels": {JOB_LABEL: "a", "ray.io/cluster": "a-x"}}}
    assert net.enforce
    assert net.admits("kuberay", head, 8265) is False  # strict, KubeRay hosted: dropped
    assert net.admits("kuberay", head, 8265) is False and net.asked == 1  # the cache answered
    net.control("PUT", {"identities": {"kuberay": {"namespace": "ml", "labels": {JOB_LABEL: "a"}}}})
    assert net.admits("kuberay", head, 8265) is True and net.asked == 2  # as one of the cluster's own pods
    # b's (open) policy does not select a's pods: it neither admits nor changes a's verdicts
    unselected = {"metadata": {"name": "c", "namespace": "ml", "labels": {"app": "c"}}}
    assert net.admits("client", unselected, 6379) is True and net.asked == 2
    net.control("PUT", {"enforce": False})
    assert net.admits("client", head, 6379) is True
