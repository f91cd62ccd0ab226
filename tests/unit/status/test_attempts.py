"""Why an attempt ended (status/attempts.py) and what the job's status makes of it (status/job.py):
a lost host or head is the infrastructure's failure, a script that fails on a healthy slice the
application's; each has its own budget; the phase is Retrying between attempts."""

import pytest

from tputorch import status as statuses
from tputorch.api import spec
from tputorch.status import attempts
from tputorch.status.job import ATTEMPT_LABEL, attempt_of_child, child_must_go

from ..jobs import body

NOW = "2026-12-01T10:00:00Z"
RUNNING = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "demo-abcde"}
APP_FAILED = {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED", "reason": "AppFailed",
              "message": "Job entrypoint command failed with exit code 1, last available logs:\n"
                         "Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                         "ValueError: learning rate must be positive\n"}


def pod(name, role="worker", **extra):
    meta = {"name": name, "labels": {"ray.io/node-type": role, "ray.io/cluster": "demo-abcde"}}
    meta.update(extra.pop("meta", {}))
    p = {"metadata": meta, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    p["status"].update(extra)
    return p


def healthy():
    return [pod("demo-head", "head")] + [pod(f"demo-tpu-{i}") for i in range(4)]


def disrupted(reason):
    p = pod("demo-tpu-2")
    p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "x"})
    return p


# --- the pure classification ---------------------------------------------------------------------

def test_a_running_job_on_a_healthy_slice_has_not_ended():
    assert attempts.classify(RUNNING, healthy()) is None


@pytest.mark.parametrize("k8s_reason,ours", [
    ("PreemptionByScheduler", "PodPreempted"), ("DeletionByTaintManager", "NodeUnreachable"),
    ("EvictionByEvictionAPI", "PodEvicted"), ("DeletionByPodGC", "NodeDeleted"),
    ("TerminationByKubelet", "NodeShutdown"),
])
def test_every_disruption_of_a_host_is_the_infrastructures(k8s_reason, ours):
    ending = attempts.classify(RUNNING, healthy()[:3] + [disrupted(k8s_reason)])
    assert (ending.result, ending.reason) == (attempts.INFRASTRUCTURE, ours)
    assert "demo-tpu-2" in ending.message and k8s_reason in ending.message


@pytest.mark.parametrize("pod_reason,ours", [("Evicted", "PodEvicted"), ("NodeShutdown", "NodeShutdown"), ("Terminated", "NodeShutdown")])
def test_a_host_pod_failed_by_its_node_is_the_infrastructures(pod_reason, ours):
    failed = pod("demo-tpu-1", phase="Failed", reason=pod_reason, message="The node was low on resource")
    ending = attempts.classify(RUNNING, healthy()[:2] + [failed])
    assert (ending.result, ending.reason) == (attempts.INFRASTRUCTURE, ours)


def test_a_deleted_host_or_head_is_lost_and_the_head_is_named_first():
    deleting = pod("demo-tpu-3", meta={"deletionTimestamp": NOW})
    assert attempts.classify(RUNNING, healthy()[:3] + [deleting]).reason == "PodDeleted"
    ending = attempts.classify(RUNNING, healthy()[1:], deleted=[pod("demo-tpu-0"), pod("demo-head", "head")])
    assert (ending.result, ending.reason) == (attempts.INFRASTRUCTURE, "HeadLost")
    assert "head pod demo-head" in ending.message


def test_a_script_that_fails_on_a_healthy_slice_is_the_applications_and_names_the_exception():
    ending = attempts.classify(APP_FAILED, healthy())
    assert (ending.result, ending.reason) == (attempts.APPLICATION, "AppFailed")
    assert ending.message.startswith("the script raised ValueError: learning rate must be positive; ")
    assert APP_FAILED["message"] in ending.message, "Ray's own message is kept after the exception"


def test_a_failure_after_a_host_was_lost_is_the_infrastructures():
    ending = attempts.classify(APP_FAILED, healthy(), deleted=[pod("demo-tpu-1")])
    assert ending.result == attempts.INFRASTRUCTURE


def test_pods_kuberay_deletes_after_the_job_ended_do_not_make_its_failure_the_infrastructures():
    """KubeRay deletes a finished job's cluster; under load the operator may see those deletions
    before the RayJob's end. A deletion asked for (deletionTimestamp less the grace period) at or
    after the RayJob's endTime is that teardown; one asked for before it lost the job a host."""
    ended = {**APP_FAILED, "endTime": "2026-12-01T10:00:00Z"}
    torn_down = [pod("demo-head", "head", meta={"deletionTimestamp": "2026-12-01T10:00:31Z", "deletionGracePeriodSeconds": 30}),
                 pod("demo-tpu-0", meta={"deletionTimestamp": "2026-12-01T10:00:30Z", "deletionGracePeriodSeconds": 30})]
    assert attempts.classify(ended, healthy()[2:] + torn_down[:1], deleted=torn_down[1:]).result == attempts.APPLICATION
    # Asked for 10 s before the end (deletionTimestamp 10:00:20 less 30 s): the head was lost first.
    lost_first = pod("demo-head", "head", meta={"deletionTimestamp": "2026-12-01T10:00:20Z", "deletionGracePeriodSeconds": 30})
    ending = attempts.classify(ended, healthy()[1:] + [lost_first])
    assert (ending.result, ending.reason) == (attempts.INFRASTRUCTURE, "HeadLost")
    # A pod that vanished without a deletionTimestamp seen: cannot be told apart, lost.
    assert attempts.classify(ended, healthy()[1:], deleted=[pod("demo-head", "head")]).result == attempts.INFRASTRUCTURE
    # A node's end of a pod after the job's end still counts (only a plain deletion is teardown).
    gone_node = disrupted("DeletionByPodGC")
    gone_node["metadata"].update(deletionTimestamp="2026-12-01T10:00:31Z", deletionGracePeriodSeconds=30)
    assert attempts.classify(ended, healthy()[:2] + [gone_node]).result == attempts.INFRASTRUCTURE
    # The slimmed pod the operator stores keeps what this needs.
    from tputorch.controller.stores import slim_pod
    assert slim_pod(torn_down[0])["metadata"]["deletionGracePeriodSeconds"] == 30


def test_a_deadline_is_final_and_success_is_success():
    deadline = {"jobDeploymentStatus": "Failed", "jobStatus": "RUNNING", "reason": "DeadlineExceeded"}
    assert attempts.classify(deadline, healthy()).result == attempts.FINAL
    done = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    assert attempts.classify(done, [], deleted=[pod("demo-tpu-0")]).result == attempts.SUCCEEDED


def test_the_budget_is_counted_per_kind_of_failure():
    history = [{"result": "Infrastructure"}, {"result": "Application"}, {"result": "Infrastructure"}]
    assert attempts.retries_left("Infrastructure", history, {"infrastructure": 10, "application": 0}) == 8
    assert attempts.retries_left("Application", history, {"infrastructure": 10, "application": 1}) == 0
    assert attempts.retries_left("Final", [], {"infrastructure": 10, "application": 1}) == 0


# --- the job's status --------------------------------------------------------------------------

def job(**spec_extra):
    return spec.parse(body(**spec_extra))


def rayjob(status, attempt=1):
    return {"metadata": {"name": "demo", "labels": {ATTEMPT_LABEL: str(attempt)}}, "status": status}


def derive(job_spec, rj, pods=(), previous=None, deleted=()):
    return statuses.derive(job_spec, 1, rj, list(pods), previous or {}, NOW, deleted=list(deleted))


def test_a_lost_host_starts_a_new_attempt_and_the_old_rayjob_must_go():
    j = job()
    first = derive(j, rayjob(RUNNING), healthy())
    assert (first["phase"], first["attempts"]) == ("Running", 1) and "attemptHistory" not in first
    lost = derive(j, rayjob(RUNNING), healthy()[:4], first, deleted=[pod("demo-tpu-3")])
    assert (lost["phase"], lost["attempts"]) == ("Retrying", 2)
    (record,) = lost["attemptHistory"]
    assert (record["attempt"], record["result"], record["reason"]) == (1, "Infrastructure", "PodDeleted")
    assert "demo-tpu-3" in lost["message"] and "attempt 2" in lost["message"]
    assert child_must_go(lost, rayjob(RUNNING)) and not child_must_go(lost, rayjob({}, attempt=2))
    # The old RayJob, still there, changes nothing; the new one starting keeps the job Retrying.
    assert derive(j, rayjob(RUNNING), [], lost)["attemptHistory"] == lost["attemptHistory"]
    starting = derive(j, rayjob({"jobDeploymentStatus": "Initializing"}, attempt=2), [], lost)
    assert (starting["phase"], starting["attempts"]) == ("Retrying", 2)
    running = derive(j, rayjob(RUNNING, attempt=2), healthy(), starting)
    done = derive(j, rayjob({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, attempt=2), [], running)
    assert (done["phase"], done["attempts"]) == ("Succeeded", 2)
    assert [(a["attempt"], a["result"]) for a in done["attemptHistory"]] == [(1, "Infrastructure"), (2, "Succeeded")]
    assert derive(j, rayjob({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, attempt=2), [], done) == done


def test_a_script_that_raises_fails_after_one_attempt_by_default():
    failed = derive(job(), rayjob(APP_FAILED), healthy(), derive(job(), rayjob(RUNNING), healthy()))
    assert (failed["phase"], failed["attempts"]) == ("Failed", 1)
    cond = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "AppFailed" and "ValueError: learning rate must be positive" in cond["message"]
    assert not child_must_go(failed, rayjob(APP_FAILED))  # KubeRay ended it: it stays for inspection


def test_application_retries_and_infrastructure_budget_run_out():
    j = job(retries={"application": 1, "infrastructure": 1})
    again = derive(j, rayjob(APP_FAILED), healthy())
    assert (again["phase"], again["attempts"]) == ("Retrying", 2)
    lost = derive(j, rayjob(RUNNING, attempt=2), healthy()[:4], again, deleted=[pod("demo-tpu-3")])
    assert (lost["phase"], lost["attempts"]) == ("Retrying", 3)
    out = derive(j, rayjob(RUNNING, attempt=3), healthy()[:4], lost, deleted=[pod("demo-tpu-0")])
    assert (out["phase"], out["attempts"]) == ("Failed", 3)
    assert "after 1 retries" in next(c for c in out["conditions"] if c["type"] == "Failed")["message"]
    assert child_must_go(out, rayjob(RUNNING, attempt=3))  # out of retries: free the slice


def test_no_loss_is_seen_while_suspended_or_suspending():
    j = job(suspend=True)
    assert derive(j, rayjob({"jobDeploymentStatus": "Suspending"}), [pod("demo-tpu-0", meta={"deletionTimestamp": NOW})])["phase"] == "Suspended"


def test_a_rayjob_without_the_label_is_attempt_one():
    assert attempt_of_child({"metadata": {}}) == 1 and attempt_of_child(rayjob({}, attempt=3)) == 3


# --- why a slice does not start, in words a user can act on --------------------------------------

def waiting(name, reason, message, image="example.com/ray-torch-tpu:2.60.0"):
    p = pod(name)
    p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    p["status"]["containerStatuses"] = [{"name": "ray-worker", "image": image, "state": {"waiting": {"reason": reason, "message": message}}}]
    return p


@pytest.mark.parametrize("reason,message,words", [
    ("ImagePullBackOff", "Back-off pulling image", "(image example.com/ray-torch-tpu:2.60.0): ImagePullBackOff"),
    ("ErrImagePull", "rpc error: not found", "(image example.com/ray-torch-tpu:2.60.0): ErrImagePull: rpc error"),
    ("CreateContainerConfigError", 'secret "hf" not found', 'container ray-worker: CreateContainerConfigError: secret "hf" not found'),
])
def test_a_container_that_cannot_start_names_the_image_or_the_secret(reason, message, words):
    st = derive(job(), rayjob({"jobDeploymentStatus": "Initializing"}), [pod("demo-head", "head"), waiting("demo-tpu-1", reason, message)])
    cond = next(c for c in st["conditions"] if c["type"] == "SliceReady")
    assert (st["phase"], cond["reason"]) == ("Pending", reason)
    assert "pod demo-tpu-1" in cond["message"] and words in cond["message"]
    assert (("Warning", reason) in {(e.type, e.reason) for e in statuses.events({}, st)})


def test_an_init_container_that_cannot_start_is_named_not_the_one_it_holds():
    """KubeRay's wait-gcs-ready init container gets the token Secret's env too: while the Secret is
    missing it waits (CreateContainerConfigError) and the Ray container behind it PodInitializing."""
    p = pod("demo-tpu-1")
    p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    p["status"]["initContainerStatuses"] = [{"name": "wait-gcs-ready", "image": "i", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "demo-ray-token-abc123" not found'}}}]
    p["status"]["containerStatuses"] = [{"name": "ray-worker", "image": "i", "state": {"waiting": {"reason": "PodInitializing"}}}]
    st = derive(job(), rayjob({"jobDeploymentStatus": "Initializing"}), [pod("demo-head", "head"), p])
    cond = next(c for c in st["conditions"] if c["type"] == "SliceReady")
    assert (st["phase"], cond["reason"]) == ("Pending", "CreateContainerConfigError")
    assert cond["message"] == ('pod demo-tpu-1 container wait-gcs-ready: CreateContainerConfigError: '
                              'secret "demo-ray-token-abc123" not found')


def test_a_quota_that_refuses_the_pods_is_named():
    rj = rayjob({"jobDeploymentStatus": "Initializing", "rayClusterStatus": {"conditions": [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreateWorkerPod",
         "message": 'pods "demo-tpu-0" is forbidden: exceeded quota: tpu, requested: google.com/tpu=4, used: google.com/tpu=0, limited: google.com/tpu=2'}]}})
    cond = next(c for c in derive(job(), rj, [])["conditions"] if c["type"] == "SliceReady")
    assert cond["reason"] == "QuotaExceeded" and "limited: google.com/tpu=2" in cond["message"]


def _going(name, role="worker", finalizers=(), deleted="2026-12-01T10:00:30Z"):
    meta = {"name": name, "labels": {"ray.io/node-type": role}, "deletionTimestamp": deleted,
            "deletionGracePeriodSeconds": 30}
    if finalizers:
        meta["finalizers"] = list(finalizers)
    return {"metadata": meta, "spec": {"nodeName": f"node-{name}"}}


def test_no_earlier_pods_no_wait():
    assert attempts.earlier_pods([], 2, "2026-12-01T10:00:00Z", "2026-12-01T10:00:05Z") is None


def test_earlier_pods_hold_the_next_attempt_and_are_named_until_the_deadline():
    waiting = attempts.earlier_pods([_going("w-1"), _going("h", "head")], 2, "2026-12-01T10:00:00Z", "2026-12-01T10:04:00Z")
    assert waiting.reason == attempts.EARLIER_PODS_WAITING
    assert "attempt 2" in waiting.message and "h, w-1 still terminating" in waiting.message
    assert waiting.recheck_s == attempts.EARLIER_PODS_DEADLINE_S - 240


def test_past_the_deadline_the_pod_a_finalizer_holds_is_named():
    pods = [_going("h", "head"), _going("w-1", finalizers=["example.com/hold"])]
    stuck = attempts.earlier_pods(pods, 3, "2026-12-01T10:00:00Z", "2026-12-01T10:10:00Z")
    assert (stuck.reason, stuck.recheck_s) == (attempts.EARLIER_PODS_STUCK, None)
    assert "pod w-1 holds it" in stuck.message and "example.com/hold" in stuck.message and "on node node-w-1" in stuck.message


def test_without_a_recorded_end_the_deadline_counts_from_the_deletion_asked():
    """Attempt 1 and the pods of an earlier object of the same name: deleted at 10:00:00 (30 s grace)."""
    assert attempts.earlier_pods([_going("h", "head")], 1, None, "2026-12-01T10:09:59Z").reason == attempts.EARLIER_PODS_WAITING
    stuck = attempts.earlier_pods([_going("h", "head")], 1, None, "2026-12-01T10:10:00Z")
    assert stuck.reason == attempts.EARLIER_PODS_STUCK and "earlier TPUTorchJob of this name" in stuck.message


def test_pods_not_yet_deleted_wait_with_no_deadline_clock():
    pod = {"metadata": {"name": "h", "labels": {"ray.io/node-type": "head"}}}
    waiting = attempts.earlier_pods([pod], 1, None, "2026-12-01T10:00:00Z")
    assert (waiting.reason, waiting.recheck_s) == (attempts.EARLIER_PODS_WAITING, None)
