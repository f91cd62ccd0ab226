"""Fuzz (hypothesis) of the CRD schema + CEL, `tputorch validate` (the parser) and render against
the real API server: generated TPUTorchJobs and TPUTorchServices, mostly valid with one field broken
by arbitrary JSON (tests/unit/test_properties.py's generators). For each:

- the parser never raises anything but InvalidSpec (what `tputorch validate` prints);
- the API server answers the object's dry-run create with admitted or a 4xx naming a field;
- whatever both admit renders into a child that the API server takes too (dry-run create of the
  RayJob / RayService under KubeRay's CRDs, and of the NetworkPolicy), and into pods it takes (a
  dry-run Pod from the head's, the TPU host's and the submitter's template: env, tolerations,
  resources, securityContext are checked there, where a bad one would stop KubeRay for ever).

CI runs TPUTORCH_FUZZ_EXAMPLES (default 25) examples per kind; a longer run by hand:
TPUTORCH_FUZZ_EXAMPLES=5000 pytest tests/cluster/test_fuzz_admission.py
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from kubernetes.client.rest import ApiException

from namespaces import delete_namespace, make_namespace
from operator_process import tputorch_crd  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the unit tests' generators
from unit.test_properties import broken, job_bodies, service_bodies  # noqa: E402

from tputorch import render  # noqa: E402
from tputorch.api.network import Peer
from tputorch.render.network import NetworkPolicyConfig, network_policy
from tputorch.api import spec  # noqa: E402

EXAMPLES = int(os.environ.get("TPUTORCH_FUZZ_EXAMPLES", "25"))
GROUP, VERSION = "tputorch.io", "v1alpha1"
SEEN: Counter = Counter()


@pytest.fixture(scope="module")
def fuzz_ns(kube, tputorch_crd):
    name = make_namespace(kube, f"fuzz-{uuid.uuid4().hex[:5]}")
    yield name
    delete_namespace(kube, name, wait=False)
    print(f"\nfuzz: {dict(SEEN)}")


def _dry_run(kube, group: str, version: str, plural: str, namespace: str, body: dict):
    """None when admitted, else the API server's message."""
    try:
        if group == "":
            kube.core.create_namespaced_pod(namespace, body, dry_run="All")
        else:
            kube.custom.create_namespaced_custom_object(group, version, namespace, plural, body, dry_run="All")
    except ApiException as err:
        assert 400 <= err.status < 500, (err.status, err.body)
        return err.body or err.reason
    return None


def _pod(template: dict, name: str) -> dict:
    """A Pod of the template. Without its serviceAccountName: whether that account exists is the
    namespace's state (the API server refuses the pod until it does), not something a spec can say."""
    spec_ = json.loads(json.dumps(template["spec"]))
    spec_.pop("serviceAccountName", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": (template.get("metadata") or {}).get("labels") or {}},
            "spec": spec_}


def _check(kube, namespace: str, body: dict) -> None:
    body = json.loads(json.dumps(body))
    body["apiVersion"] = f"{GROUP}/{VERSION}"
    body["metadata"] = {**(body.get("metadata") if isinstance(body.get("metadata"), dict) else {}), "namespace": namespace}
    try:
        parsed = spec.parse_any(body)
    except spec.InvalidSpec as err:
        assert err.errors and all(str(e).startswith(e.path + ": ") for e in err.errors)
        parsed = None
    try:
        json.dumps(body, allow_nan=False)
    except ValueError:
        SEEN["not JSON (NaN/inf): parser only"] += 1
        return
    plural = "tputorchservices" if body.get("kind") == "TPUTorchService" else "tputorchjobs"
    refused = _dry_run(kube, GROUP, VERSION, plural, namespace, body)
    SEEN[f"parser {'ok' if parsed else 'refused'}, API server {'refused' if refused else 'ok'}"] += 1
    if parsed is None or refused is not None:
        return
    child = render.render_any(parsed)
    child["metadata"]["namespace"] = namespace
    is_service = child["kind"] == "RayService"
    assert _dry_run(kube, "ray.io", "v1", "rayservices" if is_service else "rayjobs", namespace, child) is None, child
    policy = network_policy(parsed, NetworkPolicyConfig(
        "strict", (Peer("kuberay", (("app", "kuberay"),)), Peer(cidr="10.128.0.0/20")),
        (Peer("gmp-system"),)))
    assert _dry_run(kube, "networking.k8s.io", "v1", "networkpolicies", namespace, policy) is None
    cluster = child["spec"]["rayClusterConfig" if is_service else "rayClusterSpec"]
    templates = {"head": cluster["headGroupSpec"]["template"], "worker": cluster["workerGroupSpecs"][0]["template"]}
    if not is_service:
        templates["submitter"] = child["spec"]["submitterPodTemplate"]
    for role, template in templates.items():
        problem = _dry_run(kube, "", "v1", "pods", namespace, _pod(template, f"{parsed.name}-{role}"))
        assert problem is None, (role, problem)
    SEEN["children and pods admitted"] += 1


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(body=broken(job_bodies()))
def test_jobs_admitted_by_both_render_children_the_api_server_takes(kube, fuzz_ns, body):
    _check(kube, fuzz_ns, body)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(body=broken(service_bodies()))
def test_services_admitted_by_both_render_children_the_api_server_takes(kube, fuzz_ns, body):
    _check(kube, fuzz_ns, body)


def test_the_fuzz_reached_every_outcome_that_matters():
    """Runs after the two above (file order): the generators produced admitted objects whose
    children were checked, and objects refused."""
    assert SEEN["children and pods admitted"] > 0, SEEN
    assert sum(n for k, n in SEEN.items() if "refused" in k) > 0, SEEN
