"""TPUTorchService status from KubeRay v1.5 RayService statuses and the slice's pods."""

import copy
import json
import pathlib

import pytest
import yaml

from tputorch import render, status
from tputorch.render.names import SERVE_APP
from tputorch.render.service import rayservice_spec_hash
from tputorch.api import phases, spec
from tputorch.status import applied

from ..services import service_body

STATUSES = yaml.safe_load((pathlib.Path(__file__).parent / "data" / "rayservice-statuses.yaml").read_text())
T0, T1 = "2026-11-29T10:00:00Z", "2026-11-29T10:01:00Z"
SVC = spec.parse_service(service_body(replicas={"min": 1, "max": 2}))
ENDPOINT = "http://qwen-serve-svc.ml.svc.cluster.local:8000/v1"


def rayservice(stage, svc=SVC, generation=None):
    obj = render.rayservice(svc)  # carries the spec hash of what the operator created
    obj["metadata"]["generation"] = generation or STATUSES[stage].get("observedGeneration", 1)
    obj["status"] = STATUSES[stage]
    return obj


def derive_service(svc, *args, **kw):
    """status.derive_service given the spec hash of the RayService ``svc`` renders, as the reconcile gives it."""
    return status.derive_service(svc, *args, desired_hash=rayservice_spec_hash(svc), **kw)


def derive(stage, pods=(), previous=None, svc=SVC, now=T0, **kw):
    rs = None if stage is None else rayservice(stage, svc)
    return derive_service(svc, 3, rs, list(pods), previous or {}, now, **kw)


def cond(st, ctype):
    return next((c for c in st["conditions"] if c["type"] == ctype), None)


def host(name, up, replica=None, cluster="qwen-k2x9p", role="worker", serve_ready=None):
    """A host pod: `up` = running. Its Ready condition is KubeRay's readiness probe, which for a
    RayService worker includes the Serve proxy: only the host with a Serve replica passes it."""
    labels = {"ray.io/node-type": role, "ray.io/cluster": cluster}
    if replica:
        labels["ray.io/worker-group-replica-name"] = replica
    ready = up if serve_ready is None else serve_ready
    return {"metadata": {"name": name, "labels": labels},
            "status": {"phase": "Running" if up else "Pending",
                       "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True" if ready else "False"}]}}


def slice_hosts(n_ready, n=4, **kw):
    return [host(f"w{i}", i < n_ready, **kw) for i in range(n)]


@pytest.mark.parametrize("stage,pods,phase,ready_cond", [
    (None, [], "Pending", ("False", "NoRayService")),
    ("created", [], "Pending", ("False", "WaitingForKubeRay")),
    ("initializing", slice_hosts(2), "Pending", ("False", "Initializing")),
    ("deploying", slice_hosts(4), "Deploying", ("False", "Initializing")),
    ("running", slice_hosts(4), "Ready", ("True", "Serving")),
    ("upgrading", slice_hosts(4), "Updating", ("True", "Serving")),
    # issue 35: Serve's app RUNNING but no endpoint behind the Serve Service: not Ready
    ("zero-endpoints", slice_hosts(4), "Degraded", ("False", "ZeroServeEndpoints")),
    ("deploy-failed", slice_hosts(4), "Failed", ("False", "Initializing")),
    ("initializing-timeout", [], "Failed", ("False", "InitializingTimeout")),
])
def test_phase_and_ready_condition_per_stage(stage, pods, phase, ready_cond):
    st = derive(stage, pods)
    assert st["phase"] == phase
    c = cond(st, "Ready")
    assert (c["status"], c["reason"]) == ready_cond
    assert st["endpoint"] == ENDPOINT and st["model"] == "qwen" and st["observedGeneration"] == 3
    assert cond(st, "Validated")["status"] == "True"
    assert cond(st, "RayServiceCreated")["status"] == ("False" if stage is None else "True")
    assert (cond(st, "Failed") is not None) == (phase == "Failed")


def test_ready_service_reports_kuberay_and_serve_fields():
    st = derive("running", slice_hosts(4))
    assert (st["replicas"], st["readyReplicas"], st["replicasReady"], st["hosts"], st["readyHosts"]) == (1, 1, "1/1", 4, 4)
    assert (st["serviceStatus"], st["applicationStatus"], st["rayClusterName"], st["rayServiceName"]) == ("Running", "RUNNING", "qwen-k2x9p", "qwen")
    assert cond(st, "SliceReady")["status"] == "True"
    assert st["message"] == "serving qwen on 1 replica(s) of a v6e 4x4 slice"


def test_deploying_says_what_serve_reports():
    st = derive("deploying", slice_hosts(4))
    assert st["message"] == "deploying qwen: DEPLOYING" and st["applicationStatus"] == "DEPLOYING"


def test_deploy_failure_carries_serves_message():
    st = derive("deploy-failed", slice_hosts(4))
    failed = cond(st, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "DeployFailed")
    assert "TPU not found" in failed["message"] and "TPU not found" in st["message"]
    assert ("Warning", "DeployFailed") in [(e.type, e.reason) for e in status.events({}, st)]
    assert cond(derive("initializing-timeout"), "Failed")["reason"] == "InitializingTimeout"


def test_a_failed_upgrade_keeps_the_old_version_serving():
    st = derive("upgrade-failed", slice_hosts(4))
    assert st["phase"] == "Updating" and cond(st, "Ready")["status"] == "True"
    assert st["message"] == "the new version failed to deploy, the old one still serves: ValueError: model Qwen/Qwen3-30B-A4B not found"


def test_an_edit_not_yet_applied_is_updating_not_ready():
    edited = spec.parse_service(service_body(replicas={"min": 1, "max": 2}, engine={"maxModelLen": 4096}))
    # The RayService still has the old spec (hash of SVC): the edit has not reached it.
    st = derive_service(edited, 4, rayservice("running"), slice_hosts(4), {}, T0)
    assert st["phase"] == "Updating"
    # Patched (new hash) but KubeRay has not observed the new generation yet.
    rs = rayservice("running", edited, generation=2)
    assert derive_service(edited, 4, rs, slice_hosts(4), {}, T0)["phase"] == "Updating"
    rs["status"] = {**rs["status"], "observedGeneration": 2}
    # Without a record of what was applied before (a service first seen serving): taken as applied.
    assert derive_service(edited, 4, rs, slice_hosts(4), {}, T0)["phase"] == "Ready"


def _with_app(rs, app_status, deployment_status):
    rs = copy.deepcopy(rs)
    rs["status"]["activeServiceStatus"]["applicationStatuses"] = {"llm": {
        "status": app_status, "serveDeploymentStatuses": {"LLMServer:qwen": {"status": deployment_status},
                                                          "OpenAiIngress": {"status": "HEALTHY"}}}}
    return rs


def test_the_first_status_after_a_serve_config_edit_is_not_ready_until_the_reload_is_seen():
    """KubeRay 1.6 reconcileServe reads the application statuses, then PUTs the new Serve config, and
    calculateStatus writes them with the new observedGeneration: that first status of generation 2
    is generation 1's RUNNING. `tputorch wait --for phase=Ready` must not return on it."""
    before = derive("running", slice_hosts(4))
    assert before["phase"] == "Ready" and before["appliedConfig"]["rayClusterName"] == "qwen-k2x9p"
    edited = spec.parse_service(service_body(replicas={"min": 1, "max": 2}, engine={"maxModelLen": 4096}))
    stale = rayservice("running", edited, generation=2)
    stale["status"] = {**stale["status"], "observedGeneration": 2}
    st = derive_service(edited, 4, stale, slice_hosts(4), before, T1)
    c = cond(st, "SpecApplied")
    assert (st["phase"], c["status"], c["reason"]) == ("Updating", "False", "WaitingForServeReload"), st
    assert st["appliedConfig"] == before["appliedConfig"]
    # KubeRay's next status: Serve rebuilds the application (its args changed) and redeploys the replica.
    reloading = _with_app(stale, "DEPLOYING", "UPDATING")
    st = derive_service(edited, 4, reloading, slice_hosts(4), st, T1)
    assert (st["phase"], cond(st, "SpecApplied")["reason"]) == ("Updating", "Applied")
    assert st["appliedConfig"]["serveConfig"] != before["appliedConfig"]["serveConfig"]
    st = derive_service(edited, 4, _with_app(stale, "RUNNING", "HEALTHY"), slice_hosts(4), st, T1)
    assert st["phase"] == "Ready" and cond(st, "SpecApplied")["status"] == "True"
    # The same RUNNING status with the reload never seen stays Updating while KubeRay may still
    # write what its reads after the PUT found (it reads every 2 s and writes any change) ...
    stale["status"]["lastUpdateTime"] = "2026-11-29T10:01:00Z"
    again = derive_service(edited, 4, stale, slice_hosts(4), before, "2026-11-29T10:01:05Z")
    assert again["phase"] == "Updating"
    assert applied.recheck_in(again, "2026-11-29T10:01:05Z", stale) == 5.0  # no event may come: look again
    # ... and once it has written nothing for RELOAD_QUIET_S, every read since the PUT found the new
    # config RUNNING (a reload quicker than one requeue).
    st = derive_service(edited, 4, stale, slice_hosts(4), again, "2026-11-29T10:01:10Z")
    assert st["phase"] == "Ready" and cond(st, "SpecApplied")["status"] == "True"
    assert applied.recheck_in(st, "2026-11-29T10:01:10Z", stale) is None


def test_upgrade_strategy_none_says_a_cluster_edit_is_not_applied():
    """KubeRay 1.6 shouldPrepareNewCluster: with upgradeStrategy None no new RayCluster is made for
    a changed cluster hash, and the active one is not updated either: Ready on the old spec."""
    old = spec.parse_service(service_body(upgradeStrategy="None"))
    before = derive_service(old, 1, rayservice("running", old), slice_hosts(4), {}, T0)
    assert before["phase"] == "Ready" and cond(before, "SpecApplied")["status"] == "True"
    edited = spec.parse_service(service_body(upgradeStrategy="None", image="example.com/ray-vllm-torchtpu:2.60.1"))
    rs = rayservice("running", edited, generation=2)
    rs["status"] = {**rs["status"], "observedGeneration": 2}
    st = derive_service(edited, 2, rs, slice_hosts(4), before, T1)
    c = cond(st, "SpecApplied")
    assert (st["phase"], c["status"], c["reason"]) == ("Ready", "False", "UpgradeStrategyNone"), st
    assert "spec.upgradeStrategy is None" in c["message"] and "RayCluster qwen-k2x9p" in c["message"]
    assert "the last edit is not applied" in st["message"]
    assert ("Warning", "UpgradeStrategyNone") in [(e.type, e.reason) for e in status.events(before, st)]
    assert_wait_fails_with(st, "spec.upgradeStrategy is None")
    # The same edit under NewCluster is an upgrade (KubeRay makes a pending cluster).
    assert cond(derive("upgrading", slice_hosts(4)), "SpecApplied")["reason"] == "Upgrading"


def test_a_tolerations_edit_is_never_applied_on_kuberay_1_6():
    """KubeRay 1.6 GenerateHashWithoutReplicasAndWorkersToDelete mutes tolerations (Kueue injects
    them): the edit makes no new cluster and updates none, under either strategy."""
    for strategy in ("NewCluster", "None"):
        old = spec.parse_service(service_body(upgradeStrategy=strategy))
        before = derive_service(old, 1, rayservice("running", old), slice_hosts(4), {}, T0)
        edited = spec.parse_service(service_body(upgradeStrategy=strategy, tolerations=[
            {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]))
        rs = rayservice("running", edited, generation=2)
        rs["status"] = {**rs["status"], "observedGeneration": 2}
        st = derive_service(edited, 2, rs, slice_hosts(4), before, T1)
        c = cond(st, "SpecApplied")
        assert (st["phase"], c["status"], c["reason"]) == ("Ready", "False", "TolerationsNotApplied"), (strategy, st)
        assert "delete and re-create" in c["message"]
        assert_wait_fails_with(st, "delete and re-create")


def assert_wait_fails_with(st, text):
    """`tputorch wait --for phase=Ready` (and `tputorch serve`) on this status: it ends at once,
    failed, saying why, although the phase is Ready (the old spec's)."""
    from tputorch.cli import display
    v = display.view("TPUTorchService", {"metadata": {"name": "qwen", "namespace": "ml"}, "status": st})
    assert st["phase"] == "Ready" and display.outcome(v, "Ready") == display.FAILED
    message = display.final_text(v, display.FAILED)
    assert message.startswith("TPUTorchService ml/qwen keeps serving its previous spec (Ready)") and text in message, message


RECORDED_EDITS = yaml.safe_load((pathlib.Path(__file__).parent / "data" / "rayservice-recorded.yaml").read_text())


@pytest.mark.parametrize("name,spec_before,edit,phase,reason,says", [
    ("none-image", {"upgradeStrategy": "None"}, {"image": "example.com/ray-vllm-torchtpu:2.60.1"},
     "Ready", "UpgradeStrategyNone", "spec.upgradeStrategy is None"),
    ("tolerations", {}, {"tolerations": [{"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]},
     "Ready", "TolerationsNotApplied", "delete and re-create"),
    ("no-capacity", {"tpu": {"accelerator": "v5p", "topology": "2x2x2"}}, {"image": "example.com/ray-vllm-torchtpu:2.60.1"},
     "Updating", "Unschedulable", "cannot start: pod"),
])
def test_edits_on_statuses_recorded_from_kuberay_1_6_2(name, spec_before, edit, phase, reason, says):
    """The statuses KubeRay 1.6.2 wrote before and after each edit on the local cluster
    (tests/cluster/test_service_e2e.py, which checks each run that KubeRay still writes them)."""
    base = {"tpu": {"accelerator": "v6e", "topology": "2x2"}, **spec_before}
    old, new = spec.parse_service(service_body(name, **base)), spec.parse_service(service_body(name, **{**base, **edit}))

    def observed(stage, svc):
        rs = render.rayservice(svc)
        rs["metadata"]["generation"] = RECORDED_EDITS[name][stage]["generation"]
        rs["status"] = RECORDED_EDITS[name][stage]["status"]
        return rs
    active = RECORDED_EDITS[name]["before"]["status"]["activeServiceStatus"]["rayClusterName"]
    pods = slice_hosts(old.slice.hosts, n=old.slice.hosts, cluster=active)
    before = derive_service(old, 1, observed("before", old), pods, {}, T0)
    assert before["phase"] == "Ready" and cond(before, "SpecApplied")["status"] == "True", before
    pending = (RECORDED_EDITS[name]["edited"]["status"].get("pendingServiceStatus") or {}).get("rayClusterName")
    if pending:  # the new RayCluster's hosts: no second slice of this shape
        pods += [_unschedulable(host(f"{pending}-w{i}", False, cluster=pending)) for i in range(new.slice.hosts)]
    st = derive_service(new, 2, observed("edited", new), pods, before, T1)
    c = cond(st, "SpecApplied")
    assert (st["phase"], c["status"], c["reason"]) == (phase, "False", reason), st
    assert says in c["message"], c
    assert cond(st, "SliceReady")["status"] == "True" and cond(st, "Ready")["status"] == "True", st["conditions"]  # still serving
    if phase == "Ready":
        assert_wait_fails_with(st, says)


def test_a_crash_looping_host_is_not_up():
    """A crash-looping container leaves its pod phase Running (waiting in CrashLoopBackOff between
    restarts): that host is not up and the slice not ready."""
    pods = slice_hosts(4)
    pods[2]["status"]["containerStatuses"] = [{"name": "ray-worker", "restartCount": 5, "state": {
        "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s restarting failed container"}}}]
    st = derive("deploying", pods)
    c = cond(st, "SliceReady")
    assert (st["readyHosts"], st["readyReplicas"]) == (3, 0)
    assert (c["status"], c["reason"]) == ("False", "CrashLoopBackOff")
    assert st["phase"] == "Pending" and "CrashLoopBackOff" in st["message"]
    # Between two crashes the container is running again: then the host counts.
    pods[2]["status"]["containerStatuses"] = [{"name": "ray-worker", "restartCount": 6, "state": {"running": {}}}]
    assert derive("deploying", pods)["readyHosts"] == 4
    # As the operator's pod store keeps them (only waiting containers): the same answers.
    from tputorch.controller import stores
    for state, up in (({"running": {}}, 4), ({"waiting": {"reason": "CrashLoopBackOff"}}, 3)):
        pods[2]["status"]["containerStatuses"] = [{"name": "ray-worker", "state": state}]
        assert derive("deploying", [stores.slim_pod(p) for p in pods])["readyHosts"] == up, state


def _unschedulable(pod):
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/7 nodes are available: 7 Insufficient google.com/tpu."}]
    return pod


def test_the_pending_clusters_unschedulable_slice_is_said_during_an_upgrade():
    pods = slice_hosts(4) + [_unschedulable(host(f"n{i}", False, cluster="qwen-7fz4q")) for i in range(4)]
    before = derive("running", slice_hosts(4))
    st = derive_service(SVC, 3, rayservice("upgrading"), pods, before, T1)
    c = cond(st, "SpecApplied")
    assert (st["phase"], c["status"], c["reason"]) == ("Updating", "False", "Unschedulable"), st
    assert "the new RayCluster qwen-7fz4q cannot start: pod n0: Unschedulable: no nodes are available: " \
           "Insufficient google.com/tpu." in c["message"]
    assert c["message"] in st["message"]
    assert cond(st, "SliceReady")["status"] == "True"  # the serving cluster's slice is up
    assert ("Warning", "Unschedulable") in [(e.type, e.reason) for e in status.events(before, st)]


def test_a_service_whose_slice_cannot_be_scheduled_is_pending_although_serve_deploys():
    """KubeRay PUTs the Serve config once the head is up, so the application is DEPLOYING while
    the TPU hosts cannot be scheduled: nothing is deploying until they can."""
    pods = [_unschedulable(host(f"w{i}", False)) for i in range(4)]
    st = derive("deploying", pods)
    assert st["phase"] == "Pending" and cond(st, "SliceReady")["reason"] == "Unschedulable"
    assert "Insufficient google.com/tpu" in st["message"]
    assert derive("deploying", slice_hosts(2))["phase"] == "Deploying"  # hosts still starting


def test_ready_replicas_count_whole_slices():
    # Two replicas wanted by the autoscaler; one slice all ready, the other with 2 of 4 hosts.
    pods = slice_hosts(4, replica="tpu-slice-aaaaa") + [host(f"x{i}", i < 2, replica="tpu-slice-bbbbb") for i in range(4)]
    st = derive("scaled-up", pods)
    assert (st["replicas"], st["readyReplicas"], st["replicasReady"], st["hosts"], st["readyHosts"]) == (2, 1, "1/2", 8, 6)
    # Without KubeRay's replica label (its RayMultiHostIndexing gate is off by default in 1.5):
    # whole slices' worth of ready hosts.
    st = derive("scaled-up", slice_hosts(4) + [host(f"x{i}", i < 2) for i in range(4)])
    assert st["readyReplicas"] == 1
    # Replica-labelled hosts that are all ready but fewer than a slice are no replica.
    assert derive("scaled-up", [host(f"y{i}", True, replica="r") for i in range(3)])["readyReplicas"] == 0


def test_only_the_serving_clusters_pods_count_during_an_upgrade():
    pods = slice_hosts(4) + [host(f"n{i}", False, cluster="qwen-7fz4q") for i in range(4)]
    st = derive("upgrading", pods)
    assert (st["readyHosts"], st["readyReplicas"], st["rayClusterName"]) == (4, 1, "qwen-k2x9p")


def test_no_rayservice_and_a_creation_problem():
    st = derive(None, problem=("RayServiceNameTaken", "a RayService named qwen already exists"))
    c = cond(st, "RayServiceCreated")
    assert (c["status"], c["reason"]) == ("False", "RayServiceNameTaken")
    assert st["message"] == "a RayService named qwen already exists" and st["phase"] == "Pending"
    assert ("Warning", "RayServiceNameTaken") in [(e.type, e.reason) for e in status.events({}, st)]
    assert derive(None)["message"] == "creating the RayService"


def test_unschedulable_slice_explains_the_wait():
    pod = host("qwen-k2x9p-tpu-slice-worker-abc", False)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/7 nodes are available: 7 Insufficient google.com/tpu."}]
    st = derive("initializing", [pod])
    c = cond(st, "SliceReady")
    assert (c["reason"], c["message"]) == ("Unschedulable", "pod qwen-k2x9p-tpu-slice-worker-abc: Unschedulable: no nodes are available: Insufficient google.com/tpu.")


def test_a_service_without_a_node_pool_of_its_shape_names_the_labels():
    pod = host("qwen-k2x9p-tpu-slice-worker-abc", False)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                    "message": "0/7 nodes are available: 5 node(s) didn't match Pod's node "
                                               "affinity/selector, 2 node(s) had untolerated taint(s)."}]
    c = cond(derive("initializing", [pod]), "SliceReady")
    assert c["reason"] == "NoMatchingNodePool"
    assert c["message"].startswith("no node pool has the node labels this slice needs: "
                                   "cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice, cloud.google.com/gke-tpu-topology=4x4, "
                                   "node.kubernetes.io/instance-type=ct6e-standard-4t;")


def test_a_service_slice_without_the_tpu_webhooks_variables_is_not_ready():
    pods = []
    for i in range(4):
        pod = host(f"qwen-k2x9p-tpu-slice-worker-{i}", True)
        pod["spec"] = {"containers": [{"name": "ray-worker", "resources": {"limits": {"google.com/tpu": "4"}}, "env": []}]}
        pods.append(pod)
    c = cond(derive("initializing", pods), "SliceReady")
    assert (c["status"], c["reason"]) == ("False", "TPUWebhookMissing")
    assert "without TPU_WORKER_ID and TPU_WORKER_HOSTNAMES" in c["message"]


def test_events_on_service_phase_changes():
    pending = derive("initializing", slice_hosts(0))
    deploying = derive("deploying", slice_hosts(4), previous=pending, now=T1)
    ready = derive("running", slice_hosts(4), previous=deploying, now=T1)
    updating = derive("upgrading", slice_hosts(4), previous=ready, now=T1)
    assert ("Normal", "Deploying") in [(e.type, e.reason) for e in status.events(pending, deploying)]
    reasons = [(e.type, e.reason) for e in status.events(deploying, ready)]
    assert ("Normal", "Serving") in reasons and ("Normal", "Ready") in reasons
    assert [(e.type, e.reason) for e in status.events(ready, updating)] == [("Normal", "Updating")]
    assert status.events(ready, derive("running", slice_hosts(4), previous=ready, now=T1)) == []


def test_patch_for_nulls_fields_of_either_kind():
    ready = derive("running", slice_hosts(4))
    invalid = status.invalid([spec.FieldError("spec.model.source", "", "must not be empty")], 4, ready, T1)
    patch = status.patch_for(ready, invalid)
    assert patch["endpoint"] is None and patch["readyReplicas"] is None and patch["phase"] == "Failed"
    assert status.patch_for(ready, derive("running", slice_hosts(4), previous=ready, now=T1)) is None


def test_condition_messages_are_capped_for_the_api():
    st = derive("deploy-failed", slice_hosts(4))
    huge = rayservice("deploy-failed")
    huge["status"]["activeServiceStatus"]["applicationStatuses"]["llm"]["message"] = "x" * 100000
    st = derive_service(SVC, 1, huge, slice_hosts(4), {}, T0)
    assert len(cond(st, "Failed")["message"]) == phases.MAX_CONDITION_MESSAGE


def test_a_child_without_generation_is_judged_by_its_hash_alone():
    # A store that keeps no metadata.generation of the RayService: no false Updating.
    rs = rayservice("running")
    del rs["metadata"]["generation"]
    assert derive_service(SVC, 1, rs, slice_hosts(4), {}, T0)["phase"] == "Ready"
    assert set(status.POD_LABELS_READ) == {"ray.io/node-type", "ray.io/cluster", "ray.io/worker-group-replica-name",
                                           "ray.io/group"}


def test_multi_host_slice_is_up_although_hosts_without_a_serve_replica_are_notready():
    # KubeRay's worker readiness probe includes the Serve proxy; only the host running the LLM
    # replica has one, the other three run only vLLM workers and stay NotReady by design.
    pods = [host(f"w{i}", True, serve_ready=(i == 0)) for i in range(4)]
    deploying = derive("deploying", pods)
    assert deploying["phase"] == "Deploying" and cond(deploying, "SliceReady")["status"] == "True"
    ready = derive("running", pods, previous=deploying)
    assert (ready["phase"], ready["replicasReady"], ready["readyHosts"]) == ("Ready", "1/1", 4)
    # A host that is not running yet keeps the slice waiting.
    assert cond(derive("deploying", pods[:3] + [host("w3", False)]), "SliceReady")["reason"] == "WaitingForHosts"


def test_a_model_that_cannot_load_fails_before_the_first_promotion_with_rays_message():
    st = derive("pending-deploy-failed", slice_hosts(4))
    failed = cond(st, "Failed")
    assert st["phase"] == "Failed" and failed["reason"] == "DeployFailed"
    assert failed["message"].startswith("Failed to update the deployments ['LLMServer:qwen']. OSError: /models/nope is not a local folder")
    assert "initializingTimeoutSeconds" in failed["message"]  # when KubeRay releases the slice
    timed_out = derive("pending-initializing-timeout")
    failed = cond(timed_out, "Failed")
    assert timed_out["phase"] == "Failed" and failed["reason"] == "InitializingTimeout"
    assert "LLMServer:qwen" in failed["message"] and "10m0s" in failed["message"] and "released" in failed["message"]


def test_a_lost_replica_leaves_ready_and_returns_through_recovering():
    ready = derive("running", slice_hosts(4))
    lost = derive("replica-lost", slice_hosts(4), previous=ready, now=T1)
    assert lost["phase"] == "Degraded"
    c = cond(lost, "Ready")
    assert (c["status"], c["reason"]) == ("False", "ApplicationUnhealthy")
    assert "A replica's health check failed" in c["message"] and "health check failed" in lost["message"]
    assert ("Warning", "ApplicationUnhealthy") in [(e.type, e.reason) for e in status.events(ready, lost)]
    replacing = derive("replica-replacing", slice_hosts(4), previous=lost, now=T1)
    assert replacing["phase"] == "Recovering" and cond(replacing, "Ready")["status"] == "False"
    back = derive("running", slice_hosts(4), previous=replacing, now=T1)
    assert back["phase"] == "Ready" and ("Normal", "Ready") in [(e.type, e.reason) for e in status.events(replacing, back)]
    # DEPLOYING without a loss before it is an in-place redeploy: Updating.
    assert derive("replica-replacing", slice_hosts(4), previous=ready)["phase"] == "Updating"


def test_a_service_scaling_up_on_load_stays_ready():
    """Serve's autoscaler asked for a replica that waits for a slice: the deployment is UPSCALING
    (Ray keeps the application RUNNING), the replica it has serves. Seen on the real chain."""
    ready = derive("running", slice_hosts(4))
    scaling = copy.deepcopy(rayservice("running"))  # STATUSES is shared
    deployments = scaling["status"]["activeServiceStatus"]["applicationStatuses"]["llm"]["serveDeploymentStatuses"]
    deployments["LLMServer:qwen"] = {"status": "UPSCALING", "message": "Upscaling from 1 to 2 replicas."}
    st = derive_service(SVC, 3, scaling, slice_hosts(4), ready, T1)
    assert st["phase"] == "Ready" and cond(st, "Ready")["status"] == "True", st
    # Not so for a deployment Serve is redeploying or that lost a replica.
    for sick in ("UPDATING", "UNHEALTHY"):
        deployments["LLMServer:qwen"] = {"status": sick}
        assert derive_service(SVC, 3, scaling, slice_hosts(4), ready, T1)["phase"] != "Ready", sick


def test_a_slice_asked_for_by_rays_autoscaler_that_cannot_be_placed_is_said_while_serving():
    """As on the real chain (test_real_serving.py): Ray's autoscaler raised the worker group for a
    waiting replica, KubeRay made its pods and the scheduler has no node for them. The service
    serves on the slice it has (Ready, SliceReady True) and says what the added one waits for."""
    ready = derive("running", slice_hosts(4, replica="tpu-slice-aaaaa"))
    pods = slice_hosts(4, replica="tpu-slice-aaaaa") + [_unschedulable(host(f"x{i}", False, replica="tpu-slice-bbbbb"))
                                                        for i in range(4)]
    st = derive("scaled-up", pods, previous=ready, now=T1)
    c = cond(st, "SliceReady")
    waiting = ("1 more wanted by Ray's autoscaler cannot start: pod x0: Unschedulable: no nodes are available: "
               "Insufficient google.com/tpu.")
    assert (c["status"], c["reason"]) == ("True", "ScalingUp"), c
    assert c["message"] == f"1/2 slice replica(s) up, 4/8 TPU hosts running; {waiting}"
    assert (st["phase"], st["replicasReady"]) == ("Ready", "1/2")
    assert st["message"] == f"serving qwen on 1 replica(s) of a v6e 4x4 slice; {waiting}"
    assert ("Normal", "ScalingUp") in [(e.type, e.reason) for e in status.events(ready, st)]
    # Hosts of the added slice still starting: said so; all up: AllHostsReady again.
    starting = derive("scaled-up", slice_hosts(4, replica="tpu-slice-aaaaa") + slice_hosts(2, replica="tpu-slice-bbbbb"))
    assert cond(starting, "SliceReady")["message"].endswith("; 1 more wanted by Ray's autoscaler starting")
    both = derive("scaled-up", slice_hosts(4, replica="tpu-slice-aaaaa") + slice_hosts(4, replica="tpu-slice-bbbbb"))
    assert cond(both, "SliceReady")["reason"] == "AllHostsReady" and both["message"].endswith("slice")


@pytest.mark.parametrize("reason,message", [
    ("ImagePullBackOff", 'Back-off pulling image "example.com/nope:1"'),
    ("CreateContainerConfigError", 'secret "hf-token" not found'),
])
def test_a_container_that_cannot_start_is_named_in_slice_ready(reason, message):
    pods = slice_hosts(3) + [host("w3", False)]
    pods[3]["status"]["containerStatuses"] = [{"name": "ray-worker", "state": {"waiting": {"reason": reason, "message": message}}}]
    st = derive("initializing", pods)
    c = cond(st, "SliceReady")
    assert (c["status"], c["reason"]) == ("False", reason)
    assert c["message"] == f"pod w3 container ray-worker: {reason}: {message}"
    assert ("Warning", reason) in [(e.type, e.reason) for e in status.events({}, st)]


RECORDED = pathlib.Path(__file__).resolve().parents[3] / "hack" / "fakedash" / "recorded"


def recorded_app_statuses(file: str, status: str) -> dict:
    """KubeRay's applicationStatuses (what its RayService controller copies from Serve's details:
    app status and message, each deployment's status and message) of the last snapshot in
    `status` recorded from the real chain (tests/serving/record_serve.py)."""
    import json
    snaps = json.loads((RECORDED / file).read_text())
    app = next(s["details"]["applications"]["llm"] for s in reversed(snaps)
               if s["details"]["applications"].get("llm", {}).get("status") == status)
    return {"llm": {"status": app["status"], "message": app["message"], "serveDeploymentStatuses": {
        n: {"status": d["status"], "message": d["message"]} for n, d in app["deployments"].items()}}}


def with_apps(stage: str, where: str, apps: dict) -> dict:
    rs = rayservice(stage)
    rs["status"] = {**rs["status"], where: {**rs["status"].get(where, {}), "applicationStatuses": apps}}
    return rs


def test_recorded_serve_shapes_give_the_documented_phases():
    """Ray 2.60 Serve with vLLM 0.29 (CPU) as recorded: RUNNING -> Ready; the replica's actor
    killed -> UNHEALTHY (Ray keeps it so until the replacement is HEALTHY) -> Degraded; a model
    path that does not exist -> DEPLOY_FAILED before promotion -> Failed with Ray's message."""
    derive_rs = lambda rs, prev={}: derive_service(SVC, 3, rs, slice_hosts(4), prev, T0)  # noqa: E731
    ready = derive_rs(with_apps("running", "activeServiceStatus", recorded_app_statuses("serve-deploy.json", "RUNNING")))
    assert ready["phase"] == "Ready"
    lost = derive_rs(with_apps("running", "activeServiceStatus", recorded_app_statuses("serve-replica-lost.json", "UNHEALTHY")), ready)
    assert lost["phase"] == "Degraded" and "health check failed" in cond(lost, "Ready")["message"]
    failed = derive_rs(with_apps("deploying", "pendingServiceStatus", recorded_app_statuses("serve-deploy-failed.json", "DEPLOY_FAILED")))
    assert failed["phase"] == "Failed" and cond(failed, "Failed")["reason"] == "DeployFailed"
    # Ray's own words: the app's message and the replica's exception, without the traceback.
    assert cond(failed, "Failed")["message"].startswith(
        "Failed to update the deployments ['LLMServer:tiny']. RuntimeError: Failed to create vLLM engine config: "
        "Repo id must be in the form")


def test_a_serving_service_whose_pods_cannot_be_read_stays_ready_and_says_so():
    problem = ("PodsForbidden", "the operator may not watch pods in namespace ml")
    st = derive("running", [], pods_problem=problem)  # no pods seen: KubeRay's count says the slice is up
    c = cond(st, "SliceReady")
    assert (c["status"], c["reason"]) == ("Unknown", "PodsForbidden")
    assert st["phase"] == derive("running", [])["phase"] == "Ready"


# KubeRay 1.6.2's RayService statuses around an engine-args edit, recorded on the real serving chain
# (tests/cluster/test_real_serving.py with RECORD_STATUSES=1), each with what Serve ran at that moment.
RECORDED_EDIT = pathlib.Path(__file__).parent / "data" / "recorded-serve-edit.json"



def test_the_recorded_serve_edit_is_ready_only_once_serve_runs_the_edit():
    """Replayed through the operator's derivation in the order the real chain wrote them: no status
    of the edit's generation says Ready while Serve still ran the old engine args (KubeRay's first
    status of a new generation carries the old config's RUNNING), and the last one does."""
    rec = json.loads(RECORDED_EDIT.read_text())
    before, after = (spec.parse_service(rec[k]) for k in ("service", "edited"))
    # The recording's spec hashes are of the chain's model path; the bodies here name another.
    svc_of = {rec["hash_before"]: before, rec["hash_after"]: after}
    pods = [host("w0", True, cluster=rec["cluster"])]

    def rayservice_of(snap):
        obj = render.rayservice(svc_of[snap["spec_hash"]])
        obj["metadata"]["generation"] = snap["generation"]
        obj["status"] = snap["status"]
        return obj

    first = rec["before"]
    previous = derive_service(before, 1, rayservice_of(first), pods, {}, first["now"])
    assert previous["phase"] == "Ready", previous
    phases, stale = [], 0
    for snap in rec["after"]:
        st = derive_service(after, 2, rayservice_of(snap), pods, previous, snap["now"])
        phases.append(st["phase"])
        app = (snap["status"].get("activeServiceStatus") or {}).get("applicationStatuses", {}).get(SERVE_APP, {})
        if snap["status"].get("observedGeneration") == snap["generation"] > first["generation"] \
                and not snap["serve_runs_edit"] and app.get("status") == "RUNNING":
            stale += 1  # KubeRay's stale RUNNING of the new generation, which must not read as Ready
        assert st["phase"] != "Ready" or snap["serve_runs_edit"], (snap["now"], st["phase"], cond(st, "SpecApplied"))
        previous = st
    assert phases[-1] == "Ready" and rec["after"][-1]["serve_runs_edit"], phases
    assert "Updating" in phases, phases
    assert stale, "the recording holds no stale RUNNING of the new generation: record it again"
    print(f"recorded edit: {len(rec['after'])} statuses, {stale} stale RUNNING of the new generation, phases {phases}")


ZERO = spec.parse_service(service_body(tpu={"accelerator": "v6e", "topology": "2x2"}, replicas={"min": 0, "max": 2}))


def _scaled(desired_hosts: int, llm_status: str, message: str = "") -> dict:
    """KubeRay's status of a scale-to-zero service: the head alone serves (its proxy is a Serve
    endpoint), the worker group at `desired_hosts` (Ray's autoscaler writes it)."""
    return _scaled_as(ZERO, desired_hosts, llm_status, message)


def _scaled_as(svc, desired_hosts: int, llm_status: str = "HEALTHY", message: str = "") -> dict:
    rs = copy.deepcopy(rayservice("running", svc))
    active = rs["status"]["activeServiceStatus"]
    active["rayClusterStatus"] = {"desiredWorkerReplicas": desired_hosts, "readyWorkerReplicas": 0}
    active["applicationStatuses"]["llm"]["serveDeploymentStatuses"] = {
        "LLMServer:qwen": {"status": llm_status, **({"message": message} if message else {})},
        "OpenAiIngress": {"status": "HEALTHY"}}
    return rs


def test_a_service_scaled_to_zero_is_ready_and_says_what_the_next_request_waits_for():
    head = host("head", True, role="head")
    st = derive_service(ZERO, 3, _scaled(0, "HEALTHY"), [head], {}, T0)
    assert st["phase"] == "Ready" and (st["replicas"], st["readyReplicas"], st["hosts"]) == (0, 0, 0)
    assert cond(st, "SliceReady")["status"] == "True" and cond(st, "SliceReady")["reason"] == "ScaledToZero"
    assert st["message"].startswith("scaled to zero: no slice is held while qwen is idle")
    assert "v6e 2x2 slice back" in st["message"] and "408 after 1800 s" in st["message"]


def test_a_service_waking_from_zero_stays_ready_and_says_requests_wait():
    """Serve asked for a replica (UPSCALING, as Ray 2.60 words it from zero), the autoscaler for a
    slice (one host desired), none is up yet; then the slice cannot be scheduled."""
    head = host("head", True, role="head")
    rs = _scaled(1, "UPSCALING", "Upscaling from 0 to 1 replicas.")
    waking = derive_service(ZERO, 3, rs, [head, host("w0", False)], {}, T0)
    assert waking["phase"] == "Ready" and waking["replicasReady"] == "0/1"
    assert cond(waking, "SliceReady")["status"] == "False" and cond(waking, "SliceReady")["reason"] == "WaitingForHosts"
    assert waking["message"].startswith("waking from zero: a v6e 2x2 slice is starting for qwen; requests wait")
    stuck = derive_service(ZERO, 3, rs, [head, _unschedulable(host("w0", False))], {}, T0)
    assert cond(stuck, "SliceReady")["reason"] == "Unschedulable" and "Insufficient google.com/tpu" in stuck["message"]
    up = derive_service(ZERO, 3, _scaled(1, "HEALTHY"), [head, host("w0", True)], waking, T1)
    assert up["message"] == "serving qwen on 1 replica(s) of a v6e 2x2 slice" and cond(up, "SliceReady")["reason"] == "AllHostsReady"


def test_a_scale_to_zero_service_whose_head_cannot_start_is_pending_and_says_why():
    """No slice is wanted, but the head must run (its Serve proxy takes the next request): a head
    that cannot be scheduled is Pending with the scheduler's reason, not ScaledToZero."""
    rs = _scaled(0, "HEALTHY")
    rs["status"]["activeServiceStatus"]["applicationStatuses"] = {}
    rs["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "Initializing", "message": ""}]
    st = derive_service(ZERO, 3, rs, [_unschedulable(host("head", False, role="head"))], {}, T0)
    assert st["phase"] == "Pending" and cond(st, "SliceReady")["reason"] == "Unschedulable", st
    starting = derive_service(ZERO, 3, rs, [host("head", False, role="head")], {}, T0)
    assert cond(starting, "SliceReady")["reason"] == "WaitingForHosts" and starting["phase"] == "Pending", starting


def test_a_scale_to_zero_service_says_when_the_slice_is_being_given_back_and_an_edit_not_applied():
    head = host("head", True, role="head")
    # Ray's autoscaler put the pod in workersToDelete and KubeRay deletes it: still running, going.
    going = host("w0", True)
    going["metadata"]["deletionTimestamp"] = T0
    leaving = derive_service(ZERO, 3, _scaled(0, "HEALTHY"), [head, going], {}, T0)
    assert leaving["message"].startswith("scaling to zero: Ray's autoscaler is giving back the slice (1 host(s)")
    # KubeRay 1.6's RayService copy of its cluster's status is written only when a Serve status
    # changes: after the autoscaler gave the slice back it may still want one. The pods say 0.
    stale = _scaled(0, "HEALTHY")
    stale["status"]["activeServiceStatus"]["rayClusterStatus"]["desiredWorkerReplicas"] = 1
    gone = derive_service(ZERO, 3, stale, [head], {}, T0)
    assert (gone["replicasReady"], cond(gone, "SliceReady")["reason"]) == ("0/0", "ScaledToZero"), gone
    old = spec.parse_service(service_body(tpu={"accelerator": "v6e", "topology": "2x2"}, replicas={"min": 0, "max": 2},
                                          upgradeStrategy="None"))
    before = derive_service(old, 1, _scaled_as(old, 0), [head], {}, T0)
    edited = spec.parse_service(service_body(tpu={"accelerator": "v6e", "topology": "2x2"}, replicas={"min": 0, "max": 2},
                                             upgradeStrategy="None", image="example.com/ray-vllm-torchtpu:2.60.1"))
    rs = _scaled_as(edited, 0)
    rs["metadata"]["generation"] = rs["status"]["observedGeneration"] = 2
    st = derive_service(edited, 2, rs, [head], before, T1)
    assert st["phase"] == "Ready" and st["message"].startswith("scaled to zero")
    assert "the last edit is not applied" in st["message"], st["message"]


def test_a_service_whose_model_is_in_a_bucket_names_its_account_or_is_told():
    """Issue 55: a gs:// model source without spec.serviceAccountName gets StorageIdentity=False."""
    unbound = spec.parse_service(service_body(model={"source": "gs://team-models/qwen3"}))
    found = cond(derive(None, svc=unbound), "StorageIdentity")
    assert (found["status"], found["reason"]) == ("False", "DefaultServiceAccount")
    assert found["message"].startswith("spec.model.source is gs://team-models/qwen3 but")
    bound = spec.parse_service(service_body(model={"source": "gs://team-models/qwen3"}, serviceAccountName="ray-tpu"))
    assert cond(derive(None, svc=bound), "StorageIdentity") is None
    assert cond(derive(None), "StorageIdentity") is None  # a Hub repo id
