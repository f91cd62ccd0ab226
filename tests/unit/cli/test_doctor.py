"""`tputorch doctor`'s checks, over dicts shaped as the API returns them."""

import copy
import json
import pathlib
import re
from datetime import datetime, timedelta, timezone

import pytest

from tputorch import tested_versions
from tputorch.api import crd, spec
from tputorch.cli import doctor
from tputorch.cli.doctor import result as doctor_result, smoke
from tputorch.cli.doctor.cluster import MIN_KUBERNETES, check_kubernetes, lease_names
from tputorch.cli.doctor.kuberay import kuberay_version, representative_children, unserved_fields
from tputorch.cli.doctor.kueue import KUEUE_LOCALQUEUE_CRD, check_kueue, kueue_frameworks, kueue_quota_check
from tputorch.cli.doctor.pools import check_placement, check_pools, pools_table
from tputorch.cli.doctor.result import FAIL, OK, UNKNOWN, WARN, Unread
from tputorch.cli.doctor.rights import GCS_FUSE_DRIVER, RIGHTS, check_gcsfuse, check_rights

ROOT = pathlib.Path(__file__).resolve().parents[3]
NOW = datetime(2026, 12, 2, 5, 0, 0, tzinfo=timezone.utc)


def statuses(results):
    return {r.check: r.status for r in results}


def ts(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- fixtures as dicts

def node(name, pool, accel="tpu-v6e-slice", topo="4x4", machine="ct6e-standard-4t", ready=True, **labels):
    return {"metadata": {"name": name, "labels": {
                "cloud.google.com/gke-nodepool": pool, "cloud.google.com/gke-tpu-accelerator": accel,
                "cloud.google.com/gke-tpu-topology": topo, **({"node.kubernetes.io/instance-type": machine} if machine else {}),
                **labels}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pool(name, n, **kw):
    return [node(f"{name}-{i}", name, **kw) for i in range(n)]


def schema_for(body: dict, drop: str | None = None) -> dict:
    """A structural schema that has exactly what body has (minus the dotted path `drop`)."""
    def build(value, path):
        if isinstance(value, dict):
            return {"type": "object", "properties": {k: build(v, f"{path}.{k}".lstrip(".")) for k, v in value.items()
                                                      if f"{path}.{k}".lstrip(".") != drop}}
        if isinstance(value, list):
            merged = {}
            for item in value:
                if isinstance(item, dict):
                    merged = deep_merge(merged, item)
            return {"type": "array", "items": build(merged if merged else (value[0] if value else ""), f"{path}[]")}
        return {"type": "string"}
    return build(body, "")


def deep_merge(a, b):
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **{k: deep_merge(a.get(k), v) for k, v in b.items()}}
    if isinstance(a, list) and isinstance(b, list):
        return [deep_merge(x, y) for x, y in zip(a + b, b + a)][:max(len(a), len(b))] if a and b else a or b
    return b


def kuberay_crd(schema: dict) -> dict:
    return {"spec": {"versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}]}}


def healthy_facts() -> dict:
    children = representative_children()
    crds = {c["metadata"]["name"]: copy.deepcopy(c) for c in crd.crd()}
    crds["rayjobs.ray.io"] = kuberay_crd(schema_for(children["RayJob"][0]))
    crds["rayservices.ray.io"] = kuberay_crd(schema_for(children["RayService"][0]))
    crds["rayclusters.ray.io"] = kuberay_crd({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    crds[KUEUE_LOCALQUEUE_CRD] = None
    return {
        "namespace": "team-a", "user": "alice",
        "version": {"major": "1", "minor": "33", "gitVersion": "v1.33.5-gke.1080000"},
        "crds": crds,
        "operator_deployments": [{"metadata": {"namespace": "tputorch-system", "name": "tputorch-operator"},
                                  "spec": {"replicas": 2, "template": {"spec": {"containers": [{
                                      "image": "op:1", "args": ["run", "--leader-elect"]}]}}},
                                  "status": {"readyReplicas": 2}}],
        "kuberay_deployments": [{"metadata": {"namespace": "kuberay-system", "name": "kuberay-operator"},
                                 "spec": {"template": {"spec": {"containers": [{"image": "kuberay/operator:v1.6.2"}]}}}}],
        "lease": {"metadata": {"namespace": "tputorch-system", "name": "tputorch-operator"},
                  "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15, "renewTime": ts(3)}},
        "mutating_webhooks": [{"metadata": {"name": "ray-tpu-webhook-mutation"},
                               "webhooks": [{"rules": [{"resources": ["pods"]}]}]}],
        "validating_webhooks": [{"metadata": {"name": "ray-tpu-webhook-validation"}}],
        "nodes": pool("tpu-v6e-4x4", 4) + pool("v6e-2x2-spot", 1, topo="2x2", **{"cloud.google.com/gke-spot": "true"}),
        "kube_system_pods": [{"metadata": {"name": "anetd-x7k2p"}}, {"metadata": {"name": "kube-dns-1"}}],
        "kueue_installed": False, "kueue_config": None, "kueue_deployment": None,
        "local_queues": {"team-a": []}, "quotas": {"team-a": []},
        "gcsfuse_driver": {"metadata": {"name": GCS_FUSE_DRIVER}},
        "rights": {r: True for r in RIGHTS},
        "specs": None,
    }


def test_a_healthy_cluster_fails_nothing():
    results = doctor.run_checks(healthy_facts(), NOW)
    assert doctor.exit_code(results) == 0, [r.message for r in results if r.status == FAIL]
    got = statuses(results)
    assert got["kubernetes"] == OK and got["operator"] == OK and got["operator-lease"] == OK
    assert got["kuberay-crd/rayjobs.ray.io"] == OK and got["kuberay-crd/rayservices.ray.io"] == OK
    assert got["tpu-webhook"] == OK and got["tpu-pools"] == OK and got["rights"] == OK
    assert got["network-policy"] == UNKNOWN  # a heuristic never says ✓
    assert got["operator-policy"] == OK


def test_every_doc_link_names_a_heading_that_exists():
    def anchor(heading):  # GitHub's: lower case, punctuation dropped, spaces to dashes
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    links = {v for module in (doctor_result, smoke) for k, v in vars(module).items() if k.startswith("DOC_")}
    assert links
    for link in links:
        path, _, frag = link.partition("#")
        text = (ROOT / path).read_text()
        anchors = {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}
        assert frag in anchors, f"{link}: no such heading in {path}"


def test_the_minimum_kubernetes_is_the_one_compatibility_md_states():
    text = (ROOT / "docs" / "compatibility.md").read_text()
    m = re.search(r"^\| Kubernetes \(the chart, the CRDs' CEL rules\) \| (\d+)\.(\d+) or later", text, re.M)
    assert m and (int(m.group(1)), int(m.group(2))) == MIN_KUBERNETES


@pytest.mark.parametrize("git,status", [("v1.28.9", FAIL), ("v1.29.0", OK), ("v1.34.4-gke.1", OK), ("weird", UNKNOWN)])
def test_kubernetes_version(git, status):
    (result,) = check_kubernetes({"major": "", "minor": "", "gitVersion": git})
    assert result.status == status
    if status == FAIL:
        assert "1.29" in result.fix and result.doc


def test_an_unread_fact_is_unknown_never_ok():
    (result,) = check_kubernetes(Unread("no answer within 10 s"))
    assert result.status == UNKNOWN and "no answer within 10 s" in result.message
    facts = healthy_facts()
    for key in ("nodes", "mutating_webhooks", "operator_deployments", "kube_system_pods", "gcsfuse_driver"):
        facts[key] = Unread("forbidden")
    facts["rights"] = {r: Unread("x") for r in RIGHTS}
    got = statuses(doctor.run_checks(facts, NOW))
    for check in ("tpu-pools", "tpu-webhook", "operator", "network-policy", "gcsfuse", "rights"):
        assert got[check] == UNKNOWN, check


# ---------------------------------------------------------------- our CRDs

def test_a_missing_or_different_tputorch_crd_fails_naming_where():
    facts = healthy_facts()
    facts["crds"][crd.NAME] = None
    changed = copy.deepcopy(facts["crds"][crd.SERVICE_NAME])
    del changed["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["image"]
    facts["crds"][crd.SERVICE_NAME] = changed
    results = {r.check: r for r in doctor.run_checks(facts, NOW)}
    assert results[f"crd/{crd.NAME}"].status == FAIL and "not installed" in results[f"crd/{crd.NAME}"].message
    diff = results[f"crd/{crd.SERVICE_NAME}"]
    assert diff.status == FAIL and "properties.spec.properties.image" in diff.message
    assert "tputorch crd" in diff.fix


# ---------------------------------------------------------------- the operator

def test_operator_stopped_or_lease_stale_fails():
    facts = healthy_facts()
    facts["operator_deployments"][0]["spec"]["replicas"] = 0
    facts["operator_deployments"][0]["status"] = {}
    facts["lease"]["spec"]["renewTime"] = ts(120)
    results = {r.check: r for r in doctor.run_checks(facts, NOW)}
    assert results["operator"].status == FAIL and "0 of 0" in results["operator"].message
    assert results["operator-lease"].status == FAIL and "120 s ago" in results["operator-lease"].message


def test_an_operator_outside_a_deployment_is_a_warning_when_it_holds_the_lease():
    facts = healthy_facts()
    facts["operator_deployments"] = []
    assert statuses(doctor.run_checks(facts, NOW))["operator"] == WARN
    facts["lease"]["spec"]["renewTime"] = ts(60)
    assert statuses(doctor.run_checks(facts, NOW))["operator"] == FAIL


# ---------------------------------------------------------------- KubeRay

def test_a_kuberay_crd_without_a_field_the_operator_writes_fails_naming_it():
    facts = healthy_facts()
    rayjob = representative_children()["RayJob"][0]
    facts["crds"]["rayjobs.ray.io"] = kuberay_crd(schema_for(rayjob, drop="spec.rayClusterSpec.authOptions.secretName"))
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["kuberay-crd/rayjobs.ray.io"]
    assert result.status == FAIL and result.details == ["spec.rayClusterSpec.authOptions.secretName"]
    assert "1.6.1" in result.fix and result.doc.endswith("#kuberay")


def test_the_children_checked_carry_the_optional_fields_the_operator_writes():
    children = representative_children()
    cluster = children["RayJob"][0]["spec"]["rayClusterSpec"]
    assert cluster["authOptions"]["secretName"]
    assert any("labels" in g for g in cluster["workerGroupSpecs"])
    assert children["RayService"][0]["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    # spec.serve.clusterDeletionDelaySeconds (issue 37): KubeRay 1.4 and older lack the field.
    assert children["RayService"][0]["spec"]["rayClusterDeletionDelaySeconds"] == 600
    # spec.exposure.serveService (issue 37) becomes the RayService's serveService, its type and
    # load balancer fields included, so a CRD that prunes any of them is named.
    served = children["RayService"][0]["spec"]["serveService"]
    assert served["spec"]["type"] == "LoadBalancer" and served["spec"]["loadBalancerSourceRanges"]
    assert served["metadata"]["annotations"]


@pytest.mark.parametrize("field", ["spec.serveService", "spec.rayClusterDeletionDelaySeconds"])
def test_a_rayservice_crd_without_a_serving_field_fails_naming_it(field):
    facts = healthy_facts()
    rayservice = representative_children()["RayService"][0]
    facts["crds"]["rayservices.ray.io"] = kuberay_crd(schema_for(rayservice, drop=field))
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["kuberay-crd/rayservices.ray.io"]
    assert result.status == FAIL and result.details == [field]


def test_unserved_fields_follow_lists_maps_and_preserved_subtrees():
    schema = {"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}},
        "m": {"type": "object", "additionalProperties": {"type": "string"}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}
    body = {"a": [{"x": "1"}, {"x": "2", "y": 3}, {"y": 4}], "m": {"k": "v"}, "free": {"any": {"thing": 1}}, "z": 1}
    assert unserved_fields(body, schema) == ["a[].y", "z"]


def test_missing_kuberay_crd_and_known_bad_version():
    facts = healthy_facts()
    facts["crds"]["rayservices.ray.io"] = None
    facts["kuberay_deployments"][0]["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/kuberay/operator:v1.6.0"
    got = statuses(doctor.run_checks(facts, NOW))
    assert got["kuberay-crd/rayservices.ray.io"] == FAIL
    assert got["kuberay-version"] == WARN  # without Kueue's RayService integration: only a warning
    facts["kueue_installed"] = True
    facts["kueue_config"] = {"data": {"controller_manager_config.yaml":
                                      "integrations:\n  frameworks: [ray.io/rayjob, ray.io/rayservice]\n"}}
    assert statuses(doctor.run_checks(facts, NOW))["kuberay-version"] == FAIL


@pytest.mark.parametrize("image,version", [
    ("kuberay/operator:v1.6.2", "1.6.2"),
    ("quay.io/kuberay/operator:v1.6.0@sha256:" + "a" * 64, "1.6.0"),  # tag and digest: the tag
    ("quay.io/kuberay/operator@sha256:" + "a" * 64, None),  # by digest alone: no version
    ("localhost:5000/kuberay/operator", None),  # a registry's port is no tag
])
def test_kuberay_version_from_the_image(image, version):
    deployment = {"spec": {"template": {"spec": {"containers": [{"image": image}]}}}}
    assert kuberay_version([deployment]) == version


def test_no_kuberay_deployment_as_on_gkes_add_on_is_unknown_and_says_why():
    facts = healthy_facts()
    facts["kuberay_deployments"] = []
    (result,) = [r for r in doctor.run_checks(facts, NOW) if r.check == "kuberay-version"]
    assert result.status == UNKNOWN
    assert "GKE's Ray Operator add-on runs KubeRay outside the cluster" in result.message
    assert "KubeRay 1.6.0, 1.7.0 not ruled out" in result.message
    facts["kuberay_deployments"] = [{"spec": {"template": {"spec": {"containers": [{"image": "kuberay/operator@sha256:1"}]}}}}]
    (result,) = [r for r in doctor.run_checks(facts, NOW) if r.check == "kuberay-version"]
    assert result.status == UNKNOWN and "no version tag" in result.message


def _image(facts: dict, image: str) -> None:
    facts["kuberay_deployments"][0]["spec"]["template"]["spec"]["containers"][0]["image"] = image


def test_a_kuberay_other_than_the_tested_ones_is_a_warning_naming_them():
    facts = healthy_facts()
    (tested,) = tested_versions.KUBERAY[:1]
    _image(facts, f"quay.io/kuberay/operator:v{tested}")
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["kuberay-version"]
    assert result.status == OK and result.message == f"KubeRay {tested} (tested)"
    _image(facts, "quay.io/kuberay/operator:v1.5.1")
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["kuberay-version"]
    assert result.status == WARN and result.doc.endswith("compatibility.md#kuberay")
    assert result.message == ("KubeRay 1.5.1: not a version this release was tested with "
                              f"(tested: {tested_versions.shown(tested_versions.KUBERAY)})")
    assert doctor.exit_code([result]) == 0  # a warning: the operator may still work there
    _image(facts, "quay.io/kuberay/operator:v1.6.0")  # known bad: its own message, the tested ones in the fix
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["kuberay-version"]
    assert "kuberay#4686" in result.message and f"tested: {tested}" in result.fix


def test_kuberay_1_7_0_fails_where_kueue_queues_services_and_warns_elsewhere():
    """Run on the local chain: with KubeRay 1.7.0 a RayService Kueue 0.19.1 admitted never starts."""
    facts = healthy_facts()
    _image(facts, "quay.io/kuberay/operator:v1.7.0")
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["kuberay-version"]
    assert result.status == WARN and "admitted but never starts" in result.message
    assert result.fix.startswith("queue only TPUTorchJobs on this KubeRay, or run KubeRay 1.6.2")
    facts["kueue_installed"] = True
    facts["kueue_config"] = {"data": {"controller_manager_config.yaml":
                                      "integrations:\n  frameworks: [ray.io/rayjob, ray.io/rayservice]\n"}}
    assert statuses(doctor.run_checks(facts, NOW))["kuberay-version"] == FAIL


def kueue_deployment(image: str) -> dict:
    return {"metadata": {"namespace": "kueue-system", "name": "kueue-controller-manager"},
            "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}}}


def kueue_version_result(deployment) -> doctor_result.Result:
    facts = healthy_facts()
    facts["kueue_installed"] = True
    facts["kueue_deployment"] = deployment
    (result,) = [r for r in doctor.run_checks(facts, NOW) if r.check == "kueue-version"]
    return result


@pytest.mark.parametrize("version", ["0.20.0", "0.20.3", "0.20.5"])
def test_kueue_0_20_0_to_0_20_5_fails_for_its_workload_watch_cache_failure(version):
    result = kueue_version_result(kueue_deployment(f"registry.k8s.io/kueue/kueue:v{version}"))
    assert result.status == FAIL
    assert result.message.startswith(f"Kueue {version}: ") and "kueue#18411" in result.message
    assert "0.20.6 or later" in result.fix and f"tested: {tested_versions.shown(tested_versions.KUEUE)}" in result.fix
    assert result.doc == "docs/compatibility.md#kueue"


@pytest.mark.parametrize("version", ["0.20.6", "0.19.0", "0.21.0"])
def test_a_kueue_other_than_the_tested_ones_is_a_warning_naming_them(version):
    result = kueue_version_result(kueue_deployment(f"registry.k8s.io/kueue/kueue:v{version}@sha256:" + "a" * 64))
    assert result.status == WARN
    assert result.message == (f"Kueue {version}: not a version this release was tested with "
                              f"(tested: {tested_versions.shown(tested_versions.KUEUE)})")


def test_a_tested_kueue_is_ok_and_an_unknown_one_not_ruled_out():
    (tested,) = tested_versions.KUEUE[:1]
    result = kueue_version_result(kueue_deployment(f"registry.k8s.io/kueue/kueue:v{tested}"))
    assert result.status == OK and result.message == f"Kueue {tested} (tested)"
    for deployment, why in ((None, "no Deployment kueue-system/kueue-controller-manager"),
                            (kueue_deployment("registry.k8s.io/kueue/kueue@sha256:" + "a" * 64), "no version tag")):
        result = kueue_version_result(deployment)
        assert result.status == UNKNOWN and why in result.message and "0.20.0 to 0.20.5 not ruled out" in result.message
    result = kueue_version_result(Unread("timed out"))
    assert result.status == UNKNOWN and "timed out" in result.message


def elastic_results(config_text: str | None, image: str = "registry.k8s.io/kueue/kueue:v0.19.1") -> list:
    facts = healthy_facts()
    facts["kueue_installed"] = True
    facts["kueue_deployment"] = kueue_deployment(image)
    facts["kueue_config"] = None if config_text is None else kueue_config(config_text)
    return [r for r in doctor.run_checks(facts, NOW) if r.check == "kueue-elastic"]


def test_a_kueue_that_refuses_queued_autoscaled_services_is_a_warning_naming_its_gate():
    """Kueue admits Ray's autoscaler on a queued RayService only as an elastic job, behind
    ElasticJobsViaWorkloadSlices (beta, on by default from 0.18; Kueue 0.19.1 pkg/features)."""
    off = "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\nfeatureGates:\n  ElasticJobsViaWorkloadSlices: false\n"
    (result,) = elastic_results(off)
    assert result.status == WARN and "ElasticJobsViaWorkloadSlices is off in its config" in result.message
    assert "replicas.min < replicas.max" in result.message and result.doc.endswith("kueue.md#autoscaled-queued-services")
    assert "featureGates.ElasticJobsViaWorkloadSlices: true" in result.fix
    (result,) = elastic_results("apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\n",
                                "registry.k8s.io/kueue/kueue:v0.17.0")  # before 0.18: off by default
    assert result.status == WARN and "Kueue 0.17.0 leaves ElasticJobsViaWorkloadSlices off" in result.message
    assert doctor.exit_code([result]) == 0
    # on: by default from 0.18, or set on an older one; no config map: Kueue's defaults
    on_017 = "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\nfeatureGates:\n  ElasticJobsViaWorkloadSlices: true\n"
    assert elastic_results("apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n") == []
    assert elastic_results(on_017, "registry.k8s.io/kueue/kueue:v0.17.0") == []
    assert elastic_results(None) == []


def test_no_kueue_version_without_kueue():
    facts = healthy_facts()
    facts["kueue_deployment"] = kueue_deployment("registry.k8s.io/kueue/kueue:v0.20.1")
    assert "kueue-version" not in statuses(doctor.run_checks(facts, NOW))


# ---------------------------------------------------------------- the TPU webhook

def test_no_tpu_webhook_fails_and_no_validating_one_warns():
    facts = healthy_facts()
    facts["validating_webhooks"] = []
    got = statuses(doctor.run_checks(facts, NOW))
    assert got["tpu-webhook"] == OK and got["tpu-webhook-validation"] == WARN
    facts["mutating_webhooks"] = [{"metadata": {"name": "kueue-mutating-webhook-configuration"},
                                   "webhooks": [{"rules": [{"resources": ["pods"]}]}]}]
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["tpu-webhook"]
    assert result.status == FAIL and "Ray Operator add-on" in result.fix


# ---------------------------------------------------------------- TPU pools

def test_the_pool_table_names_shape_hosts_and_capacity():
    rows = {r["pool"]: r for r in check_pools(healthy_facts()["nodes"])[0].details}
    want = {"accelerator": "v6e", "topology": "4x4", "hosts": 4, "nodes": 4, "slices": 1, "capacity": "on-demand",
            "machineType": "ct6e-standard-4t"}
    assert {k: rows["tpu-v6e-4x4"][k] for k in want} == want
    assert rows["v6e-2x2-spot"]["capacity"] == "spot" and rows["v6e-2x2-spot"]["hosts"] == 1
    text = "\n".join(pools_table(list(rows.values())))
    assert re.search(r"^tpu-v6e-4x4 +v6e +4x4 +4 +ct6e-standard-4t +4 +1 +on-demand$", text, re.M), text


def test_a_pool_one_node_short_fails_and_an_extra_node_warns():
    short = check_pools(pool("p", 3))
    assert {r.check: r.status for r in short}["tpu-pool/p"] == FAIL
    assert "1 short" in short[-1].message and "multiple of 4" in short[-1].fix
    assert short[0].status == FAIL  # no slice can run at all
    extra = {r.check: r.status for r in check_pools(pool("p", 5))}
    assert extra == {"tpu-pools": OK, "tpu-pool/p": WARN}
    not_ready = pool("p", 3) + [node("p-3", "p", ready=False)]
    assert "(1 not ready)" in check_pools(not_ready)[-1].message


def test_ambiguous_and_impossible_pool_labels():
    ambiguous = check_pools(pool("a", 2, topo="2x4", machine=None))
    assert ambiguous[-1].status == WARN and "ambiguous" in ambiguous[-1].message
    resolved = check_pools(pool("a", 2, topo="2x4", machine="ct6e-standard-4t"))
    assert resolved[0].details[0]["hosts"] == 2 and resolved[0].details[0]["slices"] == 1
    wrong = check_pools(pool("w", 1, topo="3x3"))
    assert wrong[-1].status == FAIL and "'3x3'" in wrong[-1].message


def test_flex_start_and_reservation_capacity():
    rows = check_pools(pool("f", 4, **{"cloud.google.com/gke-flex-start": "true"})
                              + pool("r", 4, **{"cloud.google.com/reservation-name": "res-1"}))[0].details
    assert {r["pool"]: r["capacity"] for r in rows} == {"f": "flex-start", "r": "reservation res-1"}


# ---------------------------------------------------------------- --for FILE

def job(topo="4x4", **tpu_and_spec):
    tpu = {"accelerator": "v6e", "topology": topo, **{k: v for k, v in tpu_and_spec.items() if k in ("spot", "reservation")}}
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": "j", "namespace": "team-a"},
            "spec": {"tpu": tpu, "image": "i", "entrypoint": "python x.py",
                     **{k: v for k, v in tpu_and_spec.items() if k not in ("spot", "reservation")}}}
    return spec.parse_any(body)


def test_for_names_the_pool_or_why_none_fits():
    facts = healthy_facts()
    (ok,) = check_placement([job()], facts["nodes"], facts["quotas"], facts["local_queues"])
    assert ok.status == OK and "tpu-v6e-4x4" in ok.message
    (none,) = check_placement([job("8x8")], facts["nodes"], facts["quotas"], facts["local_queues"])
    assert none.status == FAIL and "no node pool is a tpu-v6e-slice 8x8 slice" in none.message
    assert "--tpu-topology=8x8 --num-nodes=16" in none.fix
    (spot,) = check_placement([job(spot=True)], facts["nodes"], facts["quotas"], facts["local_queues"])
    assert spot.status == FAIL and "not its capacity (spot)" in spot.message
    (spot_ok,) = check_placement([job("2x2", spot=True)], facts["nodes"], facts["quotas"], facts["local_queues"])
    assert spot_ok.status == OK and "v6e-2x2-spot" in spot_ok.message


def test_for_counts_the_namespace_quota_and_the_local_queue():
    facts = healthy_facts()
    quota = {"metadata": {"name": "tpu"}, "status": {"hard": {"requests.google.com/tpu": "16"},
                                                     "used": {"requests.google.com/tpu": "4"}}}
    (q,) = check_placement([job()], facts["nodes"], {"team-a": [quota]}, facts["local_queues"])
    assert q.status == FAIL and "leaves 12 chips, 16 needed" in q.message
    (lq,) = check_placement([job(queueName="research")], facts["nodes"], facts["quotas"], {"team-a": []})
    assert lq.status == FAIL and "no Kueue LocalQueue 'research'" in lq.message
    (fine,) = check_placement([job(queueName="research")], facts["nodes"], facts["quotas"],
                                     {"team-a": [{"metadata": {"name": "research"}}]})
    assert fine.status == OK


def with_disk(nodes, allocatable):
    for n in nodes:
        n["status"]["allocatable"] = {"ephemeral-storage": allocatable}
    return nodes


CACHED_WEIGHTS = [{"name": "w", "mountPath": "/models", "readOnly": True, "mountOn": ["worker"],
                   "gcs": {"bucket": "models", "fileCache": {"capacity": "100Gi"}}}]


def test_for_a_host_whose_disk_volumes_fit_no_nodes_disk():
    """Each host of a job with a 100Gi cache on the node's disk asks 120Gi: its Ray container the
    cache's volume (100Gi + 5%) plus 10Gi, and GKE's Cloud Storage FUSE sidecar its own 5Gi (the webhook's default), which
    the scheduler adds; a node of GKE's default 100 GB boot disk allocates about 47 GB (47093746742
    bytes: 43.86Gi, said as 43.8Gi: rounded down, never overstated)."""
    small = with_disk(pool("tpu-v6e-4x4", 4), "47093746742")
    (fail,) = check_placement([job(volumes=CACHED_WEIGHTS)], small, {}, {})
    assert fail.status == FAIL
    assert ("each host asks for 120Gi ephemeral-storage (115Gi for Ray + 5Gi for GKE's Cloud Storage FUSE sidecar); "
            "the nodes of tpu-v6e-4x4 allocate 43.8Gi") in fail.message
    # the sidecar's request as spec.gcsFuseSidecar sets it
    (fail,) = check_placement([job(volumes=CACHED_WEIGHTS, gcsFuseSidecar={"ephemeralStorageRequest": "2Gi"})], small, {}, {})
    assert "each host asks for 117Gi ephemeral-storage (115Gi for Ray + 2Gi for GKE's Cloud Storage FUSE sidecar)" in fail.message
    # a sidecar limit without a request: GKE's webhook makes the request equal to it (issue 56)
    (fail,) = check_placement([job(volumes=CACHED_WEIGHTS, gcsFuseSidecar={"ephemeralStorageLimit": "120Gi"})], small, {}, {})
    assert "each host asks for 235Gi ephemeral-storage (115Gi for Ray + 120Gi for GKE's Cloud Storage FUSE sidecar)" in fail.message
    # a sidecar alone can be too much for a node too: 40Gi + 5Gi on a node allocating 43.8Gi
    scratch = [{"name": "s", "mountPath": "/s", "mountOn": ["worker"], "emptyDir": {"sizeLimit": "30Gi"}},
               {"name": "b", "mountPath": "/b", "mountOn": ["worker"], "gcs": {"bucket": "data"}}]
    (fail,) = check_placement([job(volumes=scratch)], small, {}, {})
    assert "each host asks for 45Gi ephemeral-storage (40Gi for Ray + 5Gi for GKE's Cloud Storage FUSE sidecar)" in fail.message
    # without the cache nothing is asked; a pool of 300 GB disks (here 250Gi allocatable) holds it
    (plain,) = check_placement([job()], small, {}, {})
    assert plain.status == OK
    big = with_disk(pool("big-4x4", 4), "250Gi")
    (ok,) = check_placement([job(volumes=CACHED_WEIGHTS)], small + big, {}, {})
    assert ok.status == OK and "would land on pool big-4x4 (1 slice(s))" in ok.message
    # nodes that report no allocatable ephemeral-storage are not judged
    (unknown,) = check_placement([job(volumes=CACHED_WEIGHTS)], pool("tpu-v6e-4x4", 4), {}, {})
    assert unknown.status == OK


def cluster_queue(name="team-a-cq", cohort=None, covered=("cpu", "memory", "google.com/tpu"), active=True, **flavor_quota):
    """A Kueue v1beta2 ClusterQueue: one resource group, a flavor per keyword (name -> (nominal
    google.com/tpu, borrowingLimit or None))."""
    flavors = [{"name": f, "resources": [{"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "4Ti"},
                                         {"name": "google.com/tpu", "nominalQuota": str(nominal),
                                          **({"borrowingLimit": str(limit)} if limit is not None else {})}]}
               for f, (nominal, limit) in flavor_quota.items()]
    status = {"conditions": [{"type": "Active", "status": "True" if active else "False",
                              "reason": "Ready" if active else "FlavorNotFound",
                              "message": "Can admit new workloads" if active else "Can't admit new workloads: "
                              "references missing ResourceFlavor(s): v6e-4x4"}]}
    return {"metadata": {"name": name}, "spec": {**({"cohortName": cohort} if cohort else {}), "resourceGroups": [
        {"coveredResources": list(covered), "flavors": flavors}]}, "status": status}


def flavor(name, topo):
    return {"metadata": {"name": name}, "spec": {"nodeLabels": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                                                "cloud.google.com/gke-tpu-topology": topo}}}


V6E_4X4 = flavor("v6e-4x4", "4x4")
V6E_2X2 = flavor("v6e-2x2", "2x2")
RESEARCH = {"team-a": [{"metadata": {"name": "research"}, "spec": {"clusterQueue": "team-a-cq"}}]}


def placed(cqs, flavors=(V6E_4X4, V6E_2X2), queues=RESEARCH, **spec_fields):
    facts = healthy_facts()
    (result,) = check_placement([job(queueName="research", **spec_fields)], facts["nodes"], facts["quotas"],
                                       queues, cqs, list(flavors))
    return result


def test_for_a_queued_job_follows_its_local_queue_to_the_cluster_queue_and_its_tpu_flavors():
    """A v6e 4x4 job (16 chips) queued by LocalQueue research -> ClusterQueue team-a-cq: Kueue
    admits it only through a flavor for google.com/tpu whose nodeLabels agree with the slice's
    nodeSelector and whose quota (nominal, plus borrowing in a cohort) holds 16."""
    fine = placed([cluster_queue(**{"v6e-2x2": (4, None), "v6e-4x4": (16, None)})])
    assert fine.status == OK and "would land on pool tpu-v6e-4x4" in fine.message

    small = placed([cluster_queue(**{"v6e-4x4": (8, None)})])
    assert small.status == FAIL, small
    assert ("LocalQueue 'research''s ClusterQueue 'team-a-cq' has no flavor that can ever hold 16 google.com/tpu: "
            "v6e-4x4 (at most 8 google.com/tpu)") in small.message
    assert "TPU quota" in small.fix

    other_shape = placed([cluster_queue(**{"v6e-2x2": (64, None)})])
    assert other_shape.status == FAIL
    assert "v6e-2x2 (its nodeLabels cloud.google.com/gke-tpu-topology=2x2 are not the slice's)" in other_shape.message

    borrowing = placed([cluster_queue(cohort="research", **{"v6e-4x4": (8, 8)})])
    assert borrowing.status == OK, borrowing  # 8 + 8 may be borrowed
    short_borrow = placed([cluster_queue(cohort="research", **{"v6e-4x4": (8, 4)})])
    assert short_borrow.status == FAIL and "at most 12 google.com/tpu: nominal 8, borrowing in cohort research" in \
        short_borrow.message
    assert placed([cluster_queue(cohort="research", **{"v6e-4x4": (0, None)})]).status == OK  # no limit in the cohort

    missing_flavor = placed([cluster_queue(**{"v6e-4x4": (16, None)})], flavors=[V6E_2X2])
    assert missing_flavor.status == FAIL and "v6e-4x4 (no such ResourceFlavor)" in missing_flavor.message


def test_for_a_queued_job_whose_cluster_queue_is_missing_inactive_or_does_not_cover_the_pods():
    assert "ClusterQueue 'team-a-cq' does not exist" in placed([cluster_queue("other", **{"v6e-4x4": (16, None)})]).message
    inactive = placed([cluster_queue(active=False, **{"v6e-4x4": (16, None)})])
    assert inactive.status == FAIL and "is not active (FlavorNotFound: Can't admit new workloads" in inactive.message
    tpu_only = placed([cluster_queue(covered=("google.com/tpu",), **{"v6e-4x4": (16, None)})])
    assert tpu_only.status == FAIL and "covers no cpu, memory, which the pods ask for" in tpu_only.message
    assert placed([], queues={"team-a": []}).message.endswith("no Kueue LocalQueue 'research' in namespace team-a")


def test_for_a_queued_job_says_what_it_could_not_read_of_kueue():
    unread = placed(Unread("clusterqueues.kueue.x-k8s.io is forbidden"))
    assert unread.status == UNKNOWN and "Kueue's side not checked: Kueue's ClusterQueues unreadable" in unread.message
    lq_unread = placed([], queues={"team-a": Unread("timeout")})
    assert lq_unread.status == UNKNOWN and "LocalQueue 'research' unreadable (timeout)" in lq_unread.message
    assert "pool tpu-v6e-4x4" in lq_unread.message


class FakeApiClient:
    """The two calls doctor.read.Reader makes of a kubernetes ApiClient, answered from `objects`
    (path -> JSON; any other path 404, as the API server says for what is not there)."""

    def __init__(self, objects: dict):
        self.objects, self.paths = objects, []

    def param_serialize(self, method, path, query_params=None, **_):
        return method, path, query_params

    def call_api(self, method, path, query_params, _request_timeout=None):
        import io

        self.paths.append(path)
        if method == "POST":  # the SelfSubjectReview and SelfSubjectAccessReviews
            body = {"status": {"allowed": True, "userInfo": {"username": "alice"}}}
        else:
            body = self.objects.get(path)
        resp = io.BytesIO(json.dumps(body or {}).encode())
        resp.status = 200 if body is not None else 404
        return resp


def test_for_reads_the_cluster_queues_and_flavors_of_a_queued_job_through_the_api():
    from tputorch.cli.doctor import read as doctor_read

    lq_crd = {"metadata": {"name": KUEUE_LOCALQUEUE_CRD},
              "spec": {"versions": [{"name": "v1beta1", "served": True}, {"name": "v1beta2", "served": True, "storage": True}]}}
    kueue = "/apis/kueue.x-k8s.io/v1beta2"
    api = FakeApiClient({
        "/version": healthy_facts()["version"],
        doctor_read.CRD_PATH + KUEUE_LOCALQUEUE_CRD: lq_crd,
        "/api/v1/nodes": {"items": healthy_facts()["nodes"]},
        f"{kueue}/namespaces/team-a/localqueues": {"items": RESEARCH["team-a"]},
        f"{kueue}/clusterqueues": {"items": [cluster_queue(**{"v6e-4x4": (8, None)})]},
        f"{kueue}/resourceflavors": {"items": [V6E_4X4]},
    })
    facts = doctor_read.read_facts(api, "team-a", [job(queueName="research")], timeout=5)
    (placement,) = [r for r in doctor.run_checks(facts) if r.check == "for/team-a/j"]
    assert placement.status == FAIL and "no flavor that can ever hold 16 google.com/tpu" in placement.message

    unqueued = FakeApiClient(api.objects)
    facts = doctor_read.read_facts(unqueued, "team-a", [job()], timeout=5)
    assert (facts["cluster_queues"], facts["resource_flavors"]) == (None, None)
    assert not [p for p in unqueued.paths if p.endswith(("/clusterqueues", "/resourceflavors"))]  # read only when queued


def test_kueues_version_is_read_from_its_deployment_through_the_api():
    from tputorch.cli.doctor import read as doctor_read

    api = FakeApiClient({
        "/version": healthy_facts()["version"],
        doctor_read.CRD_PATH + KUEUE_LOCALQUEUE_CRD: {"spec": {"versions": [{"name": "v1beta2", "storage": True}]}},
        "/apis/apps/v1/namespaces/kueue-system/deployments/kueue-controller-manager":
            kueue_deployment("registry.k8s.io/kueue/kueue:v0.20.2"),
    })
    (result,) = [r for r in doctor.run_checks(doctor_read.read_facts(api, "team-a", None, timeout=5))
                 if r.check == "kueue-version"]
    assert result.status == FAIL and result.message.startswith("Kueue 0.20.2: ")


# ---------------------------------------------------------------- network, Kueue, GCS FUSE, rights

def set_args(facts, *args):
    facts["operator_deployments"][0]["spec"]["template"]["spec"]["containers"][0]["args"] = ["run", *args]


def test_network_policy_heuristic_and_the_operators_mode():
    facts = healthy_facts()
    facts["kube_system_pods"] = [{"metadata": {"name": "kube-proxy-1"}}]
    got = statuses(doctor.run_checks(facts, NOW))
    assert got["network-policy"] == WARN and got["operator-policy"] == OK  # open mode, the default
    facts = healthy_facts()  # Dataplane V2 seen
    set_args(facts, "--network-policy-mode", "strict", "--network-policy-peer", "tputorch-system")
    result = {r.check: r for r in doctor.run_checks(facts, NOW)}["operator-policy"]
    assert result.status == FAIL and "KubeRay could not reach the Ray dashboard" in result.message
    assert "networkPolicy.kuberay.namespace" in result.fix
    set_args(facts, "--network-policy-mode=strict", "--network-policy-peer", "kuberay-system:app=kuberay")
    assert statuses(doctor.run_checks(facts, NOW))["operator-policy"] == OK
    set_args(facts, "--network-policy-mode", "strict", "--network-policy-peer", "10.0.0.0/8")
    assert statuses(doctor.run_checks(facts, NOW))["operator-policy"] == OK
    set_args(facts, "--no-network-policy")
    assert statuses(doctor.run_checks(facts, NOW))["operator-policy"] == WARN
    facts["kuberay_deployments"] = []  # a hosted KubeRay: where it calls from is unknown
    set_args(facts, "--network-policy-mode", "strict", "--network-policy-peer", "tputorch-system")
    assert statuses(doctor.run_checks(facts, NOW))["operator-policy"] == WARN


def test_kueue_integrations_and_local_queues():
    config = {"data": {"controller_manager_config.yaml": "integrations:\n  frameworks: [batch/job, ray.io/rayjob]\n"}}
    frameworks = kueue_frameworks(config)
    results = {r.check: r for r in check_kueue(True, frameworks, [], "team-a")}
    assert results["kueue-integrations"].status == FAIL and "ray.io/rayservice" in results["kueue-integrations"].message
    assert results["kueue-localqueues"].status == WARN
    ok = statuses(check_kueue(True, ["ray.io/rayjob", "ray.io/rayservice"], [{"metadata": {"name": "q"}}], "a"))
    assert ok == {"kueue-integrations": OK, "kueue-localqueues": OK}
    assert statuses(check_kueue(True, None, [], "a"))["kueue-integrations"] == UNKNOWN
    assert statuses(check_kueue(False, None, [], "a")) == {"kueue": OK}


def test_gcsfuse_and_rights():
    assert check_gcsfuse(None)[0].status == WARN
    rights = {r: r[2] != "pods" for r in RIGHTS}
    (result,) = check_rights(rights, "team-a", "system:serviceaccount:team-a:bot")
    assert result.status == FAIL and "list pods" in result.message and "get pods/log" in result.message
    assert "rolebinding" in result.fix


def test_text_and_json_output():
    facts = healthy_facts()
    facts["mutating_webhooks"] = []
    results = doctor.run_checks(facts, NOW)
    text = doctor.format_text(results, "cluster X")
    assert "✗ no Ray TPU webhook" in text and "    fix: enable GKE's Ray Operator add-on" in text
    assert "    see: docs/compatibility.md#the-ray-tpu-webhook" in text
    out = json.loads(doctor.format_json(results, {"server": "X"}))
    assert out["ok"] is False and {"check": "tpu-webhook", "status": "fail"}.items() <= out["checks"][
        [c["check"] for c in out["checks"]].index("tpu-webhook")].items()
    assert doctor.exit_code(results) == 1


def test_the_lease_is_the_one_the_deployment_names():
    d = {"metadata": {"namespace": "ops"}, "spec": {"template": {"spec": {"containers": [{"args": [
        "run", "--leader-elect", "--lease-name", "prod-tputorch-operator"]}]}}}}
    assert lease_names([d]) == [("ops", "prod-tputorch-operator")]
    d["spec"]["template"]["spec"]["containers"][0]["args"] = ["run"]
    assert lease_names([d]) == []


def test_kueue_podsets_says_how_many_groups_a_queued_job_may_have_under_the_installed_kueue():
    """The same cap the operator applies (api/groups.py), from the Workload CRD doctor reads."""
    def crd(cap):
        podsets = {"type": "array", **({"maxItems": cap} if cap else {})}
        return {"spec": {"versions": [{"name": "v1beta2", "served": True, "schema": {"openAPIV3Schema": {
            "properties": {"spec": {"properties": {"podSets": podsets}}}}}}]}}
    facts = healthy_facts()
    facts["kueue_installed"] = True
    facts["crds"]["workloads.kueue.x-k8s.io"] = crd(18)
    got = {r.check: r for r in doctor.run_checks(facts, NOW)}
    assert got["kueue-podsets"].status == OK
    assert got["kueue-podsets"].message == ("Kueue's Workloads take at most 18 pod sets: a queued TPUTorchJob may "
                                            "have at most 15 spec.groups")
    facts["crds"]["workloads.kueue.x-k8s.io"] = crd(8)
    assert "at most 5 spec.groups" in {r.check: r for r in doctor.run_checks(facts, NOW)}["kueue-podsets"].message
    facts["crds"]["workloads.kueue.x-k8s.io"] = crd(None)
    unknown = {r.check: r for r in doctor.run_checks(facts, NOW)}["kueue-podsets"]
    assert unknown.status == UNKNOWN and "the smallest known, 8 pod sets (5 spec.groups" in unknown.message
    facts["kueue_installed"] = False
    assert "kueue-podsets" not in statuses(doctor.run_checks(facts, NOW))


def test_for_a_queued_host_with_disk_volumes_needs_a_cluster_queue_that_covers_ephemeral_storage():
    # Kueue admits no workload asking for a resource its ClusterQueue does not cover; a cache on the
    # node's disk makes the hosts ask for ephemeral-storage (nothing else in this job does).
    old = placed([cluster_queue(**{"v6e-4x4": (16, None)})], volumes=CACHED_WEIGHTS)
    assert old.status == FAIL and "covers no ephemeral-storage, which the pods ask for" in old.message
    assert placed([cluster_queue(**{"v6e-4x4": (16, None)})]).status == OK  # no disk volumes: nothing asked


def kueue_config(text):
    return {"data": {"controller_manager_config.yaml": text}}


def test_for_a_queued_host_with_disk_volumes_under_a_kueue_config_that_leaves_disk_out_of_quota():
    """Kueue 0.19.1 drops from a workload's requests every resource whose name starts with one of
    resources.excludeResourcePrefixes (v1beta1 and v1beta2 configs), and under the v1beta2
    resources.quotaCheckStrategy: IgnoreUndeclared (QuotaCheckStrategy gate, on by default in 0.19)
    skips any resource no resource group of the ClusterQueue covers: either way a ClusterQueue
    that does not cover ephemeral-storage admits the hosts."""
    cq = [cluster_queue(**{"v6e-4x4": (16, None)})]

    def with_config(text):
        facts = healthy_facts()
        (result,) = check_placement([job(queueName="research", volumes=CACHED_WEIGHTS)], facts["nodes"],
                                           facts["quotas"], RESEARCH, cq, [V6E_4X4, V6E_2X2],
                                           kueue_quota_check(text if not isinstance(text, str) else kueue_config(text)))
        return result

    v1beta1 = "apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\nresources:\n  excludeResourcePrefixes: [ephemeral-storage]\n"
    assert with_config(v1beta1).status == OK
    assert with_config(v1beta1.replace("v1beta1", "v1beta2")).status == OK
    assert with_config(v1beta1.replace("[ephemeral-storage]", "[ephemeral]")).status == OK  # a prefix of the name
    assert with_config(v1beta1.replace("[ephemeral-storage]", "[storage]")).status == FAIL  # not a prefix
    ignore = ("apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
              "resources:\n  quotaCheckStrategy: IgnoreUndeclared\n")
    assert with_config(ignore).status == OK
    assert with_config(ignore.replace("IgnoreUndeclared", "BlockUndeclared")).status == FAIL
    # v1beta1 has no quotaCheckStrategy (Kueue's strict decoding refuses it); the gate turned off
    assert with_config(ignore.replace("v1beta2", "v1beta1")).status == FAIL
    assert with_config(ignore + "featureGates:\n  QuotaCheckStrategy: false\n").status == FAIL
    # integrations only (Kueue's defaults for resources), no config map: every resource is checked
    plain = with_config("apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n"
                        "integrations:\n  frameworks: [ray.io/rayjob]\n")
    assert plain.status == FAIL and "covers no ephemeral-storage" in plain.message
    assert with_config(None).status == FAIL
    # the config map unreadable: whether it leaves disk out is not known, so no ✗
    unread = with_config(Unread("configmaps is forbidden"))
    assert unread.status == UNKNOWN
    assert ("covers no ephemeral-storage, which the pods ask for, and whether Kueue's config leaves them out of "
            "quota is unknown: kueue-system/kueue-manager-config unreadable (configmaps is forbidden)") in unread.message


def test_a_kueue_config_that_leaves_the_tpu_out_of_quota_needs_no_tpu_flavor():
    no_tpu = [cluster_queue(covered=("cpu", "memory"), **{"v6e-4x4": (16, None)})]
    assert placed(no_tpu).status == FAIL
    facts = healthy_facts()
    for text in ("apiVersion: config.kueue.x-k8s.io/v1beta2\nresources:\n  quotaCheckStrategy: IgnoreUndeclared\n",
                 "apiVersion: config.kueue.x-k8s.io/v1beta1\nresources:\n  excludeResourcePrefixes: [google.com/]\n"):
        (result,) = check_placement([job(queueName="research")], facts["nodes"], facts["quotas"], RESEARCH,
                                           no_tpu, [V6E_4X4], kueue_quota_check(kueue_config(text)))
        assert result.status == OK, (text, result)


def test_run_checks_reads_kueue_config_for_the_queued_specs():
    facts = healthy_facts()
    facts.update(kueue_installed=True, specs=[job(queueName="research", volumes=CACHED_WEIGHTS)],
                 local_queues=RESEARCH, cluster_queues=[cluster_queue(**{"v6e-4x4": (16, None)})],
                 resource_flavors=[V6E_4X4])
    facts["kueue_config"] = kueue_config("apiVersion: config.kueue.x-k8s.io/v1beta1\nintegrations:\n  frameworks: "
                                         "[ray.io/rayjob, ray.io/rayservice]\n")
    assert statuses(doctor.run_checks(facts, NOW))["for/team-a/j"] == FAIL
    facts["kueue_config"]["data"]["controller_manager_config.yaml"] += "resources:\n  excludeResourcePrefixes: [ephemeral-storage]\n"
    assert statuses(doctor.run_checks(facts, NOW))["for/team-a/j"] == OK


# ---------------------------------------------------------------- --for FILE: the ServiceAccount (issue 55)

def test_for_a_spec_whose_service_account_is_missing_fails_naming_it_and_the_runbooks_commands():
    from tputorch.api import identity
    from tputorch.cli.doctor.identity import check_service_accounts

    bound = job(serviceAccountName="ray-tpu", checkpoint={"storagePath": "gs://team-ckpt/runs"})
    (missing,) = check_service_accounts([bound], {("team-a", "ray-tpu"): None})
    assert missing.status == FAIL and missing.check == "service-account/team-a/j"
    assert "ServiceAccount ray-tpu, which namespace team-a does not have" in missing.message
    assert "`kubectl -n team-a create serviceaccount ray-tpu`" in missing.fix
    member = ("principal://iam.googleapis.com/projects/PROJECT_NUMBER/locations/global/workloadIdentityPools/"
              "PROJECT_ID.svc.id.goog/subject/ns/team-a/sa/ray-tpu")
    assert (f"gcloud storage buckets add-iam-policy-binding gs://team-ckpt --member={member} "
            "--role=roles/storage.objectUser") in missing.fix
    assert missing.doc == identity.RUNBOOK_STEP == "docs/tasks/bucket-access.md#a-bucket-and-workload-identity-for-the-ray-pods"
    (there,) = check_service_accounts([bound], {("team-a", "ray-tpu"): {"metadata": {"name": "ray-tpu"}}})
    assert there.status == OK and "gs://team-ckpt" in there.message
    (unread,) = check_service_accounts([bound], {("team-a", "ray-tpu"): Unread("forbidden")})
    assert unread.status == UNKNOWN and "forbidden" in unread.message


def test_for_a_spec_that_reaches_a_bucket_as_the_default_account_is_a_warning():
    from tputorch.cli.doctor.identity import check_service_accounts

    (warned,) = check_service_accounts([job(checkpoint={"storagePath": "gs://team-ckpt/runs"})], {})
    assert warned.status == WARN and "reaches gs://team-ckpt as namespace team-a's default ServiceAccount" in warned.message
    assert "serviceAccountName: ray-tpu" in warned.fix
    assert check_service_accounts([job()], {}) == []  # no bucket, no account: nothing to say


def test_the_runbook_binds_the_principal_and_roles_the_fix_names():
    """The doctor's and the status's fix is the runbook's own step: its member and its roles."""
    from tputorch.api import identity

    step = (ROOT / "docs" / "tasks" / "bucket-access.md").read_text()
    member = identity.principal("$NS", identity.RUNBOOK_ACCOUNT, "$PROJECT_NUMBER", "$PROJECT")
    assert f"kubectl create serviceaccount {identity.RUNBOOK_ACCOUNT}" in step
    assert f"MEMBER={member}" in step
    for role in (identity.OBJECT_ROLE, identity.BUCKET_ROLE):
        assert f"--member=$MEMBER --role={role}" in step
    assert identity.READ_ROLE in step


def test_for_reads_each_named_service_account_through_the_api():
    from tputorch.cli.doctor import read as doctor_read

    api = FakeApiClient({"/version": healthy_facts()["version"], "/api/v1/nodes": {"items": healthy_facts()["nodes"]},
                         "/api/v1/namespaces/team-a/serviceaccounts/ray-tpu": {"metadata": {"name": "ray-tpu"}}})
    specs = [job(serviceAccountName="ray-tpu"), job(serviceAccountName="other")]
    facts = doctor_read.read_facts(api, "team-a", specs, timeout=5)
    assert facts["service_accounts"] == {("team-a", "ray-tpu"): {"metadata": {"name": "ray-tpu"}}, ("team-a", "other"): None}
    got = [r for r in doctor.run_checks(facts) if r.check == "service-account/team-a/j"]
    assert [r.status for r in got] == [OK, FAIL] and "ServiceAccount other" in got[1].message
    doctor_read.read_facts(quiet := FakeApiClient(api.objects), "team-a", [job()], timeout=5)
    assert not [p for p in quiet.paths if "/serviceaccounts/" in p]  # read only when a spec names one
