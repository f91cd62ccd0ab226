"""docs/concepts/tenancy-and-auth.md's example ValidatingAdmissionPolicy at the real API server: every way around
it the issue found (a group's own image, added capabilities, root, an unconfined seccomp profile, a
service's Hugging Face token Secret) is refused in a namespace it binds, and the examples and their
allowed neighbours are admitted (server-side dry runs: nothing is created)."""

from __future__ import annotations

import copy
import time
import uuid

import pytest
import yaml

from namespaces import delete_namespace, make_namespace
from operator_process import REPO, kubectl, tputorch_crd  # noqa: F401 (fixture)

DOC = REPO / "docs" / "concepts" / "tenancy-and-auth.md"
START = "  apiVersion: admissionregistration.k8s.io/v1\n  kind: ValidatingAdmissionPolicy\n"


def doc_policy() -> str:
    """The policy and its binding as the doc has them (a YAML block indented in a list item)."""
    text = DOC.read_text()
    i = text.index(START)
    return "\n".join(line[2:] for line in text[i:text.index("  ```", i)].splitlines()) + "\n"


def example(path: str, kind: str) -> dict:
    return next(d for d in yaml.safe_load_all((REPO / path).read_text()) if d and d.get("kind") == kind)


JOB = example("examples/v6e-4x4.yaml", "TPUTorchJob")
SERVICE = example("examples/serve/qwen3-moe-v6e-4x4.yaml", "TPUTorchService")
GPU_GROUP = {"name": "gen", "gpu": {"type": "nvidia-l4", "count": 1}}


def job(**spec) -> dict:
    body = copy.deepcopy(JOB)
    body["spec"].update(spec)
    return body


REFUSED = {
    "a group's image from elsewhere": (job(groups=[{**GPU_GROUP, "image": "docker.io/someone/vllm:1"}]), "spec.groups[].image"),
    "added capabilities": (job(securityContext={"capabilities": {"add": ["NET_ADMIN"]}}), "capabilities.add"),
    "root": (job(securityContext={"runAsUser": 0}), "runAsUser must not be 0"),
    "another ServiceAccount": (job(serviceAccountName="admin"), "spec.serviceAccountName must be ray-tpu"),
    "unconfined seccomp": (job(securityContext={"seccompProfile": {"type": "Unconfined"}}), "Unconfined"),
    "a Hugging Face token Secret": (SERVICE, "spec.model.hfTokenSecret"),
}
ADMITTED = {
    "the job example": JOB,
    "a group's image from the project": job(groups=[{**GPU_GROUP, "image": "us-docker.pkg.dev/my-project/rl/vllm:1"}]),
    "a non-root user and RuntimeDefault": job(securityContext={"runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}),
    "the service without a token": {**SERVICE, "spec": {**SERVICE["spec"], "model": {
        k: v for k, v in SERVICE["spec"]["model"].items() if k != "hfTokenSecret"}}},
}


@pytest.fixture(scope="module")
def restricted(kube, tputorch_crd):
    ns = make_namespace(kube, f"vap-{uuid.uuid4().hex[:6]}", labels={"tputorch.io/restricted": "true"})
    kubectl(kube.kubeconfig, "apply", "-f", "-", input=doc_policy())
    try:
        yield ns
    finally:
        kubectl(kube.kubeconfig, "delete", "--ignore-not-found", "validatingadmissionpolicybinding/tputorchjob-limits",
                "validatingadmissionpolicy/tputorchjob-limits")
        delete_namespace(kube, ns, wait=False)


def dry_run(kube, ns: str, body: dict):
    return kubectl(kube.kubeconfig, "create", "--dry-run=server", "-n", ns, "-f", "-", input=yaml.safe_dump(body), check=False)


def test_the_doc_policy_refuses_each_way_around_it(kube, restricted):
    assert "hfTokenSecret" in SERVICE["spec"]["model"], "the service example no longer reads a token: pick another case"
    # a new policy is in force once the API server's informer has it: wait for its first refusal
    # (by the rule the policy always had, so a policy without the new rules fails below, not here)
    body = job(image="docker.io/someone/ray:1")
    deadline = time.monotonic() + 30
    while dry_run(kube, restricted, body).returncode == 0:
        assert time.monotonic() < deadline, "the policy never came into force"
        time.sleep(0.5)
    for case, (body, message) in REFUSED.items():
        out = dry_run(kube, restricted, body)
        assert out.returncode != 0 and "tputorchjob-limits" in out.stderr and message in out.stderr, (case, out.stderr)
    for case, body in ADMITTED.items():
        out = dry_run(kube, restricted, body)
        assert out.returncode == 0, (case, out.stderr)
