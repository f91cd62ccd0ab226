"""TPUTorchService end to end on the real API server with KubeRay's RayService controller: the
stand-in dashboard answers Ray Serve's REST API (PUT/GET /api/serve/applications/), so a service
goes Pending -> Deploying -> Ready with its endpoint and KubeRay's `<name>-serve-svc`."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import yaml
from kubernetes.client.rest import ApiException

import audit
from namespaces import delete_namespace, make_namespace
from operator_process import OperatorProcess, kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)
from test_operator_e2e import EXAMPLES, condition

GROUP, VERSION, PLURAL = "tputorch.io", "v1alpha1", "tputorchservices"
RAY = ("ray.io", "v1", "rayservices")


def service_body(name: str, topo: str = "2x2", **spec) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TPUTorchService", "metadata": {"name": name},
            "spec": {"tpu": {"accelerator": "v6e", "topology": topo}, "image": "example.com/ray-vllm-torchtpu:2.60.0",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "head": {"cpu": "1", "memory": "2Gi"},
                     "worker": {"cpu": "4", "memory": "16Gi"}, **spec}}


def apply(kube, ns, body, check=True):
    return kubectl(kube.kubeconfig, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body), check=check)


def status(kube, ns, name) -> dict:
    return kube.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}


def rayservice(kube, ns, name) -> dict | None:
    try:
        return kube.custom.get_namespaced_custom_object(*RAY[:2], ns, RAY[2], name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def wait_phase(kube, ns, name, phase, timeout=180):
    return kube.wait(lambda: (lambda s: s if s.get("phase") == phase else None)(status(kube, ns, name)),
                     timeout, f"TPUTorchService {ns}/{name} phase {phase}")


def ready_workers(kube, ns, name) -> int:
    pods = kube.core.list_namespaced_pod(ns, label_selector=f"tputorch.io/service={name},ray.io/node-type=worker").items
    return sum(1 for p in pods for c in p.status.conditions or [] if c.type == "Ready" and c.status == "True")


def phases_seen(kube, ns, name, until: str, timeout=240) -> list[str]:
    seen: list[str] = []

    def step():
        phase = status(kube, ns, name).get("phase")
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        return phase == until
    kube.wait(step, timeout, f"{name} {until}", interval=0.2)
    return seen


# -- a model that cannot load ------------------------------------------------------------------
# Failed with Ray's message at once; the slice is freed only by KubeRay's initializing timeout (40 s
# after creation here) and KubeRay's deletion delay for the Ray clusters it lets go (60 s, fixed by
# KubeRay when the RayService does not set it). The first test below sees the failure, the last one
# the slice freed: the tests between them run while KubeRay waits.
CANNOT_LOAD_MESSAGE = "Failed to update the deployments ['LLMServer:noload']."


@pytest.fixture(scope="module")
def cannot_load(kube, kube_env, tputorch_crd, dashboard, tmp_path_factory):
    """A service whose model cannot load, in a namespace of its own for the module (with an operator
    watching it), its Serve application reported DEPLOY_FAILED by the stand-in dashboard."""
    ns = make_namespace(kube, f"cannot-load-{uuid.uuid4().hex[:5]}")
    op = OperatorProcess(kube.kubeconfig, tmp_path_factory.mktemp("cannot-load") / "operator.log", [ns],
                         dashboard_url=kube_env["dashboard_url"])
    try:
        op.start()
        before = dashboard._call("GET", "/default")["serve_ready_after"]
        dashboard.set_serve_ready_after(600)  # never RUNNING by itself; restored for the tests after this
        try:
            apply(kube, ns, service_body("noload", serve={"initializingTimeoutSeconds": 40}))
            kube.wait(lambda: dashboard.serve(ns, "noload"), 120, "the Serve config put on the pending cluster")
            dashboard.set_serve_status(ns, "noload", "DEPLOY_FAILED", message=CANNOT_LOAD_MESSAGE)
        finally:
            dashboard.set_serve_ready_after(before)
        yield ns
    finally:
        op.stop()
        delete_namespace(kube, ns)
    assert "Traceback" not in op.log(), op.log()[-5000:]


def test_a_model_that_cannot_load_fails_with_rays_message(kube, cannot_load):
    st = wait_phase(kube, cannot_load, "noload", "Failed", 60)
    failed = condition(st, "Failed")
    assert failed["reason"] == "DeployFailed" and failed["message"].startswith(CANNOT_LOAD_MESSAGE)


def test_the_reference_service_deploys_and_reports_its_endpoint(kube, namespace, operator, dashboard):
    dashboard.set_serve_ready_after(3)
    body = yaml.safe_load((EXAMPLES / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
    name = body["metadata"]["name"]
    # the Hugging Face token Secret it names, made first as docs/tasks/serving.md says (its pods wait for it)
    hf = body["spec"]["model"]["hfTokenSecret"]
    kubectl(kube.kubeconfig, "create", "secret", "generic", hf["name"], "-n", namespace, f"--from-literal={hf['key']}=hf_x")
    # Exposed as docs/tasks/expose-a-service.md's internal load balancer: KubeRay makes <name>-serve-svc from it.
    internal = {"networking.gke.io/load-balancer-type": "Internal"}
    body["spec"]["exposure"] = {"serveService": {"type": "LoadBalancer", "annotations": internal,
                                                 "loadBalancerSourceRanges": ["10.0.0.0/8"]}}
    apply(kube, namespace, body)
    seen = phases_seen(kube, namespace, name, "Ready")
    assert seen[0] == "Pending" and "Deploying" in seen, seen
    st = status(kube, namespace, name)
    assert st["endpoint"] == f"http://{name}-serve-svc.{namespace}.svc.cluster.local:8000/v1"
    assert condition(st, "Ready")["status"] == "True" and st["readyReplicas"] == 1
    assert st["hosts"] == 4 and st["readyHosts"] == 4
    rs = rayservice(kube, namespace, name)
    assert rs["metadata"]["ownerReferences"][0]["uid"] == kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name)["metadata"]["uid"]
    group = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert group["numOfHosts"] == 4
    svc = kube.core.read_namespaced_service(f"{name}-serve-svc", namespace)
    assert [p.port for p in svc.spec.ports] == [8000]
    # KubeRay 1.6.2's Service from spec.exposure.serveService: our type, annotation, ranges and labels,
    # its selector of the active cluster's serving pods.
    assert (svc.spec.type, svc.spec.load_balancer_source_ranges) == ("LoadBalancer", ["10.0.0.0/8"]), svc.spec
    assert internal.items() <= (svc.metadata.annotations or {}).items(), svc.metadata.annotations
    assert svc.metadata.labels["tputorch.io/service"] == name, svc.metadata.labels
    assert svc.spec.selector == {"ray.io/cluster": st["rayClusterName"], "ray.io/serve": "true"}, svc.spec.selector
    assert 'tputorch_services{phase="Ready"} 1' in operator.metrics()
    # GKE's readiness rule (the stand-in's prober): KubeRay's worker probe asks the Serve proxy,
    # which only the host with the LLM replica runs; the other three hosts stay NotReady, and the
    # service is Ready with 4/4 hosts up all the same.
    kube.wait(lambda: ready_workers(kube, namespace, name) == 1, 30, "one Ready worker of four")
    st = status(kube, namespace, name)
    assert (st["phase"], st["readyHosts"], st["replicasReady"]) == ("Ready", 4, "1/1")


def test_an_edit_of_replicas_and_engine_reaches_the_rayservice_and_its_running_raycluster(kube, namespace, operator, dashboard):
    dashboard.set_serve_ready_after(1)
    apply(kube, namespace, service_body("edited"))
    wait_phase(kube, namespace, "edited", "Ready")
    apply(kube, namespace, service_body("edited", replicas={"min": 1, "max": 2}, engine={"maxModelLen": 4096}))

    def edited():
        rs = rayservice(kube, namespace, "edited")
        group = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
        return rs if group["maxReplicas"] == 2 and "max_model_len: 4096" in rs["spec"]["serveConfigV2"] else None
    rs = kube.wait(edited, 60, "the edit on the RayService")
    assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    st = kube.wait(lambda: (lambda s: s if s.get("observedGeneration") == 2 else None)(status(kube, namespace, "edited")),
                   60, "status of generation 2")
    assert st["phase"] in ("Updating", "Ready")
    wait_phase(kube, namespace, "edited", "Ready")
    # Issue 35: KubeRay's cluster hash leaves out min/max, so the running RayCluster (whose bounds
    # the Ray autoscaler reads) gets them from the operator, not from the RayService.
    active = rayservice(kube, namespace, "edited")["status"]["activeServiceStatus"]["rayClusterName"]

    def bounds():
        rc = kube.custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", active)
        (group,) = rc["spec"]["workerGroupSpecs"]
        return (group.get("minReplicas"), group.get("maxReplicas"))
    kube.wait(lambda: bounds() == (1, 2), 60, "the running RayCluster's worker bounds 1..2")
    assert rayservice(kube, namespace, "edited")["status"]["activeServiceStatus"]["rayClusterName"] == active  # no new cluster


def test_a_rayservice_edited_by_hand_is_put_back_and_defaults_cause_no_patch(kube, namespace, operator, dashboard):
    dashboard.set_serve_ready_after(1)
    apply(kube, namespace, service_body("drift"))
    wait_phase(kube, namespace, "drift", "Ready")
    ours = rayservice(kube, namespace, "drift")["spec"]["serveConfigV2"]
    # Many reconciles so far (KubeRay's status changes) against the API server's and KubeRay's
    # defaulted RayService: not one patch from the operator.
    assert audit.by_operator(audit.writes(namespace, "rayservices")) == []
    kubectl(kube.kubeconfig, "patch", "-n", namespace, "rayservice", "drift", "--type", "merge",
            "-p", json.dumps({"spec": {"serveConfigV2": "applications: []\n"}}))
    kube.wait(lambda: rayservice(kube, namespace, "drift")["spec"]["serveConfigV2"] == ours, 60,
              "the hand edit put back")
    wait_phase(kube, namespace, "drift", "Ready")
    # One patch; a second, the same, if a reconcile ran before the watch brought the first back.
    patches = audit.by_operator(audit.writes(namespace, "rayservices"))
    assert 1 <= len(patches) <= 2, [p["requestReceivedTimestamp"] for p in patches]
    assert all(p["verb"] == "patch" and p["requestObject"]["spec"]["serveConfigV2"] == ours for p in patches)


def test_an_invalid_service_is_refused_at_admission_and_by_the_operator(kube, namespace, operator):
    refused = apply(kube, namespace, service_body("bad-tp", engine={"tensorParallelSize": 2}), check=False)
    assert refused.returncode != 0 and "must equal 4, the chips of a 2x2" in refused.stderr
    # admitted by the schema (CEL cannot type engine.args), refused by the operator
    apply(kube, namespace, service_body("bad-args", engine={"args": {"distributed_executor_backend": "mp"}}))
    st = wait_phase(kube, namespace, "bad-args", "Failed", 60)
    assert condition(st, "Validated")["reason"] == "ValidationFailed"
    assert "spec.engine.args" in st["message"] and "distributed_executor_backend" in st["message"]
    assert rayservice(kube, namespace, "bad-args") is None


def test_deleting_the_service_removes_everything(kube, namespace, operator, dashboard):
    dashboard.set_serve_ready_after(1)
    apply(kube, namespace, service_body("gone"))
    wait_phase(kube, namespace, "gone", "Ready")
    kubectl(kube.kubeconfig, "delete", "-n", namespace, "tputorchservice", "gone", "--wait=true", "--timeout=60s")
    kube.wait(lambda: rayservice(kube, namespace, "gone") is None, 90, "RayService gone")
    kube.wait(lambda: not kube.core.list_namespaced_pod(namespace, label_selector="tputorch.io/service=gone").items,
              90, "pods gone")


def test_an_operator_restart_mid_deploy_makes_no_second_rayservice(kube, namespace, operator, dashboard):
    dashboard.set_serve_ready_after(6)
    apply(kube, namespace, service_body("restarted"))
    first = kube.wait(lambda: rayservice(kube, namespace, "restarted"), 60, "RayService")
    operator.kill()
    operator.start()
    wait_phase(kube, namespace, "restarted", "Ready")
    (only,) = kube.custom.list_namespaced_custom_object(*RAY[:2], namespace, RAY[2])["items"]
    assert only["metadata"]["uid"] == first["metadata"]["uid"]


def test_a_lost_replica_leaves_ready_and_comes_back(kube, namespace, operator, dashboard):
    dashboard.set_serve_ready_after(1)
    apply(kube, namespace, service_body("lossy"))
    wait_phase(kube, namespace, "lossy", "Ready")
    kube.wait(lambda: ready_workers(kube, namespace, "lossy") == 1, 30, "the replica's host Ready")
    # KubeRay stays Ready (the head's proxy answers); Serve reports the app UNHEALTHY.
    dashboard.set_serve_status(namespace, "lossy", "UNHEALTHY", message="The deployments ['LLMServer:lossy'] are UNHEALTHY.")
    st = wait_phase(kube, namespace, "lossy", "Degraded", 60)
    assert condition(st, "Ready")["status"] == "False" and "UNHEALTHY" in st["message"]
    kuberay_ready = [c for c in rayservice(kube, namespace, "lossy")["status"]["conditions"] if c["type"] == "Ready"]
    assert kuberay_ready[0]["status"] == "True"
    kube.wait(lambda: ready_workers(kube, namespace, "lossy") == 0, 30, "the lost replica's host NotReady")
    dashboard.set_serve_status(namespace, "lossy", "DEPLOYING")
    wait_phase(kube, namespace, "lossy", "Recovering", 60)
    dashboard.set_serve_status(namespace, "lossy", None)
    wait_phase(kube, namespace, "lossy", "Ready", 60)


def test_a_model_that_cannot_load_has_its_slice_freed_by_kuberays_initializing_timeout(kube, cannot_load):
    # KubeRay's initializing timeout (the annotation the operator wrote) deletes the Ray cluster.
    st = kube.wait(lambda: (lambda s: s if condition(s, "Failed")["reason"] == "InitializingTimeout" else None)(
        status(kube, cannot_load, "noload")), 120, "KubeRay's InitializingTimeout")
    assert st["phase"] == "Failed" and "released" in condition(st, "Failed")["message"]
    kube.wait(lambda: not kube.core.list_namespaced_pod(cannot_load, label_selector="tputorch.io/service=noload").items,
              120, "the slice's pods gone")


# -- edits KubeRay 1.6 never applies, and a new cluster that cannot start (issue 35, item 8) -----
# Each case on KubeRay 1.6.2's real RayService controller: what KubeRay does with the edit (no new
# RayCluster, or one that cannot be scheduled), the status it writes (recorded for the unit tests in
# tests/unit/status/data/rayservice-recorded.yaml: set TPUTORCH_RECORD_RAYSERVICES=1 to write it
# again), what the operator says, and what `tputorch wait` does with it.
NEVER_APPLIED_EDITS = {
    # name: (the service's extra spec, the edit, SpecApplied's reason, the phase)
    "none-image": ({"upgradeStrategy": "None"}, {"image": "example.com/ray-vllm-torchtpu:2.60.1"},
                   "UpgradeStrategyNone", "Ready"),
    "tolerations": ({}, {"tolerations": [{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]},
                    "TolerationsNotApplied", "Ready"),
    # the local cluster's one v5p 2x2x2 slice: the upgrade's new RayCluster finds no second one
    "no-capacity": ({"tpu": {"accelerator": "v5p", "topology": "2x2x2"}}, {"image": "example.com/ray-vllm-torchtpu:2.60.1"},
                    "Unschedulable", "Updating"),
}


def test_edits_kuberay_never_applies_and_an_upgrade_that_cannot_start_are_said(kube, namespace, operator, dashboard):
    import recorded_rayservices
    from test_cli_submit import tputorch
    dashboard.set_serve_ready_after(1)
    for name, (extra, _, _, _) in NEVER_APPLIED_EDITS.items():
        apply(kube, namespace, service_body(name, **extra))
    for name in NEVER_APPLIED_EDITS:
        wait_phase(kube, namespace, name, "Ready")
    clusters = {name: rayservice(kube, namespace, name)["status"]["activeServiceStatus"]["rayClusterName"]
                for name in NEVER_APPLIED_EDITS}
    live = {name: rayservice(kube, namespace, name) for name in NEVER_APPLIED_EDITS}
    for name, (extra, edit, _, _) in NEVER_APPLIED_EDITS.items():
        apply(kube, namespace, service_body(name, **{**extra, **edit}))

    def said(name):
        st = status(kube, namespace, name)
        c = condition(st, "SpecApplied") or {}
        return st if st.get("observedGeneration") == 2 and c.get("reason") == NEVER_APPLIED_EDITS[name][2] else None
    for name, (_, _, reason, phase) in NEVER_APPLIED_EDITS.items():
        st = kube.wait(lambda n=name: said(n), 60, f"{name}: SpecApplied {reason}")
        assert st["phase"] == phase and condition(st, "SpecApplied")["status"] == "False", st
        assert condition(st, "Ready")["status"] == "True", st  # the old spec serves all along
    # What KubeRay did with each edit, seen over 3 of its 2 s requeues after the operator's patch.
    kube.wait(lambda: (rayservice(kube, namespace, "no-capacity")["status"].get("pendingServiceStatus") or {}).get("rayClusterName"),
              30, "the pending RayCluster of no-capacity")
    time.sleep(6)
    edited = {name: rayservice(kube, namespace, name) for name in NEVER_APPLIED_EDITS}
    for name in ("none-image", "tolerations"):
        st = edited[name]["status"]
        assert not (st.get("pendingServiceStatus") or {}).get("rayClusterName"), (name, st)
        assert st["activeServiceStatus"]["rayClusterName"] == clusters[name], (name, st)
    rc = kube.custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", clusters["none-image"])
    assert rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["image"].endswith(":2.60.0")  # not updated either
    rc = kube.custom.get_namespaced_custom_object("ray.io", "v1", namespace, "rayclusters", clusters["tolerations"])
    assert not any(t.get("key") == "team" for t in rc["spec"]["workerGroupSpecs"][0]["template"]["spec"].get("tolerations") or [])
    pending = edited["no-capacity"]["status"]["pendingServiceStatus"]["rayClusterName"]
    assert pending != clusters["no-capacity"]
    # The operator's statuses were derived from these KubeRay statuses: they are the recorded ones.
    recorded_rayservices.check_or_record({"before": live, "edited": edited})
    # `tputorch wait --for phase=Ready` ends at once, failed, for an edit that is never applied;
    # for the upgrade that cannot start it waits (the phase is Updating) until its timeout.
    for name in ("none-image", "tolerations"):
        waited = tputorch(kube, "wait", name, "-n", namespace, "--for", "phase=Ready", "--timeout", "1m")
        assert waited.returncode == 1 and "keeps serving its previous spec (Ready)" in waited.stderr, waited
        assert condition(status(kube, namespace, name), "SpecApplied")["message"] in waited.stderr, waited
    waited = tputorch(kube, "wait", "no-capacity", "-n", namespace, "--for", "phase=Ready", "--timeout", "3s")
    assert waited.returncode == 1 and "timed out after 3s" in waited.stderr, waited
    st = status(kube, namespace, "no-capacity")
    assert f"the new RayCluster {pending} cannot start" in condition(st, "SpecApplied")["message"], st
