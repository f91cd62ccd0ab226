"""The Helm chart: generated CRD copies, `helm lint`, `helm template` output, values.schema.json.

Needs only the helm binary (no cluster): $HELM, else hack/build.sh's cache dir, else PATH.
Tests that need helm skip when there is none (build it with `hack/build.sh helm`); the CRD drift
test never needs it. Checks against real Kubernetes schemas are in tests/cluster/test_chart_install.py
(server-side dry run + helm install into the local cluster).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from kubernetes.utils import parse_quantity

import tputorch
from tputorch.api import crd
from tputorch.api.common import MAX_PODS_DEFAULT

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doccmds import find_helm, helm_args  # noqa: E402  (one place that finds helm, for the docs tests too)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tputorch-operator"
CRD_FILES = sorted(crd.FILES.items())
RELEASE, NS = "tto", "tputorch-system"
FULLNAME = "tto-tputorch-operator"


HELM = find_helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm binary (hack/build.sh helm, or set $HELM)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "HELM_CACHE_HOME": f"{tempfile.gettempdir()}/tputorch-helm/cache",
           "HELM_CONFIG_HOME": f"{tempfile.gettempdir()}/tputorch-helm/config", "HELM_DATA_HOME": f"{tempfile.gettempdir()}/tputorch-helm/data"}
    out = subprocess.run([HELM, *helm_args(args)], capture_output=True, text=True, timeout=120, env=env)
    if check:
        assert out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stderr}"
    return out


def render(*sets: str, extra: tuple[str, ...] = ()) -> list[dict]:
    args = ["template", RELEASE, str(CHART), "--namespace", NS, *extra]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    (doc,) = by_kind(docs, kind)
    return doc


USER_ROLES = {f"{FULLNAME}-user-view", f"{FULLNAME}-user-edit"}  # templates/user-roles.yaml


def operator_rbac(docs: list[dict]) -> list[dict]:
    """The release's objects minus the users' aggregated roles (tested on their own)."""
    return [d for d in docs if d["metadata"]["name"] not in USER_ROLES]


# --- what the operator may do: the RBAC rules, exactly ------------------------------------

NAMESPACED_RULES = [
    {"apiGroups": ["tputorch.io"], "resources": ["tputorchjobs", "tputorchservices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["tputorch.io"], "resources": ["tputorchjobs/status", "tputorchservices/status"],
     "verbs": ["get", "patch"]},
    {"apiGroups": ["tputorch.io"], "resources": ["tputorchjobs/finalizers", "tputorchservices/finalizers"],
     "verbs": ["update"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayservices"], "verbs": ["get", "list", "watch", "create", "patch"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["delete"]},
    {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch", "create", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {"apiGroups": ["events.k8s.io", ""], "resources": ["events"], "verbs": ["create"]},
]
# Cluster-scoped reads: Kueue's Workload CRD by name, the operator's own two CRDs by name and only
# `get` (whether they are its release's, at startup); no other CRD (kopf's scanning is off); Kueue's
# WorkloadPriorityClasses; never the namespaces.
WORKLOAD_CRD = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                "resourceNames": ["workloads.kueue.x-k8s.io"], "verbs": ["get", "list", "watch"]}
OWN_CRDS = {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
            "resourceNames": ["tputorchjobs.tputorch.io", "tputorchservices.tputorch.io"], "verbs": ["get"]}
CLUSTER_READS = [WORKLOAD_CRD, OWN_CRDS, {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloadpriorityclasses"],
                                          "verbs": ["get", "list", "watch"]}]


# What would let a thief of the operator's token change the cluster (docs/concepts/tenancy-and-auth.md's table).
WRITE_GRANTS = [("", "secrets", "create"), ("networking.k8s.io", "networkpolicies", "create"),
                ("networking.k8s.io", "networkpolicies", "patch"), ("kueue.x-k8s.io", "workloads", "patch"),
                ("ray.io", "rayjobs", "create"), ("ray.io", "rayservices", "patch"), ("ray.io", "rayjobs", "delete"),
                ("ray.io", "rayclusters", "patch"),
                ("tputorch.io", "tputorchjobs/status", "patch")]


def allowed(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any((group in r["apiGroups"] or "*" in r["apiGroups"])
               and (resource in r["resources"] or "*" in r["resources"])
               and (verb in r["verbs"] or "*" in r["verbs"]) for r in rules)


def assert_least_privilege(rules: list[dict]) -> None:
    for r in rules:
        assert "*" not in r["apiGroups"] + r["resources"] + r["verbs"], r
        # the rules narrowed by name are the CRDs': no other CRD may be read
        assert r in (WORKLOAD_CRD, OWN_CRDS) or "resourceNames" not in r, r
        assert "nonResourceURLs" not in r, r
        if "customresourcedefinitions" in r["resources"]:
            assert r in (WORKLOAD_CRD, OWN_CRDS), r
    assert not allowed(rules, "", "namespaces", "list") and not allowed(rules, "", "namespaces", "watch")
    for verb in ("get", "list", "watch", "create", "update", "patch", "delete"):
        # create only (a job's Ray token Secret): never read, and never written over (an
        # update or patch answers with the whole Secret, so it would be a read too)
        if verb != "create":
            assert not allowed(rules, "", "secrets", verb), f"secrets {verb} must not be granted"
        assert not allowed(rules, "", "configmaps", verb), f"configmaps {verb} must not be granted"
    for verb in ("create", "update", "patch", "delete", "deletecollection"):
        assert not allowed(rules, "", "pods", verb), f"pods {verb} must not be granted"
    assert not allowed(rules, "", "pods/exec", "create")
    assert not allowed(rules, "", "serviceaccounts/token", "create")
    for verb in ("create", "update", "patch", "delete"):
        assert not allowed(rules, "apiextensions.k8s.io", "customresourcedefinitions", verb)
    for kind in ("tputorchjobs", "tputorchservices"):
        for verb in ("create", "update", "patch", "delete"):
            assert not allowed(rules, "tputorch.io", kind, verb)
    for child in ("rayjobs", "rayservices"):
        assert not allowed(rules, "ray.io", child, "update")
    # A job's RayJob of an ended attempt is deleted (a new attempt is a new RayJob); never a service's.
    assert not allowed(rules, "ray.io", "rayservices", "delete")
    for verb in ("list", "watch", "create", "update", "delete"):  # a service's running cluster: get and patch only
        assert not allowed(rules, "ray.io", "rayclusters", verb)
    assert not allowed(rules, "ray.io", "rayjobs", "deletecollection")
    for verb in ("get", "list", "create", "update", "patch"):
        assert not allowed(rules, "coordination.k8s.io", "leases", verb), "leases only in the release namespace"


# --- generated CRD copies (no helm needed) --------------------------------------------------


@pytest.mark.parametrize("folder", [ROOT / "crds", CHART / "crds"], ids=["crds", "chart-crds"])
@pytest.mark.parametrize("kind,name", CRD_FILES, ids=[k for k, _ in CRD_FILES])
def test_crd_copies_match_tputorch_crd(folder, kind, name):
    path = folder / name
    assert path.read_text() == crd.crd_yaml(kind), (
        f"{path.relative_to(ROOT)} drifted from `tputorch crd`; regenerate: make crd")


def test_chart_crds_folder_holds_only_the_crds():
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == sorted(crd.FILES.values())


def test_chart_metadata():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "tputorch-operator"
    assert chart["version"] == tputorch.__version__ and chart["appVersion"] == tputorch.__version__


def test_schema_accepts_the_default_values():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def test_every_value_is_documented():
    """Each top-level key of values.yaml has a comment right above it, or every child has."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith(("#", "-")):
            continue
        above = lines[i - 1].strip() if i else ""
        is_parent = line.rstrip().endswith(":")
        if not above.startswith("#") and not is_parent:
            undocumented.append(line.strip())
    # resources' requests/limits are documented by the comment on `resources`
    undocumented = [u for u in undocumented if not u.startswith(("cpu:", "memory:"))]
    assert not undocumented, f"values without a comment line above: {undocumented}"


# --- helm lint / template -------------------------------------------------------------------


@needs_helm
@pytest.mark.parametrize("sets", [[], ["watchNamespaces={team-a,team-b}"],
                                  ["metrics.enabled=true", "metrics.serviceMonitor.enabled=true"]],
                         ids=["default", "namespaced", "metrics"])
def test_helm_lint(sets):
    args = ["lint", "--strict", str(CHART)]
    for s in sets:
        args += ["--set", s]
    out = helm(*args)
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


@needs_helm
def test_default_render_objects():
    docs = render()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole"] * 3 + ["ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role",
                     "RoleBinding", "Secret", "ServiceAccount"]
    for d in docs:
        assert d["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if d["kind"] in ("Deployment", "ServiceAccount", "Secret"):
            assert d["metadata"]["namespace"] == NS
    # `helm template` leaves CRDs out by default; --include-crds adds exactly the generated ones.
    with_crds = [d for d in yaml.safe_load_all(helm("template", RELEASE, str(CHART), "--include-crds").stdout) if d]
    assert sorted(by_kind(with_crds, "CustomResourceDefinition"), key=lambda c: c["metadata"]["name"]) == \
        sorted(crd.crd(), key=lambda c: c["metadata"]["name"])


@needs_helm
def test_deployment_shape():
    dep = one(render(), "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == FULLNAME
    (c,) = pod["containers"]
    assert c["image"] == f"tputorch-operator:{tputorch.__version__}"
    assert "command" not in c  # the image's ENTRYPOINT is `tputorch`
    assert c["args"] == ["run", "--leader-elect", "--lease-name", FULLNAME, "--liveness", "http://0.0.0.0:8080/healthz",
                         "--readiness", "http://0.0.0.0:8081/readyz",
                         "--network-policy-mode", "open",
                         "--network-policy-peer", f"{NS}:app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=tputorch-operator",
                         "--max-pods-per-job", str(MAX_PODS_DEFAULT),
                         "--ray-token-key-file", "/etc/tputorch/ray-token-key/key",
                         "--ray-token-previous-key-file", "/etc/tputorch/ray-token-key/previousKey", "--log-format", "json"]
    limited = one(render("maxPodsPerJob=64"), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert limited[limited.index("--max-pods-per-job") + 1] == "64"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "ready": 8081}  # metrics off: no port, nothing served
    on = one(render("metrics.enabled=true", "networkPolicy.kuberay.namespace=ray-system"), "Deployment")
    (c,) = on["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8080, "ready": 8081, "metrics": 9090}
    assert c["args"][c["args"].index("--metrics-port") + 1] == "9090"
    assert "ray-system:app.kubernetes.io/name=kuberay-operator" in c["args"]
    gke = one(render("networkPolicy.mode=strict", "networkPolicy.kuberay.cidrs={10.128.0.0/20}",
                     "networkPolicy.metrics.peers[0].namespace=gmp-system",
                     "networkPolicy.metrics.peers[1].namespace=monitoring",
                     "networkPolicy.metrics.peers[1].podLabels.app=prometheus",
                     "networkPolicy.metrics.peers[2].cidr=10.0.0.0/8"), "Deployment")
    args = gke["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--network-policy-mode") + 1] == "strict"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--network-policy-peer"][1:] == ["10.128.0.0/20"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--network-policy-metrics-peer"] == \
        ["gmp-system", "monitoring:app=prometheus", "10.0.0.0/8"]
    # and the operator takes every one of them
    from tputorch.cli.main import build_parser
    parsed = build_parser().parse_args(args)
    assert [str(p) for p in parsed.network_policy_metrics_peer] == ["gmp-system", "monitoring:app=prometheus", "10.0.0.0/8"]
    for bad in ("networkPolicy.mode=closed", "networkPolicy.kuberay.cidrs={10.0.0.0}",
                "networkPolicy.metrics.peers[0].cidr=10.0.0.0/8,networkPolicy.metrics.peers[0].namespace=x"):
        assert helm("template", RELEASE, str(CHART), "--set", bad, check=False).returncode != 0, bad
    off = one(render("networkPolicy.enabled=false"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--no-network-policy" in off["args"] and "--network-policy-peer" not in off["args"]
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    # readiness fails while a store cannot be listed (issue 34); liveness does not restart for it
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ready"}
    # a slow start is the startup probe's to allow, not a restart loop of the liveness probe's
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 300
    res = c["resources"]
    assert {"cpu", "memory", "ephemeral-storage"} <= res["requests"].keys() and "memory" in res["limits"]
    # the /tmp emptyDir fits in the ephemeral-storage request
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert parse_quantity(tmp["emptyDir"]["sizeLimit"]) <= parse_quantity(res["requests"]["ephemeral-storage"])
    for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
        assert key not in pod, key
    # the two replicas: preferably on two nodes (the standby survives the leader's node), matched by
    # the Deployment's own selector, so the rule sees exactly its replicas
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == dep["spec"]["selector"]


@needs_helm
def test_restricted_pod_security():
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod
    # the only writable path is an emptyDir at /tmp; the Ray token key is mounted read-only
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"},
                                 {"name": "ray-token-key", "mountPath": "/etc/tputorch/ray-token-key", "readOnly": True}]
    tmp, key = pod["volumes"]
    assert tmp["name"] == "tmp" and "emptyDir" in tmp
    assert key["secret"] == {"secretName": f"{FULLNAME}-ray-token-key", "defaultMode": 0o400}


@needs_helm
def test_clusterwide_rbac_is_exactly_the_operators_needs():
    docs = operator_rbac(render())
    role = one(docs, "ClusterRole")
    assert role["metadata"]["name"] == FULLNAME
    assert role["rules"] == NAMESPACED_RULES + CLUSTER_READS
    # kopf's scanning is off: it lists no namespaces and no CRDs, in either mode (handlers.start)
    assert not allowed(role["rules"], "", "namespaces", "list")
    assert_least_privilege(role["rules"])
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": FULLNAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}]
    assert [r["metadata"]["name"] for r in by_kind(docs, "Role")] == [f"{FULLNAME}-leader-election"]


LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [FULLNAME],
     "verbs": ["get", "update", "patch"]},
]


@needs_helm
def test_leader_election_lease_only_in_the_release_namespace():
    docs = render()
    (role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == NS and role["rules"] == LEASE_RULES
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"].endswith("-leader-election")]
    assert binding["metadata"]["namespace"] == NS
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
           for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"] if "valueFrom" in e}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert one(docs, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert not by_kind(render("replicaCount=1"), "PodDisruptionBudget")


@needs_helm
def test_namespaced_mode():
    docs = operator_rbac(render("watchNamespaces={team-a,team-b}"))
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["args"][-4:] == ["--namespace", "team-a", "--namespace", "team-b"]
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == FULLNAME]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == NAMESPACED_RULES
        assert_least_privilege(role["rules"])
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == FULLNAME]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": FULLNAME}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}]
    # cluster-wide: only the cluster-scoped reads, nothing about jobs, RayJobs or pods
    cluster_role = one(docs, "ClusterRole")
    assert cluster_role["metadata"]["name"] == f"{FULLNAME}-cluster-reads"
    assert cluster_role["rules"] == CLUSTER_READS
    assert_least_privilege(cluster_role["rules"])
    # every write grant is in the listed namespaces' Roles alone, none cluster-wide
    for group, resource, verb in WRITE_GRANTS:
        assert all(allowed(role["rules"], group, resource, verb) for role in roles), (group, resource, verb)
        assert not any(allowed(r["rules"], group, resource, verb) for r in by_kind(docs, "ClusterRole")), (group, resource, verb)
    assert {b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")} == {f"{FULLNAME}-cluster-reads"}
    # no Role beyond the listed namespaces and the release namespace's leader election
    assert {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(docs, "Role")} == {
        ("team-a", FULLNAME), ("team-b", FULLNAME), (NS, f"{FULLNAME}-leader-election")}
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == f"{FULLNAME}-cluster-reads"


@needs_helm
def test_the_ray_token_key_is_random_kept_on_uninstall_and_long_enough():
    first, second = (one(render(), "Secret") for _ in range(2))
    assert first["metadata"]["name"] == f"{FULLNAME}-ray-token-key"
    assert first["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    keys = [base64.b64decode(s["data"]["key"]) for s in (first, second)]
    assert len(keys[0]) >= 32 and keys[0] != keys[1]  # no fixed key in the chart (an install reuses it by lookup)


@needs_helm
def test_an_existing_ray_token_key_secret_renders_the_same_manifests_every_time():
    # GitOps renders with `helm template`, where lookup finds nothing: a chart-made key changed per sync
    first, second = (render("rayTokenKey.existingSecret=tputorch-key") for _ in range(2))
    assert first == second
    assert not by_kind(first, "Secret")
    (key,) = [v for v in one(first, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "ray-token-key"]
    assert key["secret"] == {"secretName": "tputorch-key", "defaultMode": 0o400}


@needs_helm
def test_rbac_create_false_renders_no_rbac():
    docs = render("rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=existing")
    assert sorted(d["kind"] for d in docs) == ["Deployment", "PodDisruptionBudget", "Secret"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


@needs_helm
def test_user_roles_aggregate_into_view_edit_and_admin():
    roles = {d["metadata"]["name"]: d for d in by_kind(render(), "ClusterRole") if d["metadata"]["name"] in USER_ROLES}
    view, edit = roles[f"{FULLNAME}-user-view"], roles[f"{FULLNAME}-user-edit"]
    agg = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in view["metadata"]["labels"].items() if k.startswith(agg) and v == "true"} == {agg + "view"}
    assert {k for k, v in edit["metadata"]["labels"].items() if k.startswith(agg) and v == "true"} == {agg + "edit", agg + "admin"}
    for kind in ("tputorchjobs", "tputorchservices"):
        assert all(allowed(view["rules"], "tputorch.io", kind, v) for v in ("get", "list", "watch"))
        assert not any(allowed(view["rules"], "tputorch.io", kind, v) for v in ("create", "patch", "delete"))
        assert all(allowed(edit["rules"], "tputorch.io", kind, v) for v in ("create", "patch", "delete"))
        assert not allowed(edit["rules"], "tputorch.io", f"{kind}/status", "patch"), "only the operator writes status"
    assert allowed(edit["rules"], "", "pods/log", "get")
    rules = view["rules"] + edit["rules"]
    for r in rules:  # nothing beyond the two kinds and pod logs
        assert "*" not in r["apiGroups"] + r["resources"] + r["verbs"] and "resourceNames" not in r, r
        assert set(r["resources"]) <= {"tputorchjobs", "tputorchjobs/status", "tputorchservices",
                                       "tputorchservices/status", "pods/log"}, r
    # userRoles=false, or rbac.create=false, leaves them out
    for sets in (["rbac.userRoles=false"], ["rbac.create=false", "serviceAccount.create=false", "serviceAccount.name=x"]):
        assert not USER_ROLES & {d["metadata"]["name"] for d in render(*sets)}


@needs_helm
def test_metrics_service_and_servicemonitor():
    docs = render("metrics.enabled=true", "metrics.serviceMonitor.enabled=true")
    svc = one(docs, "Service")
    assert svc["metadata"]["name"] == f"{FULLNAME}-metrics"
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    # no monitoring.coreos.com/v1 in the cluster (helm template's default): no ServiceMonitor
    assert not by_kind(docs, "ServiceMonitor")
    docs = render("metrics.enabled=true", "metrics.serviceMonitor.enabled=true",
                  extra=("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"))
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s",
                                        "scrapeTimeout": "10s"}]
    # the API alone does not create one
    docs = render(extra=("--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"))
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "Service")


@needs_helm
def test_the_grafana_dashboard_configmap_holds_the_charts_dashboard():
    assert not by_kind(render(), "ConfigMap")
    cm = one(render("metrics.grafanaDashboard.enabled=true"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == NS
    assert json.loads(cm["data"]["tputorch.json"]) == json.loads((CHART / "dashboards" / "tputorch.json").read_text())


@needs_helm
def test_image_digest_wins_over_tag():
    digest = "sha256:" + "ab" * 32
    docs = render("image.repository=us-docker.pkg.dev/p/r/tputorch-operator", "image.tag=9.9.9",
                  f"image.digest={digest}")
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"us-docker.pkg.dev/p/r/tputorch-operator@{digest}"
    docs = render("image.repository=us-docker.pkg.dev/p/r/tputorch-operator", "image.tag=9.9.9")
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "us-docker.pkg.dev/p/r/tputorch-operator:9.9.9"


@needs_helm
def test_scheduling_and_pull_values_reach_the_pod():
    docs = render("imagePullSecrets[0].name=regcred", "nodeSelector.pool=system",
                  "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
                  "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=cloud.google.com/gke-tpu-accelerator",
                  "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=DoesNotExist",
                  "priorityClassName=system-cluster-critical")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0]["operator"] == "DoesNotExist"
    assert pod["priorityClassName"] == "system-cluster-critical"


def render_notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as helm renders it. `helm template` skips NOTES and `helm install --dry-run` needs a
    cluster, so a copy of the chart renders the same text through `tpl` into a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(CHART / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n'
        'data: {notes: {{ tpl (.Files.Get "notes.txt") . | toJson }}}\n')
    args = ["template", RELEASE, str(chart), "--namespace", NS, "--show-only", "templates/zz-notes.yaml"]
    for s in sets:
        args += ["--set", s]
    return yaml.safe_load(helm(*args).stdout)["data"]["notes"]


@needs_helm
def test_notes_say_what_to_apply_next(tmp_path):
    notes = render_notes(tmp_path)
    assert "kubectl apply -f examples/v6e-4x4.yaml" in notes
    assert "kubectl get ttj" in notes
    assert "every namespace" in notes
    assert "kubectl apply --server-side -f charts/tputorch-operator/crds/" in notes
    assert "deployment/tto-tputorch-operator" in notes
    notes = render_notes(tmp_path / "ns", "watchNamespaces={team-a,team-b}")
    assert "kubectl apply -n team-a -f examples/v6e-4x4.yaml" in notes
    assert "kubectl get ttj -n team-a" in notes
    assert "team-a, team-b" in notes
    notes = render_notes(tmp_path / "sm", "metrics.enabled=true", "metrics.serviceMonitor.enabled=true")
    assert "does not serve" in notes and "no ServiceMonitor was created" in notes


# --- values.schema.json refuses bad values --------------------------------------------------

BAD_VALUES = {
    "no-replicas": ["--set", "replicaCount=0"],
    "replicas-as-string": ["--set-string", "replicaCount=1"],
    "unknown-key": ["--set", "replicas=1"],
    "typo-nested": ["--set", "image.tags=1.0"],
    "bad-digest": ["--set", "image.digest=latest"],
    "bad-namespace-name": ["--set", "watchNamespaces={Team_A}"],
    "namespaces-not-a-list": ["--set", "watchNamespaces=team-a"],
    "log-format": ["--set", "logFormat=xml"],
    "port-type": ["--set-string", "metrics.port=metrics"],
    "bool-type": ["--set-string", "metrics.enabled=yes"],
    "pull-policy": ["--set", "image.pullPolicy=Sometimes"],
    "no-pods": ["--set", "maxPodsPerJob=0"],
    "pods-as-string": ["--set-string", "maxPodsPerJob=many"],
    "key-secret-name": ["--set", "rayTokenKey.existingSecret=Not_A_Name"],
}


@needs_helm
@pytest.mark.parametrize("args", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_schema_refuses_bad_values(args):
    out = helm("template", RELEASE, str(CHART), *args, check=False)
    assert out.returncode != 0, f"helm template {' '.join(args)} was accepted"
    assert "values don't meet the specifications of the schema" in out.stderr, out.stderr


@needs_helm
@pytest.mark.parametrize("value", ["x\n      hostPID: true", "x\nhostNetwork: true", "Has-Capitals", "a b"])
def test_priority_class_cannot_inject_pod_fields(value):
    proc = subprocess.run([HELM, *helm_args(["template", RELEASE, str(CHART), "--set-string", f"priorityClassName={value}"])],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "priorityClassName" in proc.stderr, proc.stdout[-2000:]


@needs_helm
def test_a_valid_priority_class_is_quoted_into_the_pod():
    pod = one(render("priorityClassName=team-high"), "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "team-high" and "hostPID" not in pod


# --- kubeVersion: the chart refuses a Kubernetes older than docs/compatibility.md's minimum --------

def test_the_charts_kube_version_is_the_documented_minimum():
    """docs/compatibility.md's minimum, as `tputorch doctor` holds it (test_doctor ties the two)."""
    from tputorch.cli.doctor.cluster import MIN_KUBERNETES

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">={}.{}.0-0".format(*MIN_KUBERNETES)


@needs_helm
def test_helm_refuses_a_kubernetes_below_the_minimum_and_takes_gkes_versions():
    old = helm("template", RELEASE, str(CHART), "--kube-version", "v1.28.15", check=False)
    assert old.returncode != 0 and "kubeVersion" in old.stderr and "v1.28.15" in old.stderr, old.stderr
    for version in ("v1.29.0", "v1.33.5-gke.1080000"):
        helm("template", RELEASE, str(CHART), "--kube-version", version)
