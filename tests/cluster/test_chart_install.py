"""The Helm chart against a real API server: Kubernetes' own schemas, install, and the RBAC it grants.

1. `helm template` (default, namespaced, metrics) | `kubectl apply --dry-run=server`: the API server
   validates every object against its real OpenAPI schemas; the pod template also passes the
   PodSecurity admission plugin at `restricted` level.
2. `helm install` of the packaged chart (`make release`'s `helm package`, hack/release.py) into the
   local cluster; the release's chart and app versions are the package's (tputorch.__version__). The Deployment's pod does not run the operator there (KWOK
   fakes kubelets: a pod is only a status), so the operator runs as a local process instead,
   authenticated with a token of the chart's ServiceAccount (`kubectl create token`).
3. `kubectl auth can-i --as=system:serviceaccount:<ns>:<sa>`: may create RayJobs and patch
   TPUTorchJob status; may not read Secrets nor create pods.
4. That operator, holding only the chart's RBAC, turns examples/v6e-4x4.yaml into a RayJob and writes
   the TPUTorchJob's status and Events, with no 403 in its log. The namespaced chart's operator
   watches its namespace. The cluster-wide chart's operator runs cluster-wide only with
   TPUTORCH_EXCLUSIVE_CLUSTER=1 (a cluster no other test uses: otherwise it would reconcile their
   jobs as a second operator); by default it watches the test's namespace with the cluster-wide
   grants, and kopf's refused namespace listing (namespaced kopf lists namespaces; the cluster-wide
   chart rightly does not grant it) is the one expected 403.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from tputorch import __version__

from doccmds import helm_args
from namespaces import delete_namespace, make_bucket_account, make_namespace
from operator_process import OperatorProcess, kubectl, tputorch_crd  # noqa: F401 (fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "image"))
from imagetools import image_info  # noqa: E402,F401 (fixture: the image `make image` built)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tputorch-operator"
EXAMPLE = REPO / "examples" / "v6e-4x4.yaml"


def _find_helm() -> str | None:
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    bin_dir = subprocess.run([str(REPO / "hack" / "build.sh"), "dir"], capture_output=True, text=True).stdout.strip()
    if bin_dir and os.access(os.path.join(bin_dir, "helm"), os.X_OK):
        return os.path.join(bin_dir, "helm")
    return shutil.which("helm")


HELM = _find_helm()
pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(HELM is None, reason="no helm binary (hack/build.sh helm, or set $HELM)")]


def helm(kubeconfig: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": kubeconfig, "HELM_CACHE_HOME": f"{tempfile.gettempdir()}/tputorch-helm/cache",
           "HELM_CONFIG_HOME": f"{tempfile.gettempdir()}/tputorch-helm/config", "HELM_DATA_HOME": f"{tempfile.gettempdir()}/tputorch-helm/data"}
    out = subprocess.run([HELM, *helm_args(args)], capture_output=True, text=True, timeout=180, env=env)
    if check:
        assert out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stderr}"
    return out


@pytest.fixture
def extra_namespaces(kube):
    made: list[str] = []

    def make(prefix: str, labels: dict | None = None) -> str:
        made.append(make_namespace(kube, f"{prefix}-{uuid.uuid4().hex[:5]}", labels))
        return made[-1]

    yield make
    for ns in made:
        delete_namespace(kube, ns, wait=False)


@pytest.fixture(scope="module")
def packaged_chart(tmp_path_factory) -> Path:
    """The chart as `make release` packages it (hack/release.py package_chart)."""
    spec = importlib.util.spec_from_file_location("release", REPO / "hack" / "release.py")
    release_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(release_py)
    return release_py.package_chart(REPO, tmp_path_factory.mktemp("dist"), HELM)


@pytest.fixture
def release(kube, namespace, tputorch_crd, image_info, packaged_chart):
    """helm install/uninstall of the packaged chart into the test namespace, with the image `make
    image` built; yields a function taking --set values."""
    installed: list[str] = []

    def install(*sets: str) -> dict:
        name = f"tto-{uuid.uuid4().hex[:6]}"
        args = ["install", name, str(packaged_chart), "--namespace", namespace]
        for s in (f"image.repository={image_info['repository']}", f"image.tag={image_info['tag']}", *sets):
            args += ["--set", s]
        out = helm(kube.kubeconfig, *args)
        installed.append(name)
        listed = json.loads(helm(kube.kubeconfig, "list", "--namespace", namespace, "--filter", f"^{name}$",
                                 "--output", "json").stdout)
        assert [(r["chart"], r["app_version"]) for r in listed] == [(f"tputorch-operator-{__version__}", __version__)], listed
        return {"name": name, "namespace": namespace, "sa": f"{name}-tputorch-operator", "stdout": out.stdout}

    yield install
    for name in installed:
        helm(kube.kubeconfig, "uninstall", name, "--namespace", namespace, check=False)


def can_i(kube, sa_user: str, *args: str) -> bool:
    out = kubectl(kube.kubeconfig, "auth", "can-i", f"--as={sa_user}", *args, check=False)
    assert out.stdout.strip() in ("yes", "no"), out.stderr
    return out.stdout.strip() == "yes"


def sa_kubeconfig(kube, namespace: str, sa: str, path: Path) -> str:
    """A kubeconfig that authenticates as the ServiceAccount itself (a bound token from the TokenRequest API)."""
    token = kubectl(kube.kubeconfig, "create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": sa}}],
        "current-context": "sa",
    }))
    path.chmod(0o600)
    return str(path)


PERMISSION_PROBLEMS = ("(403)", "HTTP 403", " 403 ", "Forbidden", "forbidden", "Not enough permissions", "Traceback")


# Set on a cluster no other test uses: then the cluster-wide chart's operator runs cluster-wide.
EXCLUSIVE = os.environ.get("TPUTORCH_EXCLUSIVE_CLUSTER") == "1"


def permission_problems(log: str, expected: tuple[str, ...] = ()) -> list[str]:
    """Log lines that show a refused API call, except the expected ones."""
    return [line for line in log.splitlines()
            if any(p in line for p in PERMISSION_PROBLEMS) and not any(e in line for e in expected)]


def run_example_as(kube, kubeconfig: str, namespaces: list[str], job_ns: str, log_path: Path,
                   lease: tuple[str, str]):
    """Run the operator with the given credentials and, as the chart does, leader election on the
    release's Lease (namespace, name); apply the v6e 4x4 example; return (rayjob, status, events, log)."""
    op = OperatorProcess(kubeconfig, log_path, namespaces,
                         extra_args=["--leader-elect", "--lease-namespace", lease[0], "--lease-name", lease[1]]).start()
    try:
        body = yaml.safe_load(EXAMPLE.read_text())
        name = body["metadata"]["name"]
        make_bucket_account(kube, job_ns)  # the example runs as it (namespaces.BUCKET_ACCOUNT)
        kubectl(kube.kubeconfig, "apply", "-n", job_ns, "-f", str(EXAMPLE))
        rayjob = kube.wait(lambda: kube.custom.get_namespaced_custom_object("ray.io", "v1", job_ns, "rayjobs", name),
                           60, "RayJob created by the operator")
        def written_status():
            job = kube.custom.get_namespaced_custom_object("tputorch.io", "v1alpha1", job_ns, "tputorchjobs", name)
            return (job.get("status") or {}).get("phase") and job["status"]

        status = kube.wait(written_status, 60, "TPUTorchJob status written by the operator")
        events = kube.wait(lambda: kube.core.list_namespaced_event(
            job_ns, field_selector=f"involvedObject.kind=TPUTorchJob,involvedObject.name={name}").items,
            90, "an Event on the TPUTorchJob (the first one is posted when the job turns Running)")
        time.sleep(3)  # every watch has started by now; let a late 403 (e.g. on a watch) reach the log
    finally:
        op.stop()
    return rayjob, status, events, op.log()


# --- 1. real schemas: server-side dry run -------------------------------------------------


@pytest.mark.parametrize("mode", ["default", "namespaced", "metrics"])
def test_rendered_chart_passes_server_side_dry_run(kube, namespace, tputorch_crd, mode):
    sets = {"default": [], "namespaced": [f"watchNamespaces={{{namespace}}}"],
            "metrics": ["metrics.enabled=true", "metrics.serviceMonitor.enabled=true"]}[mode]
    args = ["template", "dry", str(CHART), "--namespace", namespace, "--include-crds"]
    for s in sets:
        args += ["--set", s]
    manifest = helm(kube.kubeconfig, *args).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(manifest) if d)
    out = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "--server-side", "--force-conflicts",
                  "-f", "-", input=manifest)
    assert out.stdout.count("(server dry run)") == len(kinds), out.stdout
    if mode == "namespaced":
        # the watched namespace's Role, and the Lease's in the release namespace
        assert kinds.count("Role") == 2 and kinds.count("RoleBinding") == 2
    if mode == "metrics":
        assert "Service" in kinds and "ServiceMonitor" not in kinds  # no Prometheus Operator here


def test_an_upgrade_keeps_the_ray_token_key_and_its_previous_key(kube, namespace):
    """The chart's Secret as an upgrade renders it (`lookup` against this API server: helm's
    --dry-run=server): the key and, mid-rotation, the previous key are kept as they are."""
    import base64
    name = "keep-tputorch-operator-ray-token-key"  # the release "keep"'s fullname
    items = {"key": "c" * 64, "previousKey": "p" * 64}
    kubectl(kube.kubeconfig, "-n", namespace, "create", "secret", "generic", name,
            *[f"--from-literal={k}={v}" for k, v in items.items()])
    manifest = helm(kube.kubeconfig, "template", "keep", str(CHART), "--namespace", namespace, "--dry-run=server").stdout
    (secret,) = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Secret"]
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == items


def test_pod_template_is_admitted_at_restricted_pod_security(kube, extra_namespaces):
    ns = extra_namespaces("psa-restricted", {"pod-security.kubernetes.io/enforce": "restricted",
                                             "pod-security.kubernetes.io/enforce-version": "latest"})
    docs = [d for d in yaml.safe_load_all(helm(kube.kubeconfig, "template", "psa", str(CHART), "--namespace", ns).stdout) if d]
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    template = dep["spec"]["template"]
    kube.wait(lambda: kube.core.read_namespaced_service_account("default", ns), 30, "default ServiceAccount")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "psa-check", "namespace": ns,
                                                           "labels": template["metadata"]["labels"]},
           "spec": {**template["spec"], "serviceAccountName": "default"}}
    out = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False)
    assert out.returncode == 0, out.stderr
    assert "violate" not in out.stderr + out.stdout
    # the same pod without the security context is refused: the check really enforces
    bad = yaml.safe_load(yaml.safe_dump(pod))
    bad["spec"]["containers"][0].pop("securityContext")
    out = kubectl(kube.kubeconfig, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert out.returncode != 0 and "violates PodSecurity" in out.stderr, out.stderr


# --- 2-4. install, can-i, and the operator running with only the chart's RBAC ----------------


def test_helm_install_clusterwide_rbac_and_operator_as_its_serviceaccount(kube, namespace, release, image_info,
                                                                         extra_namespaces, tmp_path):
    rel = release()
    assert "kubectl apply -f examples/v6e-4x4.yaml" in rel["stdout"]
    deployments = kube.apps.list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deployments] == [rel["sa"]]
    assert [c.image for c in deployments[0].spec.template.spec.containers] == [image_info["name"]]
    assert deployments[0].spec.strategy.type == "RollingUpdate" and deployments[0].spec.replicas == 2
    user = f"system:serviceaccount:{namespace}:{rel['sa']}"
    job_ns = extra_namespaces("ttj")

    assert can_i(kube, user, "create", "rayjobs.ray.io", "-n", job_ns)
    assert can_i(kube, user, "patch", "rayjobs.ray.io", "-n", job_ns)
    assert can_i(kube, user, "patch", "tputorchjobs.tputorch.io", "--subresource=status", "-n", job_ns)
    assert can_i(kube, user, "watch", "tputorchjobs.tputorch.io", "--all-namespaces")
    assert can_i(kube, user, "list", "pods", "--all-namespaces")
    assert can_i(kube, user, "create", "events", "-n", job_ns)  # kopf's own warnings
    assert can_i(kube, user, "create", "events.events.k8s.io", "-n", job_ns)
    # Kueue's Workload CRD alone (its pod-set cap), by name; kopf's scanning is off: no other CRD
    assert can_i(kube, user, "watch", "customresourcedefinitions.apiextensions.k8s.io/workloads.kueue.x-k8s.io")
    assert not can_i(kube, user, "watch", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can_i(kube, user, "get", "customresourcedefinitions.apiextensions.k8s.io/rayjobs.ray.io")
    assert can_i(kube, user, "create", "rayservices.ray.io", "-n", job_ns)
    assert can_i(kube, user, "patch", "tputorchservices.tputorch.io", "--subresource=status", "-n", job_ns)
    assert can_i(kube, user, "update", "tputorchjobs.tputorch.io", "--subresource=finalizers", "-n", job_ns)
    assert can_i(kube, user, "update", f"leases.coordination.k8s.io/{rel['sa']}", "-n", namespace)
    assert not can_i(kube, user, "update", "leases.coordination.k8s.io/other-lease", "-n", namespace)
    assert not can_i(kube, user, "create", "leases.coordination.k8s.io", "-n", job_ns)
    assert not can_i(kube, user, "get", "secrets", "-n", job_ns)
    assert can_i(kube, user, "create", "secrets", "-n", job_ns)  # each Ray cluster's token Secret, written only
    for verb in ("update", "patch", "delete", "watch"):
        assert not can_i(kube, user, verb, "secrets", "-n", job_ns), verb
    assert not can_i(kube, user, "list", "secrets", "--all-namespaces")
    assert not can_i(kube, user, "get", "secrets", "-n", namespace)
    assert not can_i(kube, user, "create", "pods", "-n", job_ns)
    assert not can_i(kube, user, "create", "pods", "--subresource=exec", "-n", job_ns)
    # A retried attempt's RayJob is deleted by the operator (issue 23); RayServices never are.
    assert can_i(kube, user, "delete", "rayjobs.ray.io", "-n", job_ns)
    assert not can_i(kube, user, "delete", "rayservices.ray.io", "-n", job_ns)
    assert not can_i(kube, user, "update", "tputorchjobs.tputorch.io", "-n", job_ns)
    assert not can_i(kube, user, "create", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can_i(kube, user, "list", "namespaces")  # kopf's scanning is off
    assert not can_i(kube, user, "create", "serviceaccounts", "--subresource=token", "-n", namespace)

    # Cluster-wide, the operator would also reconcile the jobs of other tests sharing this cluster (a
    # second operator on them): unless the cluster is exclusive, it watches only job_ns, with the
    # cluster-wide grants.
    config = sa_kubeconfig(kube, namespace, rel["sa"], tmp_path / "sa.kubeconfig")
    watch = [] if EXCLUSIVE else [job_ns]
    rayjob, status, events, log = run_example_as(kube, config, watch, job_ns, tmp_path / "operator.log",
                                                 lease=(namespace, rel["sa"]))
    # blockOwnerDeletion passed the OwnerReferencesPermissionEnforcement plugin: the finalizers grant
    assert rayjob["metadata"]["ownerReferences"][0]["kind"] == "TPUTorchJob"
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] == 4
    assert status["phase"] in ("Pending", "Running"), status
    assert status["rayJobName"] == rayjob["metadata"]["name"]
    assert events
    problems = permission_problems(log)  # namespaced too (unless exclusive): kopf lists no namespaces
    assert not problems, "\n".join(problems)


def test_helm_install_namespaced_rbac_and_operator_as_its_serviceaccount(kube, namespace, release,
                                                                        extra_namespaces, tmp_path):
    watched = extra_namespaces("watched")
    other = extra_namespaces("other")
    rel = release(f"watchNamespaces={{{watched}}}")
    user = f"system:serviceaccount:{namespace}:{rel['sa']}"

    assert can_i(kube, user, "create", "rayjobs.ray.io", "-n", watched)
    assert can_i(kube, user, "patch", "tputorchjobs.tputorch.io", "--subresource=status", "-n", watched)
    assert not can_i(kube, user, "list", "namespaces")  # kopf's scanning is off
    assert not can_i(kube, user, "create", "rayjobs.ray.io", "-n", other)
    assert not can_i(kube, user, "list", "tputorchjobs.tputorch.io", "--all-namespaces")
    assert not can_i(kube, user, "list", "pods", "-n", other)
    assert not can_i(kube, user, "get", "secrets", "-n", watched)
    assert not can_i(kube, user, "create", "pods", "-n", watched)
    assert not can_i(kube, user, "get", "namespaces", "-n", watched)

    config = sa_kubeconfig(kube, namespace, rel["sa"], tmp_path / "sa.kubeconfig")
    rayjob, status, events, log = run_example_as(kube, config, [watched], watched, tmp_path / "operator.log",
                                                 lease=(namespace, rel["sa"]))
    assert status["rayJobName"] == rayjob["metadata"]["name"]
    problems = permission_problems(log)
    assert not problems, "\n".join(problems)
