"""Hostile and malformed TPUTorchJobs at the API server.

Each case is either refused at admission (the CRD's schema/CEL rules: `kubectl apply` fails with a
message naming the field) or admitted and then marked Failed by the operator with a message naming
the field. Through all of it the operator never crashes, stays healthy, never logs a Traceback,
a good job created alongside keeps progressing, and children only ever land in the job's namespace.
"""

from __future__ import annotations

import urllib.request
import uuid

import pytest
import yaml

from namespaces import delete_namespace, make_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)

from tputorch.render.names import JOB_LABEL, MANAGED_BY
from tputorch.controller.rest import decode

GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchjobs"
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def good(name: str, **spec_extra) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchJob", "metadata": {"name": name},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-torch-tpu:2.60.0",
                 "entrypoint": "python train.py", "head": {"cpu": "1", "memory": "2Gi"},
                 "worker": {"cpu": "4", "memory": "16Gi"}, "suspend": True, **spec_extra},
    }


def with_(path: str, value):
    """A mutation setting a dotted path (creating dicts on the way)."""
    def mutate(body):
        keys = path.split(".")
        obj = body
        for k in keys[:-1]:
            obj = obj.setdefault(k, {})
        obj[keys[-1]] = value
    return mutate


# (id, mutation, where it must be refused: "crd" | "operator", fragment the message must contain)
CASES = [
    ("topology-wrong-type", with_("spec.tpu.topology", 4), "crd", "spec.tpu.topology"),
    ("accelerator-wrong-type", with_("spec.tpu.accelerator", ["v6e"]), "crd", "spec.tpu.accelerator"),
    ("spec-is-a-string", lambda b: b.update(spec="run it"), "crd", "spec"),
    ("tpu-missing", lambda b: b["spec"].pop("tpu"), "crd", "spec.tpu"),
    ("bad-topology-shape", with_("spec.tpu.topology", "4x4x4x4"), "crd", "spec.tpu.topology"),
    ("topology-not-a-v6e-slice", with_("spec.tpu.topology", "3x3"), "crd", "spec.tpu"),
    ("zero-in-topology", with_("spec.tpu.topology", "0x4"), "crd", "spec.tpu.topology"),
    ("negative-backoff", with_("spec.backoffLimit", -1), "crd", "spec.backoffLimit"),
    ("negative-deadline", with_("spec.activeDeadlineSeconds", -5), "crd", "spec.activeDeadlineSeconds"),
    ("negative-ttl", with_("spec.ttlSecondsAfterFinished", -1), "crd", "spec.ttlSecondsAfterFinished"),
    ("int32-overflow", with_("spec.activeDeadlineSeconds", 2**40), "crd", "spec.activeDeadlineSeconds"),
    ("negative-cpu", with_("spec.worker.cpu", "-4"), "crd", "spec.worker.cpu"),
    ("memory-not-a-quantity", with_("spec.head.memory", "lots"), "crd", "spec.head.memory"),
    ("huge-entrypoint", with_("spec.entrypoint", "x" * 70_000), "crd", "spec.entrypoint"),
    ("huge-image", with_("spec.image", "i" * 5000), "crd", "spec.image"),
    ("empty-entrypoint", with_("spec.entrypoint", ""), "crd", "spec.entrypoint"),
    ("unknown-spec-field", with_("spec.namespace", "kube-system"), "crd", "spec.namespace"),
    ("unknown-tpu-field", with_("spec.tpu.zone", "us-central2-b"), "crd", "spec.tpu.zone"),
    ("suspend-not-bool", with_("spec.suspend", "yes"), "crd", "spec.suspend"),
    ("env-without-name", with_("spec.env", [{"value": "1"}]), "crd", "spec.env[0].name"),
    ("too-many-env", with_("spec.env", [{"name": f"E{i}", "value": "1"} for i in range(300)]), "crd", "spec.env"),
    ("unicode-name", lambda b: b["metadata"].update(name="jöb-ü"), "crd", "metadata.name"),
    ("unicode-label-value", lambda b: b["metadata"].update(labels={"team": "ml✓"}), "crd", "metadata.labels"),
    ("slices-two", with_("spec.tpu.slices", 2), "crd", "spec.tpu.slices"),
    # Admitted by the schema; the operator's validation refuses them (Failed, every error named).
    ("service-account-uppercase", with_("spec.serviceAccountName", "Not_A_Name"), "operator", "spec.serviceAccountName"),
    ("queue-name-not-a-label", with_("spec.queueName", "bad queue!"), "operator", "spec.queueName"),
    ("node-selector-bad-key", with_("spec.nodeSelector", {"bad key/!": "x"}), "operator", "spec.nodeSelector"),
    ("reserved-env-name", with_("spec.env", [{"name": "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "value": "1"}]), "operator", "spec.env[0].name"),
    # Typed schemas where a free-form map was (issue 21): refused at admission now.
    ("toleration-wrong-types", with_("spec.tolerations", [{"key": 5, "effect": ["x"]}]), "crd", "spec.tolerations[0]"),
    ("toleration-operator-unknown", with_("spec.tolerations", [{"operator": "Sometimes"}]), "crd", "spec.tolerations[0].operator"),
    ("toleration-exists-with-value", with_("spec.tolerations", [{"key": "k", "operator": "Exists", "value": "v"}]), "crd", "spec.tolerations[0]"),
    ("toleration-seconds-without-noexecute", with_("spec.tolerations", [{"key": "k", "operator": "Exists", "tolerationSeconds": 5}]), "crd", "spec.tolerations[0]"),
    ("env-value-from-garbage", with_("spec.env", [{"name": "X", "valueFrom": {"nonsense": {"a": 1}}}]), "crd", "spec.env[0].valueFrom"),
    ("env-value-and-value-from", with_("spec.env", [{"name": "X", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]), "crd", "spec.env[0]"),
    ("secret-key-ref-without-key", with_("spec.env", [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}]), "crd", "spec.env[0].valueFrom.secretKeyRef.key"),
    ("env-value-one-mib", with_("spec.env", [{"name": "X", "value": "v" * (1 << 20)}]), "crd", "spec.env[0].value"),
    ("memory-zero", with_("spec.worker.memory", "0"), "crd", "spec.worker.memory"),
    ("runtime-env-not-serialisable-shape", with_("spec.runtimeEnv", {"pip": 5, "env_vars": ["A=1"]}), "crd", "spec.runtimeEnv.env_vars"),
    ("security-context-host-pid", with_("spec.securityContext", {"hostPID": True}), "crd", "spec.securityContext.hostPID"),
    ("replicas-max-a-million", None, "crd", "spec.replicas.max"),  # a TPUTorchService (see service_case)
    # Admitted (the API server takes 10,000 levels in a free-form block); the operator refuses them.
    ("runtime-env-1000-deep", with_("spec.runtimeEnv", "DEEP"), "operator", "spec.runtimeEnv: must be nested at most 32 levels"),
    ("runtime-env-shell", with_("spec.runtimeEnv", {"env_vars": {"A": "$(id)"}}), "operator", "must not contain $ or `"),
    ("runtime-env-over-32k", with_("spec.runtimeEnv", {"pip": ["p" * 100] * 400}), "operator", "spec.runtimeEnv: must be at most 32768 bytes"),
]
DEPTH = 1000


def _dump(body: dict) -> str:
    """YAML of ``body``; a "DEEP" value becomes DEPTH levels of nesting written as flow text (PyYAML's
    emitter and json.dumps both recurse)."""
    text = yaml.safe_dump(body, allow_unicode=True, width=1 << 20)
    return text.replace("DEEP", "{a: " * DEPTH + "x" + "}" * DEPTH)


def service_case(name: str) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": name},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm:2.60.0",
                 "model": {"source": "Qwen/Qwen3-0.6B"}, "replicas": {"min": 1, "max": 10**6}},
    }


@pytest.fixture(scope="module")
def bad_ns(kube, tputorch_crd):
    name = make_namespace(kube, f"bad-input-{uuid.uuid4().hex[:5]}")
    yield name
    delete_namespace(kube, name)


@pytest.fixture(scope="module")
def bad_operator(kube, bad_ns, tmp_path_factory):
    op = OperatorProcess(kube.kubeconfig, tmp_path_factory.mktemp("bad-input") / "operator.log", [bad_ns]).start()
    yield op
    op.stop()


@pytest.fixture(scope="module")
def alongside(kube, bad_ns, bad_operator):
    """A good job created before the hostile ones; unicode in its values is fine."""
    body = good("good-alongside", suspend=False)
    body["spec"]["entrypoint"] = "python train.py --note 'héllo wörld ✓ 日本語'"
    body["spec"]["env"] = [{"name": "GREETING", "value": "grüße ✓"}]
    kubectl(kube.kubeconfig, "apply", "-n", bad_ns, "-f", "-", input=yaml.safe_dump(body, allow_unicode=True))
    return "good-alongside"


def _status(kube, ns, name) -> dict:
    # Read raw and through the operator's bounded decoder: the kubernetes client's json.loads fails
    # on the 1,000-deep object the same way the operator's informer once did.
    resp = kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, _preload_content=False)
    return decode(resp.data).get("status") or {}


def _jobs(kube, ns) -> list[dict]:
    resp = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _preload_content=False)
    return decode(resp.data)["items"]


@pytest.mark.parametrize("case,mutate,where,fragment", CASES, ids=[c[0] for c in CASES])
def test_malformed_job_is_refused_naming_the_field(kube, bad_ns, bad_operator, alongside, case, mutate, where, fragment):
    if mutate is None:
        body = service_case(case)
    else:
        body = good(case)
        mutate(body)
    proc = kubectl(kube.kubeconfig, "apply", "-n", bad_ns, "-f", "-", input=_dump(body), check=False)
    if where == "crd":
        assert proc.returncode != 0, f"the API server admitted {case}"
        assert fragment in proc.stderr, proc.stderr[:2000]
    else:
        assert proc.returncode == 0, proc.stderr[:2000]
        st = kube.wait(lambda: (lambda s: s if s.get("phase") == "Failed" else None)(_status(kube, bad_ns, case)),
                       60, f"{case} Failed")
        assert fragment in st["message"], st["message"]
        validated = next(c for c in st["conditions"] if c["type"] == "Validated")
        assert (validated["status"], validated["reason"]) == ("False", "ValidationFailed")
        rayjobs = kube.custom.list_namespaced_custom_object("ray.io", "v1", bad_ns, "rayjobs",
                                                            label_selector=f"{JOB_LABEL}={case}")["items"]
        assert not rayjobs, "an invalid job must not get a RayJob"
    with _no_proxy.open(f"http://127.0.0.1:{bad_operator.health_port}/healthz", timeout=5) as resp:
        assert resp.status == 200
    assert bad_operator.proc.poll() is None, bad_operator.log()[-3000:]


def test_a_label_cannot_hijack_another_jobs_children(kube, bad_ns, bad_operator):
    body = good("hijacker")
    body["metadata"]["labels"] = {JOB_LABEL: "good-alongside", "app.kubernetes.io/managed-by": "someone-else"}
    kubectl(kube.kubeconfig, "apply", "-n", bad_ns, "-f", "-", input=yaml.safe_dump(body))
    rayjob = kube.wait(lambda: kube.custom.get_namespaced_custom_object("ray.io", "v1", bad_ns, "rayjobs", "hijacker"), 60, "RayJob")
    assert rayjob["metadata"]["labels"][JOB_LABEL] == "hijacker"
    assert rayjob["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY


def test_operator_survived_and_the_good_job_progressed(kube, bad_ns, bad_operator, alongside):
    """Runs after the table (file order): the good job runs, children stay in the namespace, no Traceback."""
    st = kube.wait(lambda: (lambda s: s if s.get("phase") == "Running" else None)(_status(kube, bad_ns, alongside)),
                   180, "the good job Running")
    assert st["rayJobName"] == alongside
    rayjob = kube.custom.get_namespaced_custom_object("ray.io", "v1", bad_ns, "rayjobs", alongside)
    assert rayjob["spec"]["entrypoint"] == "python train.py --note 'héllo wörld ✓ 日本語'"
    uids = {j["metadata"]["uid"] for j in _jobs(kube, bad_ns)}
    children = [r for r in kube.custom.list_cluster_custom_object("ray.io", "v1", "rayjobs")["items"]
                if any(o.get("uid") in uids for o in r["metadata"].get("ownerReferences") or [])]
    assert children and {r["metadata"]["namespace"] for r in children} == {bad_ns}
    assert bad_operator.proc.poll() is None
    log = bad_operator.log()
    assert "Traceback" not in log, log[-5000:]
