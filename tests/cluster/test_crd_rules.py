"""Both CRDs at a real API server: what admission refuses (with which message), which edits are
immutable, and that the statuses the operator derives are stored as written (no field pruned, every
condition a valid metav1.Condition). No operator runs here: this is the API server alone.
"""

from __future__ import annotations

import json

import pytest
import yaml

from operator_process import REPO, kubectl

from tputorch.api import crd, spec
from tputorch.api.groups import MAX_GROUPS
from tputorch import render, status
from tputorch.render.service import rayservice_spec_hash

NOW = "2026-11-29T10:00:00Z"


@pytest.fixture(scope="module")
def crds(kube):
    for name in crd.FILES.values():
        kubectl(kube.kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds" / name))
    for definition in crd.crd():
        kubectl(kube.kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{definition['metadata']['name']}")
    return kube.kubeconfig


def job(name="train", **spec_extra):
    return {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.com/img:1",
                     "entrypoint": "python train.py", "suspend": True, **spec_extra}}


def service(name="qwen", **spec_extra):
    return {"apiVersion": crd.API_VERSION, "kind": crd.SERVICE_KIND, "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.com/vllm:1",
                     "model": {"source": "Qwen/Qwen3-30B-A3B"}, **spec_extra}}


def create(kubeconfig, ns, body):
    return kubectl(kubeconfig, "-n", ns, "create", "-f", "-", input=yaml.safe_dump(body), check=False)


def refused(kubeconfig, ns, body, *fragments):
    proc = create(kubeconfig, ns, body)
    assert proc.returncode != 0, f"admitted: {body}"
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr
    return proc.stderr


def get(kubeconfig, ns, plural, name):
    return json.loads(kubectl(kubeconfig, "-n", ns, "get", plural, name, "-o", "json").stdout)


def patch(kubeconfig, ns, plural, name, body, kind="merge", subresource=None):
    args = ["-n", ns, "patch", plural, name, "--type", kind, "-p", json.dumps(body)]
    if subresource:
        args += ["--subresource", subresource]
    return kubectl(kubeconfig, *args, check=False)


# --- TPUTorchJob -----------------------------------------------------------------------------


def test_job_every_spec_field_but_suspend_is_immutable(crds, namespace):
    extra = {"queueName": "q", "env": [{"name": "A", "value": "1"}], "runtimeEnv": {"pip": ["x"]}}
    assert create(crds, namespace, job(**extra)).returncode == 0
    edits = {
        "image": ("merge", {"spec": {"image": "example.com/img:2"}}),
        "entrypoint": ("merge", {"spec": {"entrypoint": "python other.py"}}),
        "head": ("merge", {"spec": {"head": {"cpu": "3"}}}),
        "env": ("merge", {"spec": {"env": [{"name": "A", "value": "2"}]}}),
        "runtimeEnv": ("merge", {"spec": {"runtimeEnv": {"pip": ["y"]}}}),
        # An optional field added, and one removed: a rule on the field alone would miss both.
        "activeDeadlineSeconds": ("merge", {"spec": {"activeDeadlineSeconds": 60}}),
        "queueName": ("json", [{"op": "remove", "path": "/spec/queueName"}]),
    }
    for field, (kind, body) in edits.items():
        proc = patch(crds, namespace, crd.PLURAL, "train", body, kind)
        assert proc.returncode != 0, f"edit of spec.{field} admitted"
        assert f"spec.{field} is immutable: delete the TPUTorchJob and create it again" in proc.stderr, proc.stderr
    proc = patch(crds, namespace, crd.PLURAL, "train", {"spec": {"tpu": {"topology": "2x2"}}})
    assert proc.returncode != 0 and "spec.tpu is immutable" in proc.stderr
    # suspend is the one field a running job takes.
    assert patch(crds, namespace, crd.PLURAL, "train", {"spec": {"suspend": False}}).returncode == 0
    assert get(crds, namespace, crd.PLURAL, "train")["spec"]["suspend"] is False
    assert get(crds, namespace, crd.PLURAL, "train")["spec"]["queueName"] == "q"


@pytest.mark.parametrize("plural,body,child", [(crd.PLURAL, job, "RayJob"), (crd.SERVICE_PLURAL, service, "RayService")])
def test_names_must_be_dns_1035_labels_of_at_most_47(crds, namespace, plural, body, child):
    for bad in ("1train", "my.job"):  # valid object names, but no valid RayJob/RayService name
        refused(crds, namespace, body(name=bad), "metadata.name must be a DNS-1035 label", child)
    refused(crds, namespace, body(name="a" * 48), "metadata.name must be at most 47 characters", child)
    assert create(crds, namespace, body(name="a" * 47)).returncode == 0


TPU_GROUP = {"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "4x4"}}


def test_job_groups_admitted_with_defaults_and_the_rl_examples(crds, namespace):
    groups = [TPU_GROUP, {"name": "gen", "gpu": {"type": "nvidia-h100-80gb", "count": 8}}, {"name": "reward"}]
    assert create(crds, namespace, job(name="rl", groups=groups)).returncode == 0
    stored = get(crds, namespace, crd.PLURAL, "rl")["spec"]["groups"]
    assert [g["replicas"] for g in stored] == [1, 1, 1] and stored[2]["cpu"] == "8" and stored[2]["memory"] == "32Gi"
    for example in ("tpu-tpu", "tpu-gpu"):
        body = yaml.safe_load((REPO / "examples" / "rl" / f"{example}.yaml").read_text())
        assert create(crds, namespace, body).returncode == 0, example


@pytest.mark.parametrize("groups,fragments", [
    ([{**TPU_GROUP, "gpu": {"type": "nvidia-l4"}}], ["never both"]),
    ([{"name": "tpu-slice"}], ["must not be head, submitter, tpu-slice"]),
    ([{"name": "Bad"}], ["spec.groups[0].name"]),
    ([{"name": "a"}, {"name": "a"}], ["Duplicate value"]),
    ([{"name": f"g{i}"} for i in range(MAX_GROUPS + 1)], ["spec.groups", f"must have at most {MAX_GROUPS} items"]),
    ([{"name": "r", "tpu": {"accelerator": "v6e", "topology": "3x3"}}], ["topology 3x3 is not a v6e slice on GKE"]),
    ([{"name": "r", "gpu": {"type": "nvidia-k80"}}], ["spec.groups[0].gpu.type"]),
    ([{"name": "r", "gpu": {"type": "nvidia-h200-141gb", "count": 2}}], ["gpu.count must be one of 8 for nvidia-h200-141gb"]),
    ([{**TPU_GROUP, "replicas": 17}], ["a TPU group's replicas (slices) must be at most 16"]),
])
def test_job_group_admission_refusals(crds, namespace, groups, fragments):
    refused(crds, namespace, job(name="rl", groups=groups), *fragments)
    with pytest.raises(spec.InvalidSpec):  # the operator (and tputorch validate) refuse them too
        spec.parse(job(name="rl", groups=groups))


# --- TPUTorchService -------------------------------------------------------------------------


def test_service_defaults_and_the_reference_example(crds, namespace):
    assert create(crds, namespace, service()).returncode == 0
    stored = get(crds, namespace, crd.SERVICE_PLURAL, "qwen")["spec"]
    assert stored["engine"]["pipelineParallelSize"] == 1 and stored["engine"]["enableExpertParallel"] is False
    assert stored["replicas"] == {"min": 1}
    example = yaml.safe_load((REPO / "examples" / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
    assert create(crds, namespace, example).returncode == 0


@pytest.mark.parametrize("spec_extra,fragments", [
    ({"engine": {"tensorParallelSize": 8}}, ["must equal 16, the chips of a", "4x4"]),
    ({"engine": {"tensorParallelSize": 8, "pipelineParallelSize": 4}}, ["must equal 16, the chips"]),
    ({"engine": {"pipelineParallelSize": 3}}, ["must equal 16, the chips"]),
    ({"engine": {"maxModelLen": 0}}, ["spec.engine.maxModelLen"]),
    ({"replicas": {"min": 3, "max": 2}}, ["spec.replicas.max must be at least spec.replicas.min"]),
    ({"replicas": {"min": -1}}, ["spec.replicas.min"]),
    ({"replicas": {"min": 0}}, ["spec.replicas.max is required when spec.replicas.min is 0"]),
    ({"replicas": {"min": 2, "max": 2, "idleTimeoutSeconds": 600}}, ["spec.replicas.idleTimeoutSeconds is set only with"]),
    ({"replicas": {"min": 1, "max": 2, "idleTimeoutSeconds": 59}}, ["spec.replicas.idleTimeoutSeconds"]),
    ({"tpu": {"accelerator": "v6e", "topology": "4x4", "slices": 2}}, ["each model replica of a TPUTorchService is one whole slice"]),
    ({"tpu": {"accelerator": "v6e", "topology": "4x5"}}, ["topology 4x5 is not a v6e slice on GKE"]),
    ({"model": {"source": ""}}, ["spec.model.source"]),
    ({"model": {"name": "x"}}, ["spec.model.source"]),
    ({"exposure": {"clients": "Listed"}}, ["spec.exposure.from lists the clients exactly when"]),
    ({"exposure": {"clients": "InNamespace", "from": [{"namespace": "web"}]}}, ["spec.exposure.from lists the clients"]),
    ({"exposure": {"clients": "Everyone"}}, ["spec.exposure.clients"]),
    ({"exposure": {"clients": "Listed", "from": [{"cidr": "10.0.0.0/8", "namespace": "web"}]}},
     ["a client sets cidr, or namespace and/or podLabels"]),
    ({"exposure": {"clients": "Listed", "from": [{}]}}, ["a client sets cidr, or namespace and/or podLabels"]),
    ({"exposure": {"clients": "Listed", "from": [{"cidr": "10.0.0/8"}]}}, ["cidr must be a CIDR block"]),
    ({"exposure": {"serveService": {"type": "NodePort"}}}, ["spec.exposure.serveService.type"]),
    ({"exposure": {"serveService": {"loadBalancerSourceRanges": ["10.0.0.0/8"]}}},
     ["loadBalancerSourceRanges may be set only when its type is LoadBalancer"]),
    ({"exposure": {"serveService": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0/8"]}}},
     ["loadBalancerSourceRanges must be CIDR blocks"]),
    ({"exposure": {"serveService": {"annotations": {"a": 1}}}}, ["spec.exposure.serveService.annotations.a"]),
])
def test_service_admission_refusals(crds, namespace, spec_extra, fragments):
    refused(crds, namespace, service(**spec_extra), *fragments)
    # The operator's parser refuses the same bodies (tputorch validate would say why).
    with pytest.raises(spec.InvalidSpec):
        spec.parse_service(service(**spec_extra))


@pytest.mark.parametrize("args", [{"tensor_parallel_size": 16}, {"maxModelLen": 16}, {"distributed_executor_backend": "mp"}])
def test_engine_args_are_the_operators_to_refuse(crds, namespace, args):
    """CEL cannot see the keys of the free-form engine.args: the API server admits them, the
    operator's parser (and tputorch validate) refuses them, and its status says why."""
    body = service(engine={"args": args})
    assert create(crds, namespace, body).returncode == 0
    with pytest.raises(spec.InvalidSpec) as err:
        spec.parse_service(body)
    assert [e.path for e in err.value.errors] == [f"spec.engine.args.{next(iter(args))}"]


def test_a_services_exposure_is_admitted_as_the_parser_takes_it(crds, namespace):
    listed = {"clients": "Listed", "from": [{"namespace": "web", "podLabels": {"app": "front"}}, {"cidr": "10.8.0.0/16"}]}
    for i, exposure in enumerate(({"clients": "InNamespace"}, listed)):
        assert create(crds, namespace, service(f"exposed{i}", exposure=exposure)).returncode == 0
        assert spec.parse_service({**service(f"exposed{i}", exposure=exposure),
                                   "metadata": {"name": f"exposed{i}", "namespace": namespace}}).exposure.clients == exposure["clients"]
    assert get(crds, namespace, crd.SERVICE_PLURAL, "exposed1")["spec"]["exposure"] == listed


def test_service_edits_are_admitted_but_not_of_the_slice(crds, namespace):
    assert create(crds, namespace, service(replicas={"min": 1, "max": 1})).returncode == 0
    for body in ({"spec": {"replicas": {"max": 3}}}, {"spec": {"engine": {"maxModelLen": 4096, "args": {"dtype": "bfloat16"}}}},
                 {"spec": {"image": "example.com/vllm:2"}}, {"spec": {"model": {"name": "renamed"}}}):
        proc = patch(crds, namespace, crd.SERVICE_PLURAL, "qwen", body)
        assert proc.returncode == 0, proc.stderr
    stored = get(crds, namespace, crd.SERVICE_PLURAL, "qwen")["spec"]
    assert stored["replicas"] == {"min": 1, "max": 3} and stored["engine"]["maxModelLen"] == 4096
    proc = patch(crds, namespace, crd.SERVICE_PLURAL, "qwen", {"spec": {"tpu": {"topology": "8x8"}}})
    assert proc.returncode != 0
    assert "spec.tpu is immutable: delete the TPUTorchService and create it again" in proc.stderr


def test_the_serve_service_is_admitted_as_the_parser_takes_it_and_is_immutable(crds, namespace):
    internal = {"type": "LoadBalancer", "annotations": {"networking.gke.io/load-balancer-type": "Internal"},
                "loadBalancerSourceRanges": ["10.0.0.0/8"]}
    body = service("lb", exposure={"serveService": internal})
    assert create(crds, namespace, body).returncode == 0
    assert spec.parse_service({**body, "metadata": {"name": "lb", "namespace": namespace}}).exposure.serve_service.type == "LoadBalancer"
    assert get(crds, namespace, crd.SERVICE_PLURAL, "lb")["spec"]["exposure"]["serveService"] == internal
    # KubeRay would not carry an edit to the Service: refused, whether changed, added or removed.
    assert create(crds, namespace, service("plain")).returncode == 0
    for name, edit in (("lb", {"type": "ClusterIP", "loadBalancerSourceRanges": None}), ("lb", None),
                       ("plain", {"type": "LoadBalancer"})):
        proc = patch(crds, namespace, crd.SERVICE_PLURAL, name, {"spec": {"exposure": {"serveService": edit}}})
        assert proc.returncode != 0 and "spec.exposure.serveService is immutable" in proc.stderr, (name, edit, proc.stderr)
    # The rest of exposure stays editable.
    proc = patch(crds, namespace, crd.SERVICE_PLURAL, "lb", {"spec": {"exposure": {"clients": "InNamespace"}}})
    assert proc.returncode == 0, proc.stderr


# --- status: what the operator writes is stored as written -------------------------------------


def pods(n_ready, hosts=4):
    return [{"metadata": {"name": f"w{i}", "labels": {"ray.io/node-type": "worker"}},
             "status": {"conditions": [{"type": "Ready", "status": "True" if i < n_ready else "False"}]}} for i in range(hosts)]


def test_derived_statuses_are_accepted_and_nothing_is_pruned(crds, namespace):
    assert create(crds, namespace, job()).returncode == 0
    assert create(crds, namespace, service()).returncode == 0
    job_spec = spec.parse({**job(), "metadata": {"name": "train", "namespace": namespace}})
    svc_spec = spec.parse_service({**service(), "metadata": {"name": "qwen", "namespace": namespace}})
    rayjob = {"status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "train-abcde",
                         "dashboardURL": "train-head-svc:8265", "jobId": "train-x", "startTime": NOW}}
    rs = render.rayservice(svc_spec)
    rs["metadata"]["generation"] = 1
    rs["status"] = {"serviceStatus": "Running", "observedGeneration": 1,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints", "message": "ok", "lastTransitionTime": NOW}],
                    "activeServiceStatus": {"rayClusterName": "qwen-abcde", "applicationStatuses": {"llm": {"status": "RUNNING", "message": "fine"}}}}
    cases = [
        (crd.PLURAL, "train", status.derive(job_spec, 1, rayjob, pods(4), {}, NOW)),
        (crd.PLURAL, "train", status.invalid([spec.FieldError("spec.image", "", "must not be empty")], 1, {}, NOW)),
        (crd.SERVICE_PLURAL, "qwen", status.derive_service(svc_spec, 1, rs, pods(4), {}, NOW,
                                                           desired_hash=rayservice_spec_hash(svc_spec))),
        (crd.SERVICE_PLURAL, "qwen", status.derive_service(svc_spec, 1, None, [], {}, NOW, ("KubeRayNotInstalled", "install KubeRay"),
                                                           desired_hash=rayservice_spec_hash(svc_spec))),
    ]
    for plural, name, derived in cases:
        previous = get(crds, namespace, plural, name).get("status") or {}
        proc = patch(crds, namespace, plural, name, {"status": status.patch_for(previous, derived)}, subresource="status")
        assert proc.returncode == 0, proc.stderr
        assert get(crds, namespace, plural, name)["status"] == derived


def test_a_condition_that_is_not_a_metav1_condition_is_refused(crds, namespace):
    assert create(crds, namespace, service()).returncode == 0
    bad = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # no reason, message, time
    proc = patch(crds, namespace, crd.SERVICE_PLURAL, "qwen", bad, subresource="status")
    assert proc.returncode != 0 and "lastTransitionTime" in proc.stderr and "reason" in proc.stderr


# --- what the operator renders fits KubeRay's own CRDs -----------------------------------------


GOLDEN = sorted((REPO / "tests" / "unit" / "render" / "golden").glob("*.yaml"))


def test_every_golden_child_is_accepted_by_kuberays_crds_with_no_unknown_field(crds, namespace):
    """Server-side dry run with strict field validation: a field KubeRay's schema does not know
    (which the API server would otherwise prune silently) fails here, as does any schema error."""
    assert {p.stem.split("-")[0] for p in GOLDEN} >= {"service", "v6e"}
    for path in GOLDEN:
        child = yaml.safe_load(path.read_text())
        child["metadata"]["namespace"] = namespace
        proc = kubectl(crds, "create", "--dry-run=server", "--validate=strict", "-f", "-", input=yaml.safe_dump(child), check=False)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"
        assert "Warning" not in proc.stderr, f"{path.name}: {proc.stderr}"


def test_every_golden_childs_pods_pass_the_api_servers_pod_validation(crds, namespace):
    """KubeRay's CRD keeps pod templates loosely typed; the API server checks a pod only when
    KubeRay creates it. Each template (head and TPU hosts), made into a Pod as KubeRay would, passes
    a server-side dry run: volumes and their mounts (gcs CSI, PVC, emptyDir), annotations, resources."""
    pods = []
    for path in GOLDEN:
        child = yaml.safe_load(path.read_text())
        cluster = child["spec"].get("rayClusterSpec") or child["spec"]["rayClusterConfig"]
        templates = [("head", cluster["headGroupSpec"]["template"])] + [
            (g["groupName"], g["template"]) for g in cluster["workerGroupSpecs"]]
        for role, template in templates:
            name = f"{path.stem[:40]}-{role}"[:63].rstrip("-")
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {**template["metadata"], "name": name, "namespace": namespace},
                         "spec": template["spec"]})
    assert any("volumes" in p["spec"] for p in pods)
    assert {v.get("csi", {}).get("driver") for p in pods for v in p["spec"].get("volumes", [])} >= {"gcsfuse.csi.storage.gke.io"}
    # The ServiceAccount admission plugin refuses a pod whose account does not exist (as on GKE).
    for account in sorted({p["spec"]["serviceAccountName"] for p in pods if p["spec"].get("serviceAccountName")}):
        kubectl(crds, "-n", namespace, "create", "serviceaccount", account)
    proc = kubectl(crds, "create", "--dry-run=server", "--validate=strict", "-f", "-",
                   input=yaml.safe_dump_all(pods), check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(pods), proc.stdout


def test_a_volume_with_two_sources_is_refused_at_admission(crds, namespace):
    bad = job(volumes=[{"name": "v", "mountPath": "/v", "pvc": {"claimName": "c"}, "emptyDir": {}}])
    proc = create(crds, namespace, bad)
    assert proc.returncode != 0 and "exactly one of gcs, pvc, emptyDir" in proc.stderr, proc.stderr


# --- specs the Pod API (or the runtime) would refuse later: refused at admission too (issue 39) ---

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _mount(path):
    return {"volumes": [{"name": "v", "mountPath": path, "emptyDir": {}}]}


@pytest.mark.parametrize("spec_extra,fragments", [
    ({"worker": {"memory": "1.5"}}, ["spec.worker.memory", "must be at least 256Mi"]),
    ({"head": {"memory": 64}}, ["spec.head.memory", "must be at least 256Mi"]),
    ({"groups": [{"name": "r", "memory": "1.5"}]}, ["spec.groups[0].memory", "must be at least 256Mi"]),
    ({"groups": [{"name": "r", "memory": "0"}]}, ["spec.groups[0].memory", "must be greater than zero"]),
    ({"groups": [{"name": "r", "cpu": "0"}]}, ["spec.groups[0].cpu", "must be greater than zero"]),
    ({"image": "example.com/img:1\n"}, ["spec.image"]),
    ({"image": " example.com/img:1"}, ["spec.image"]),
    ({"groups": [{"name": "r", "image": "cuda:12\nx"}]}, ["spec.groups[0].image"]),
    (_mount("/proc"), ["spec.volumes[0].mountPath", "must not be /dev/shm, /proc"]),
    (_mount("//proc/sys"), ["spec.volumes[0].mountPath"]),
    (_mount(TOKEN_DIR), ["spec.volumes[0].mountPath"]),
    (_mount(TOKEN_DIR + "/token"), ["spec.volumes[0].mountPath"]),
    ({"securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}, "allowPrivilegeEscalation": False}},
     ["spec.securityContext.allowPrivilegeEscalation", "must not be false with privileged or CAP_SYS_ADMIN"]),
    ({"securityContext": {"privileged": True, "allowPrivilegeEscalation": False}},
     ["spec.securityContext.allowPrivilegeEscalation"]),
])
def test_specs_the_pod_api_would_refuse_later_are_refused_at_admission(crds, namespace, spec_extra, fragments):
    refused(crds, namespace, job(name="late", **spec_extra), *fragments)
    with pytest.raises(spec.InvalidSpec):  # the operator (and tputorch validate) refuse them too
        spec.parse(job(name="late", **spec_extra))


def test_the_neighbours_of_those_refusals_are_admitted(crds, namespace):
    for i, extra in enumerate([{"worker": {"memory": "256Mi"}}, {"groups": [{"name": "r", "cpu": "500m", "memory": "1Gi"}]},
                               _mount("/proc-data"), _mount("/var/run/secrets/other"),
                               {"securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}}},
                               {"image": "us-docker.pkg.dev/p/r/ray@sha256:" + "a" * 64}]):
        proc = create(crds, namespace, job(name=f"fine-{i}", **extra))
        assert proc.returncode == 0, (extra, proc.stderr)
        spec.parse(job(name=f"fine-{i}", **extra))
