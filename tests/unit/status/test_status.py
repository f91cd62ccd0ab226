"""Status derivation from recorded RayJob statuses, condition timestamps, patches and events."""

import pathlib

import pytest
import yaml

from tputorch.api import spec
from tputorch import status

from ..jobs import body

STATUSES = yaml.safe_load((pathlib.Path(__file__).parent / "data" / "rayjob-statuses.yaml").read_text())
T0, T1, T2 = "2026-11-29T10:00:00Z", "2026-11-29T10:01:00Z", "2026-11-29T10:02:00Z"
JOB = spec.parse(body())


def rayjob(stage):
    # authOptions as the operator creates every RayJob and KubeRay 1.6's CRD keeps it
    return {"metadata": {"name": "demo"}, "status": STATUSES[stage],
            "spec": {"rayClusterSpec": {"authOptions": {"mode": "token", "secretName": "demo-ray-token-0a1b2c"}}}}


def derive(stage, previous=None, pods=(), now=T0, **kw):
    rj = None if stage is None else rayjob(stage)
    return status.derive(JOB, 1, rj, list(pods), previous or {}, now, **kw)


def cond(st, ctype):
    return next((c for c in st["conditions"] if c["type"] == ctype), None)


@pytest.mark.parametrize(
    "stage,phase,ready,slice_ready",
    [
        ("initializing", "Pending", 0, ("False", "WaitingForHosts")),
        ("partly-ready", "Pending", 2, ("False", "WaitingForHosts")),
        ("running", "Running", 4, ("True", "AllHostsReady")),
        ("succeeded", "Succeeded", 4, ("False", "JobFinished")),
        ("failed", "Failed", 4, ("False", "JobFinished")),
        ("deadline-exceeded", "Failed", 0, ("False", "JobFinished")),
        ("suspended", "Suspended", 0, ("False", "Suspended")),
    ],
)
def test_phase_hosts_and_slice_condition_per_stage(stage, phase, ready, slice_ready):
    st = derive(stage)
    assert st["phase"] == phase
    assert (st["readyHosts"], st["hosts"], st["hostsReady"]) == (ready, 4, f"{ready}/4")
    c = cond(st, "SliceReady")
    assert (c["status"], c["reason"]) == slice_ready
    assert st["workers"] == 16 and st["observedGeneration"] == 1
    assert cond(st, "Validated")["status"] == "True"
    assert cond(st, "RayJobCreated")["status"] == "True"


def test_running_reports_kuberay_fields():
    st = derive("running")
    assert st["rayClusterName"] == "demo-x7k2p"
    assert st["dashboardURL"].endswith(":8265")
    assert (st["jobStatus"], st["jobDeploymentStatus"], st["jobId"]) == ("RUNNING", "Running", "demo-h2c9t")
    assert st["message"] == "16 worker(s) on a v6e 4x4 slice, 4/4 hosts ready"
    assert "completionTime" not in st


def test_succeeded_has_completion_time_and_condition():
    st = derive("succeeded")
    assert st["completionTime"] == "2026-11-29T11:30:00Z"
    assert cond(st, "Succeeded")["status"] == "True"
    assert cond(st, "Failed") is None


def test_failed_carries_kuberays_reason_and_message():
    st = derive("failed")
    c = cond(st, "Failed")
    assert (c["status"], c["reason"]) == ("True", "AppFailed")
    assert "torch_tpu" in c["message"] and "torch_tpu" in st["message"]
    assert st["completionTime"] == "2026-11-29T10:05:00Z"


def test_a_foreign_reason_that_is_no_condition_reason_is_made_one():
    """Issue 34: KubeRay's (or a pod's) reason was copied as it was; a reason with spaces or dashes
    breaks metav1.Condition's rule and the tools that read it."""
    import copy
    rj = copy.deepcopy(rayjob("failed"))
    rj["status"]["reason"] = "back-off 5m: deadline exceeded!"
    st = status.derive(JOB, 1, rj, [], {}, T0)
    assert cond(st, "Failed")["reason"] == "BackOff5mDeadlineExceeded"
    assert status.conditions.reason_of("AppFailed") == "AppFailed"
    assert status.conditions.reason_of("  ") == status.conditions.reason_of(None) == "Unknown"
    assert status.conditions.reason_of("5xx error") == "XxError"


def test_no_rayjob_yet_and_kuberay_missing():
    st = derive(None)
    assert st["phase"] == "Pending" and cond(st, "RayJobCreated")["reason"] == "Creating"
    st = derive(None, problem=("KubeRayNotInstalled", "install KubeRay"))
    c = cond(st, "RayJobCreated")
    assert (c["status"], c["reason"], c["message"]) == ("False", "KubeRayNotInstalled", "install KubeRay")
    assert st["message"] == "install KubeRay"


def test_unschedulable_pods_explain_the_wait():
    pod = worker_pod("demo-x7k2p-tpu-slice-worker-abc", ready=False)
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/7 nodes are available: 3 node(s) didn't match Pod's node affinity/selector, "
                    "4 Insufficient google.com/tpu."}]
    st = derive("initializing", pods=[pod])
    c = cond(st, "SliceReady")
    assert (c["status"], c["reason"]) == ("False", "Unschedulable")
    assert "Insufficient google.com/tpu" in c["message"] and "demo-x7k2p-tpu-slice-worker-abc" in c["message"]
    assert st["message"] == c["message"]


# As the local cluster's kube-scheduler (1.34) words it for a v6e 8x8 slice (no such nodes).
NO_POOL = ("0/12 nodes are available: 10 node(s) didn't match Pod's node affinity/selector, 2 node(s) had "
           "untolerated taint(s). no new claims to deallocate, preemption: 0/12 nodes are available: 12 Preemption "
           "is not helpful for scheduling.")


@pytest.mark.parametrize("message", [
    NO_POOL,
    "0/7 nodes are available: 7 node(s) didn't match Pod's node affinity/selector.",
    "0/4 nodes are available: 1 node(s) were unschedulable, 3 node(s) didn't match Pod's node affinity/selector.",
])
def test_no_node_with_the_slices_labels_names_them(message):
    st = derive("initializing", pods=[unschedulable_pod(message)])
    c = cond(st, "SliceReady")
    assert (c["status"], c["reason"]) == ("False", "NoMatchingNodePool")
    assert ("no node pool has the node labels this slice needs: cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice, "
            "cloud.google.com/gke-tpu-topology=4x4, node.kubernetes.io/instance-type=ct6e-standard-4t;") in c["message"]
    assert "pod demo-x7k2p-tpu-slice-worker-abc: Unschedulable: no nodes are available: " in c["message"]
    assert st["phase"] == "Pending" and st["message"] == c["message"]
    assert ("Warning", "NoMatchingNodePool") in [(e.type, e.reason) for e in status.events({}, st)]


def test_the_named_labels_are_the_rendered_selector_spot_and_reservation_included():
    job = spec.parse(body(tpu={"topology": "2x2", "spot": True}, nodeSelector={"team": "ml"}))
    st = status.derive(job, 1, rayjob("initializing"), [unschedulable_pod(NO_POOL)], {}, T0)
    assert ("cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice, cloud.google.com/gke-tpu-topology=2x2, "
            "node.kubernetes.io/instance-type=ct6e-standard-4t, cloud.google.com/gke-spot=true, team=ml;") in cond(st, "SliceReady")["message"]
    job = spec.parse(body(tpu={"reservation": "res-a"}))
    st = status.derive(job, 1, rayjob("initializing"), [unschedulable_pod(NO_POOL)], {}, T0)
    assert ("cloud.google.com/gke-tpu-topology=4x4, node.kubernetes.io/instance-type=ct6e-standard-4t, "
            "cloud.google.com/reservation-name=res-a;") in cond(st, "SliceReady")["message"]


@pytest.mark.parametrize("message", [
    "0/9 nodes are available: 5 node(s) didn't match Pod's node affinity/selector, 4 Insufficient google.com/tpu.",
    "0/9 nodes are available: 9 node(s) had untolerated taint(s).",
    "0/4 nodes are available: 4 node(s) didn't match pod affinity rules.",
])
def test_a_pool_that_exists_but_does_not_fit_is_not_called_missing(message):
    c = cond(derive("initializing", pods=[unschedulable_pod(message)]), "SliceReady")
    assert c["reason"] == "Unschedulable"


# The scheduler's wording when a host's ephemeral-storage request (its disk cache and scratch) fits
# no node of the pool (kube-scheduler's NodeResourcesFit: "Insufficient <resource>"), with the other
# nodes ruled out by the slice's labels.
NO_DISK = ("0/6 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 4 Insufficient "
           "ephemeral-storage. preemption: 0/6 nodes are available: 2 Preemption is not helpful for scheduling, "
           "4 No preemption victims found for incoming pod.")


def test_a_host_whose_disk_fits_no_node_reports_the_schedulers_words():
    c = cond(derive("initializing", pods=[unschedulable_pod(NO_DISK)]), "SliceReady")
    # a pool of this shape exists (its nodes are short of disk): not NoMatchingNodePool
    assert (c["status"], c["reason"]) == ("False", "Unschedulable")
    assert c["message"].endswith(
        "pod demo-x7k2p-tpu-slice-worker-abc: Unschedulable: no nodes are available: Insufficient ephemeral-storage, "
        "node(s) didn't match Pod's node affinity/selector. preemption: no nodes are available: No preemption "
        "victims found for incoming pod, Preemption is not helpful for scheduling.")


def test_the_head_pod_without_a_cpu_node_is_not_a_missing_tpu_pool():
    head = unschedulable_pod("0/7 nodes are available: 7 node(s) didn't match Pod's node affinity/selector.")
    head["metadata"]["labels"]["ray.io/node-type"] = "head"
    assert cond(derive("initializing", pods=[head]), "SliceReady")["reason"] == "Unschedulable"


SCHEDULER_RETRIES = [
    "0/7 nodes are available: 3 node(s) had untolerated taint {google.com/tpu: present}, 4 node(s) didn't match "
    "Pod's node affinity/selector. preemption: 0/7 nodes are available: 7 Preemption is not helpful for scheduling.",
    "0/9 nodes are available: 5 node(s) had untolerated taint {google.com/tpu: present}, 4 node(s) didn't match "
    "Pod's node affinity/selector. preemption: 0/9 nodes are available: 9 Preemption is not helpful for scheduling.",
]


def unschedulable_pod(message):
    pod = worker_pod("demo-x7k2p-tpu-slice-worker-abc", ready=False)
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]
    return pod


def test_unschedulable_message_is_stable_across_scheduler_retries():
    first = derive("initializing", pods=[unschedulable_pod(SCHEDULER_RETRIES[0])], now=T0)
    second = derive("initializing", previous=first, pods=[unschedulable_pod(SCHEDULER_RETRIES[1])], now=T1)
    assert status.patch_for(first, second) is None  # the node counts changed, nothing else did
    message = cond(second, "SliceReady")["message"]
    assert message.split("). ", 1)[1] == (
        "pod demo-x7k2p-tpu-slice-worker-abc: Unschedulable: no nodes are available: node(s) didn't match Pod's "
        "node affinity/selector, node(s) had untolerated taint {google.com/tpu: present}. preemption: no nodes are "
        "available: Preemption is not helpful for scheduling.")
    # A different cause is a different message: the status follows it.
    third = derive("initializing", previous=second, now=T2, pods=[unschedulable_pod(
        "0/9 nodes are available: 9 Insufficient google.com/tpu. preemption: 0/9 nodes are available: "
        "9 No preemption victims found for incoming pod.")])
    assert "Insufficient google.com/tpu" in cond(third, "SliceReady")["message"]
    assert status.patch_for(second, third) is not None


def test_unschedulable_reasons_keep_their_order_when_their_counts_cross():
    # As measured with jobs waiting for a busy slice: the scheduler lists the larger count first.
    before = ("0/20 nodes are available: 12 node(s) didn't match Pod's node affinity/selector, 8 Insufficient "
              "google.com/tpu. no new claims to deallocate, preemption: 0/20 nodes are available: 20 Preemption "
              "is not helpful for scheduling.")
    after = ("0/20 nodes are available: 11 Insufficient google.com/tpu, 9 node(s) didn't match Pod's node "
             "affinity/selector. no new claims to deallocate, preemption: 0/20 nodes are available: 20 Preemption "
             "is not helpful for scheduling.")
    first = derive("initializing", pods=[unschedulable_pod(before)], now=T0)
    second = derive("initializing", previous=first, pods=[unschedulable_pod(after)], now=T1)
    assert status.patch_for(first, second) is None
    assert cond(second, "SliceReady")["message"].endswith(
        "no nodes are available: Insufficient google.com/tpu, node(s) didn't match Pod's node affinity/selector. "
        "no new claims to deallocate, preemption: no nodes are available: Preemption is not helpful for scheduling.")


def worker_pod(name, ready, role="worker"):
    return {"metadata": {"name": name, "labels": {"ray.io/node-type": role}},
            "status": {"conditions": [{"type": "PodScheduled", "status": "True"},
                                      {"type": "Ready", "status": "True" if ready else "False"}]}}


def test_ready_hosts_come_from_the_worker_pods_when_there_are_any():
    pods = [worker_pod("w0", True), worker_pod("w1", True), worker_pod("w2", False), worker_pod("h", True, role="head")]
    # The RayJob's copy of the RayCluster status says 4 ready; the pods say 2 of the workers are.
    st = derive("running", pods=pods)
    assert st["hostsReady"] == "2/4"
    assert cond(st, "SliceReady")["reason"] == "WaitingForHosts"
    # No pods any more (the cluster was shut down after the job): KubeRay's last word stands.
    assert derive("succeeded")["hostsReady"] == "4/4"


def test_transition_time_moves_only_when_status_flips():
    first = derive("initializing", now=T0)
    second = derive("partly-ready", previous=first, now=T1)  # still False, message changed
    assert cond(second, "SliceReady")["lastTransitionTime"] == T0
    third = derive("running", previous=second, now=T2)
    assert cond(third, "SliceReady")["lastTransitionTime"] == T2
    assert cond(third, "Validated")["lastTransitionTime"] == T0


def test_patch_only_when_something_but_time_changed():
    first = derive("running", now=T0)
    assert status.patch_for(first, derive("running", previous=first, now=T1)) is None
    patch = status.patch_for(first, derive("succeeded", previous=first, now=T1))
    assert patch["phase"] == "Succeeded"


def test_fields_we_no_longer_have_are_nulled_in_the_patch():
    running = derive("running")
    invalid = status.invalid([spec.FieldError("spec.image", "", "must not be empty")], 2, running, T1)
    patch = status.patch_for(running, invalid)
    assert patch["workers"] is None and patch["rayClusterName"] is None
    assert patch["phase"] == "Failed"


def test_invalid_status():
    err = spec.FieldError("spec.tpu.topology", "4x5", "is not a v6e slice on GKE; allowed: 1x1")
    st = status.invalid([err], 3, {}, T0)
    assert st["phase"] == "Failed" and st["observedGeneration"] == 3
    c = cond(st, "Validated")
    assert (c["status"], c["reason"]) == ("False", "ValidationFailed")
    assert "spec.tpu.topology: '4x5' is not a v6e slice" in c["message"]


def test_events_on_transitions():
    created = derive("initializing")
    evs = status.events({}, created)
    assert [(e.type, e.reason) for e in evs] == [("Normal", "Created")]
    running = derive("running", previous=created)
    evs = status.events(created, running)
    assert [(e.type, e.reason) for e in evs] == [("Normal", "AllHostsReady"), ("Normal", "Running")]
    failed = derive("failed", previous=running)
    reasons = [(e.type, e.reason) for e in status.events(running, failed)]
    assert ("Warning", "AppFailed") in reasons and ("Normal", "JobFinished") in reasons
    assert status.events(failed, derive("failed", previous=failed)) == []


def test_a_suspend_is_one_suspended_event():
    running = derive("running")
    suspended = derive("suspended", previous=running)
    assert [e.reason for e in status.events(running, suspended)].count("Suspended") == 1


def test_invalid_spec_event_is_a_warning():
    st = status.invalid([spec.FieldError("spec.image", "", "must not be empty")], 1, {}, T0)
    evs = status.events({}, st)
    assert ("Warning", "ValidationFailed") in [(e.type, e.reason) for e in evs]


def test_finished_means_the_ray_job_ended_not_a_failed_validation():
    assert status.finished(derive("succeeded")) and status.finished(derive("failed"))
    assert not status.finished(derive("running")) and not status.finished(derive(None))
    invalid = status.invalid([spec.FieldError("spec.image", "", "must not be empty")], 1, {}, T0)
    assert invalid["phase"] == "Failed" and not status.finished(invalid)  # fixing the spec may still run it


def test_with_groups_only_the_training_slices_hosts_count():
    job = spec.parse(body(groups=[{"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "4x4"}}, {"name": "reward"}]))

    def pod(name, group, ready):
        p = worker_pod(name, ready)
        p["metadata"]["labels"]["ray.io/group"] = group
        return p

    rollout = [pod(f"r{i}", "rollout", True) for i in range(4)] + [pod("rw", "reward", True)]
    pods = [pod("t0", "tpu-slice", True), pod("t1", "tpu-slice", False)] + rollout
    st = status.derive(job, 1, rayjob("running"), pods, {}, T0)
    assert st["hostsReady"] == "1/4" and st["hosts"] == 4  # the rollout slice's 4 ready hosts are not the job's
    assert cond(st, "SliceReady")["reason"] == "WaitingForHosts"
    # Without groups, every worker pod is a host of the one slice (as before).
    assert status.derive(JOB, 1, rayjob("running"), [worker_pod(f"w{i}", True) for i in range(4)], {}, T0)["hostsReady"] == "4/4"


def tpu_host(name, env=("TPU_WORKER_ID", "TPU_NAME", "TPU_WORKER_HOSTNAMES"), ready=True):
    pod = worker_pod(name, ready=ready)
    pod["spec"] = {"containers": [{"name": "ray-worker", "resources": {"limits": {"google.com/tpu": "4"}},
                                   "env": [{"name": e} for e in env]}]}
    return pod


def test_a_multi_host_slice_without_the_tpu_webhooks_variables_is_pending_and_says_so():
    hosts = [tpu_host(f"demo-x7k2p-tpu-slice-worker-{i}") for i in range(3)]
    hosts.append(tpu_host("demo-x7k2p-tpu-slice-worker-3", env=("TPU_NAME",)))
    st = derive("running", pods=hosts)
    c = cond(st, "SliceReady")
    assert (c["status"], c["reason"]) == ("False", "TPUWebhookMissing")
    assert c["message"].startswith("pod demo-x7k2p-tpu-slice-worker-3, a host of a 4-host TPU slice, was created "
                                   "without TPU_WORKER_ID and TPU_WORKER_HOSTNAMES: the GKE Ray TPU webhook")
    assert "not installed" in c["message"] and "docs/compatibility.md" in c["message"]
    assert st["phase"] == "Pending" and st["message"] == c["message"]  # every host Ready, yet no slice
    assert ("Warning", "TPUWebhookMissing") in [(e.type, e.reason) for e in status.events({}, st)]
    # With the webhook's variables on every host, the same pods are a ready slice.
    st = derive("running", pods=[tpu_host(f"demo-x7k2p-tpu-slice-worker-{i}") for i in range(4)])
    assert cond(st, "SliceReady")["reason"] == "AllHostsReady" and st["phase"] == "Running"


def test_the_webhook_check_needs_a_multi_host_slice_and_known_containers():
    single = spec.parse(body(tpu={"topology": "2x2"}))
    st = status.derive(single, 1, rayjob("running"), [tpu_host("demo-w-0", env=())], {}, T0)
    assert cond(st, "SliceReady")["reason"] != "TPUWebhookMissing"  # a single host needs none of them
    assert cond(derive("running", pods=[worker_pod(f"w{i}", True) for i in range(4)]), "SliceReady")["reason"] == "AllHostsReady"
    head = tpu_host("demo-head", env=())
    head["metadata"]["labels"]["ray.io/node-type"] = "head"
    assert cond(derive("running", pods=[head, *(tpu_host(f"w{i}") for i in range(4))]), "SliceReady")["reason"] == "AllHostsReady"


def test_a_finished_job_is_not_pending_for_the_webhook():
    st = derive("succeeded", pods=[tpu_host(f"w{i}", env=()) for i in range(4)])
    assert st["phase"] == "Succeeded" and cond(st, "SliceReady")["reason"] == "JobFinished"


def test_a_rayjob_without_the_auth_options_it_was_created_with_says_the_cluster_runs_without_auth():
    dropped = {**rayjob("running"), "spec": {"rayClusterSpec": {}}}  # KubeRay 1.5.0's CRD pruned them
    st = status.derive(JOB, 1, dropped, [], {}, T0)
    auth = cond(st, "RayAuth")
    assert (auth["status"], auth["reason"]) == ("False", "AuthOptionsDropped")
    assert "runs WITHOUT token authentication" in auth["message"] and "spec.rayClusterSpec.authOptions" in auth["message"]
    assert st["phase"] == "Running"  # the job runs on: the condition and a Warning say what it lacks
    assert ("Warning", "AuthOptionsDropped") in [(e.type, e.reason) for e in status.events({}, st)]
    kept = cond(derive("running"), "RayAuth")
    assert (kept["status"], kept["reason"]) == ("True", "TokenAuth") and "demo-ray-token-0a1b2c" in kept["message"]
    assert cond(derive(None), "RayAuth") is None  # no RayJob yet: nothing to say


def test_a_job_that_reaches_a_bucket_as_the_default_account_says_so_before_the_slice():
    """Issue 55: StorageIdentity=False (a Warning event) names the field, the value and the fix while the
    job is still Pending; with spec.serviceAccountName, or without any gs://, there is no such condition."""
    unbound = spec.parse(body(entrypoint="python train.py --storage-path gs://team-ckpt/run"))
    st = status.derive(unbound, 1, None, [], {}, T0)
    found = cond(st, "StorageIdentity")
    assert found["status"] == "False" and found["reason"] == "DefaultServiceAccount"
    assert found["message"].startswith("spec.entrypoint is gs://team-ckpt/run but spec.serviceAccountName is unset")
    assert [e.type for e in status.events({}, st) if e.reason == "DefaultServiceAccount"] == ["Warning"]
    bound = spec.parse(body(entrypoint="python train.py --storage-path gs://team-ckpt/run", serviceAccountName="ray-tpu"))
    assert cond(status.derive(bound, 1, None, [], {}, T0), "StorageIdentity") is None
    assert cond(derive(None), "StorageIdentity") is None  # python train.py: no bucket
