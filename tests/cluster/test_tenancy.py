"""One operator, many teams (issue 21), on the local cluster:

- every Ray cluster gets its NetworkPolicy; cyclonus (a real NetworkPolicy engine) decides, for
  the cluster's real pods, what it admits in strict mode: the cluster's own pods on every port,
  KubeRay's and the operator's on the dashboard port only, the metric scraper on 8080 only, pods
  of another namespace (even labelled like the job's) and unlabelled pods of the same namespace on
  none of GCS, client, dashboard, raylet or metrics ports;
- a namespace enforcing the `restricted` Pod Security profile runs a job: the API server admits
  the head, the TPU host and KubeRay's submitter pod;
- a 1,000-deep object is marked Failed alone, a 1 MiB env value and a service asking for 10^6
  replicas are refused at admission, while 50 valid jobs in other namespaces keep reconciling.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import yaml

from namespaces import delete_namespace, make_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)

from tputorch.render.names import JOB_LABEL
from tputorch.controller.rest import decode

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
from fakedash import network  # noqa: E402  (cyclonus, the NetworkPolicy engine of the local chain)

GROUP, VERSION = "tputorch.io", "v1alpha1"
NS_NAME_LABEL = "kubernetes.io/metadata.name"
KUBERAY_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
OPERATOR_LABELS = {"app.kubernetes.io/name": "tputorch-operator", "app.kubernetes.io/instance": "tputorch"}


def job(name: str, suspend: bool = True, **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-torch-tpu:2.60.0",
                     "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
                     "worker": {"cpu": "4", "memory": "16Gi"}, "suspend": suspend, **spec}}


def apply(kube, namespace: str, text: str, check: bool = True):
    return kubectl(kube.kubeconfig, "apply", "-n", namespace, "-f", "-", input=text, check=check)


# --- NetworkPolicy verdicts: cyclonus, the engine the stand-in dashboard asks (hack/fakedash/network.py) --

def _selects(selector: dict, labels: dict) -> bool:
    """A matchLabels selector (the operator's policies use no other form) selects ``labels``."""
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def verdicts(policy: dict, flows: list[tuple[dict, dict, dict, int]]) -> list[bool]:
    """Whether ``policy`` admits each (source pod, its namespace's labels, destination pod, port), as
    cyclonus decides."""
    binary = network.cyclonus_binary()
    assert binary, "no cyclonus binary: hack/build.sh cyclonus"
    dst_ns = policy["metadata"]["namespace"]

    def end(pod, ns_labels):
        return {"Internal": {"PodLabels": pod["metadata"].get("labels") or {}, "NamespaceLabels": ns_labels,
                             "Namespace": pod["metadata"]["namespace"]}, "IP": "10.8.0.9"}
    traffic = [{"Source": end(src, src_ns), "Destination": end(dst, {NS_NAME_LABEL: dst_ns}), "Protocol": "TCP",
                "ResolvedPort": port} for src, src_ns, dst, port in flows]
    clean = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
             "metadata": {"name": policy["metadata"]["name"], "namespace": dst_ns}, "spec": policy["spec"]}
    return network.query(binary, [clean], traffic)


def stand_in_pod(kube, namespace: str, name: str, labels: dict) -> dict:
    """A pod that exists in the API (KWOK runs it on a CPU node) standing for KubeRay, the operator
    or an intruder."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"nodeSelector": {"type": "kwok"}, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "c", "image": "example.com/pause"}]}}
    apply(kube, namespace, yaml.safe_dump(body))
    return kube.core.read_namespaced_pod(name, namespace).to_dict()


@pytest.fixture
def peer_namespaces(kube):
    names = {role: make_namespace(kube, f"{role}-{uuid.uuid4().hex[:5]}")
             for role in ("kuberay", "operator", "other", "scraper")}
    yield names
    for name in names.values():
        delete_namespace(kube, name, wait=False)


def test_each_ray_cluster_is_closed_to_other_tenants(kube, tputorch_crd, namespace, peer_namespaces, tmp_path):
    kuberay_ns, operator_ns, other_ns = peer_namespaces["kuberay"], peer_namespaces["operator"], peer_namespaces["other"]
    scraper_ns = peer_namespaces["scraper"]
    peers = [f"{kuberay_ns}:" + ",".join(f"{k}={v}" for k, v in KUBERAY_LABELS.items()),
             f"{operator_ns}:" + ",".join(f"{k}={v}" for k, v in OPERATOR_LABELS.items())]
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [namespace],
                         extra_args=["--network-policy-mode", "strict", "--network-policy-metrics-peer", scraper_ns,
                                     *(a for p in peers for a in ("--network-policy-peer", p))]).start()
    try:
        apply(kube, namespace, yaml.safe_dump(job("closed", suspend=False)))
        policy = kube.wait(lambda: kube.custom.get_namespaced_custom_object(
            "networking.k8s.io", "v1", namespace, "networkpolicies", "closed-rayjob"), 60, "the NetworkPolicy")
        ttj = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "tputorchjobs", "closed")
        (owner,) = policy["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"]) == (ttj["metadata"]["uid"], True)
        ray_pods = kube.wait(lambda: (lambda pods: pods if len(pods) >= 2 else None)(
            kube.core.list_namespaced_pod(namespace, label_selector=f"{JOB_LABEL}=closed").to_dict()["items"]),
            120, "the head and the TPU host")
        kuberay = stand_in_pod(kube, kuberay_ns, "kuberay-operator", KUBERAY_LABELS)
        operator_pod = stand_in_pod(kube, operator_ns, "tputorch-operator", OPERATOR_LABELS)
        intruder = stand_in_pod(kube, other_ns, "intruder", {JOB_LABEL: "closed", **KUBERAY_LABELS})
        neighbour = stand_in_pod(kube, namespace, "neighbour", {"app": "notebook"})
        scraper = stand_in_pod(kube, scraper_ns, "collector", {"app.kubernetes.io/name": "collector"})
        ns_labels = {n: kube.core.read_namespace(n).metadata.labels
                     for n in (namespace, kuberay_ns, operator_ns, other_ns, scraper_ns)}

        selector = policy["spec"]["podSelector"]
        assert all(_selects(selector, p["metadata"]["labels"]) for p in ray_pods)  # every Ray pod is covered
        assert not _selects(selector, neighbour["metadata"]["labels"])

        head = next(p for p in ray_pods if p["metadata"]["labels"].get("ray.io/node-type") == "head")
        raylet = 43215  # a raylet / object-manager port (Ray picks them at random)
        cases = [(p, 6379, True) for p in ray_pods] + [(p, 8265, True) for p in ray_pods] + \
            [(p, 10001, True) for p in ray_pods] + [(p, raylet, True) for p in ray_pods]
        cases += [(x, port, False) for x in (intruder, neighbour) for port in (6379, 8265, 10001, raylet, 8080)]
        cases += [(peer, 8265, True) for peer in (kuberay, operator_pod)]
        cases += [(peer, port, False) for peer in (kuberay, operator_pod) for port in (6379, 10001, raylet, 8080)]
        cases += [(scraper, 8080, True), (scraper, 8265, False), (scraper, 6379, False)]
        got = verdicts(policy, [(src, ns_labels[src["metadata"]["namespace"]], head, port) for src, port, _ in cases])
        wrong = [(src["metadata"]["namespace"], src["metadata"]["name"], port, want)
                 for (src, port, want), have in zip(cases, got) if have != want]
        assert not wrong, wrong  # (source namespace, pod, port, expected verdict)
        assert "Traceback" not in op.log()
    finally:
        op.stop()


def test_a_restricted_namespace_runs_a_job(kube, tputorch_crd, tmp_path):
    ns = make_namespace(kube, f"restricted-{uuid.uuid4().hex[:5]}",
                        {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"})
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log", [ns]).start()
    try:
        # The profile is on: a pod with no securityContext is refused.
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"},
                "spec": {"containers": [{"name": "c", "image": "example.com/pause"}]}}
        refused = apply(kube, ns, yaml.safe_dump(bare), check=False)
        assert refused.returncode != 0 and "restricted" in refused.stderr, refused.stderr
        apply(kube, ns, yaml.safe_dump(job("strict", suspend=False)))
        pods = kube.wait(lambda: (lambda items: items if len(items) >= 2 else None)(
            kube.core.list_namespaced_pod(ns, label_selector=f"ray.io/cluster").to_dict()["items"]),
            120, "the head and the TPU host admitted")
        assert {p["metadata"]["labels"].get("ray.io/node-type") for p in pods} >= {"head", "worker"}
        st = kube.wait(lambda: (lambda s: s if s.get("phase") == "Running" else None)(
            kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, "tputorchjobs", "strict").get("status") or {}),
            120, "the job Running")
        assert st["readyHosts"] == st["hosts"] == 1
        submitter = kube.wait(lambda: kube.core.list_namespaced_pod(ns, label_selector="job-name=strict").items,
                              120, "KubeRay's submitter pod admitted")
        assert submitter[0].spec.containers[0].security_context.allow_privilege_escalation is False
        events = kube.core.list_namespaced_event(ns).items
        assert not [e.message for e in events if "violates PodSecurity" in (e.message or "")]
    finally:
        op.stop()
        delete_namespace(kube, ns)
    assert "Traceback" not in op.log(), op.log()[-3000:]


DEPTH = 1000


def test_hostile_objects_fail_alone_while_50_jobs_in_other_namespaces_reconcile(kube, tputorch_crd, tmp_path):
    hostile = make_namespace(kube, f"hostile-{uuid.uuid4().hex[:5]}")
    teams = [make_namespace(kube, f"team-{i}-{uuid.uuid4().hex[:5]}") for i in range(5)]
    op = OperatorProcess(kube.kubeconfig, tmp_path / "operator.log").start()  # every namespace
    try:
        deep = yaml.safe_dump(job("deep", runtimeEnv="DEEP")).replace("DEEP", "{a: " * DEPTH + "x" + "}" * DEPTH)
        apply(kube, hostile, deep)
        huge = apply(kube, hostile, yaml.safe_dump(job("huge-env", env=[{"name": "X", "value": "v" * (1 << 20)}])), check=False)
        assert huge.returncode != 0 and "spec.env[0].value" in huge.stderr, huge.stderr[-2000:]
        service = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": "million"},
                   "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm:2.60.0",
                            "model": {"source": "Qwen/Qwen3-0.6B"}, "replicas": {"min": 1, "max": 10**6}}}
        million = apply(kube, hostile, yaml.safe_dump(service), check=False)
        assert million.returncode != 0 and "spec.replicas.max" in million.stderr, million.stderr[-2000:]

        for i, team in enumerate(teams):
            apply(kube, team, "---\n".join(yaml.safe_dump(job(f"job-{j}")) for j in range(10)))

        def status(ns, name, plural="tputorchjobs"):
            resp = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name, _preload_content=False)
            return decode(resp.data).get("status") or {}

        st = kube.wait(lambda: (lambda s: s if s.get("phase") == "Failed" else None)(status(hostile, "deep")), 60, "deep Failed")
        assert "spec.runtimeEnv: must be nested at most 32 levels deep" in st["message"]

        def all_suspended():
            done = [(t, f"job-{j}") for t in teams for j in range(10) if status(t, f"job-{j}").get("phase") == "Suspended"]
            return len(done) == 50 or None
        kube.wait(all_suspended, 180, "the 50 jobs reconciled (Suspended, RayJob created)")
        rayjobs = sum(len(kube.custom.list_namespaced_custom_object("ray.io", "v1", t, "rayjobs")["items"]) for t in teams)
        assert rayjobs == 50
        assert not kube.custom.list_namespaced_custom_object("ray.io", "v1", hostile, "rayjobs")["items"]
        # A change after the hostile object still reaches the operator (its watch is alive).
        kubectl(kube.kubeconfig, "-n", teams[0], "patch", "tputorchjob", "job-0", "--type=merge", "-p", '{"spec":{"suspend":false}}')
        kube.wait(lambda: not kube.custom.get_namespaced_custom_object("ray.io", "v1", teams[0], "rayjobs", "job-0")["spec"]["suspend"],
                  60, "job-0 resumed through the operator")
        assert op.proc.poll() is None
        assert "Traceback" not in op.log() and "RecursionError" not in op.log(), op.log()[-5000:]
    finally:
        op.stop()
        for ns in [hostile, *teams]:
            delete_namespace(kube, ns, wait=False)
        for ns in [hostile, *teams]:
            delete_namespace(kube, ns)
