"""Attempts through the fake API adapter: a host pod deleted while the job runs ends the attempt
(status first, then the RayJob deleted by its uid), the next RayJob carries the next attempt's
label, and a script that fails is not run again."""

from __future__ import annotations

import asyncio

from tputorch import train
from tputorch.controller import stores
from tputorch.status.job import ATTEMPT_LABEL

from ..fakekube import FakeKube, controller
from ..jobs import body

KIND = "TPUTorchJob"
KEY = (KIND, "ml", "demo")
RUNNING = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "demo-abcde"}


def run(coro):
    return asyncio.run(coro)


def pod(name, role="worker", cluster="demo-abcde"):
    return stores.slim_pod({"metadata": {"name": name, "namespace": "ml", "resourceVersion": "7", "labels": {
        "ray.io/node-type": role, "ray.io/cluster": cluster, "tputorch.io/job": "demo"}},
        "spec": {"nodeName": f"node-{name}"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})


def started(kube: FakeKube, **options):
    """A job whose first RayJob runs on a slice of four ready hosts."""
    ctl = controller(kube, **options)
    parent = body()
    parent["metadata"].update(uid="uid-job", resourceVersion="10")
    ctl.parents[KIND].remember(parent)
    assert run(ctl.reconcile(KEY)) == "created"
    rayjob = kube.objects[("rayjobs", "ml", "demo")]
    assert rayjob["metadata"]["labels"][ATTEMPT_LABEL] == "1"
    seen(ctl.children[KIND], newer(rayjob, RUNNING))
    for p in [pod("demo-head", "head")] + [pod(f"demo-tpu-{i}") for i in range(4)]:
        ctl.pods.remember(p)
    run(ctl.reconcile(KEY))
    assert last_status(kube)["phase"] == "Running"
    return ctl


def newer(obj: dict, status: dict) -> dict:
    """The object as its next watch event brings it, with ``status``."""
    meta = obj["metadata"]
    return {**obj, "metadata": {**meta, "resourceVersion": str(int(meta["resourceVersion"]) + 1000)}, "status": status}


def seen(informer, obj: dict) -> None:
    """A watch event bringing ``obj``."""
    informer._put(informer.slim(obj))


def last_status(kube: FakeKube) -> dict:
    return kube.called("patch_status")[-1][4]


def test_a_deleted_host_pod_ends_the_attempt_and_the_next_rayjob_is_attempt_two():
    kube = FakeKube()
    ctl = started(kube)
    old_uid = kube.objects[("rayjobs", "ml", "demo")]["metadata"]["uid"]
    gone = pod("demo-tpu-2")
    ctl.pods._pop(("ml", "demo-tpu-2"))
    ctl.pod_changed("DELETED", gone)

    assert run(ctl.reconcile(KEY)) == "attempt-ended"
    status = last_status(kube)
    assert (status["phase"], status["attempts"]) == ("Retrying", 2)
    assert status["attemptHistory"][0]["reason"] == "PodDeleted" and "demo-tpu-2" in status["message"]
    # The status is written before the RayJob goes, and the delete names the RayJob's uid.
    order = [c[0] for c in kube.calls]
    assert order.index("delete") > len(order) - 1 - order[::-1].index("patch_status")
    assert kube.called("delete") == [("delete", "rayjobs", "ml", "demo", old_uid)]

    ctl.child.seen(KEY, "DELETED", ctl.children[KIND]._pop(("ml", "demo")))  # its DELETED event
    gone_all(ctl)
    assert run(ctl.reconcile(KEY)) == "created"
    second = kube.objects[("rayjobs", "ml", "demo")]
    assert second["metadata"]["labels"][ATTEMPT_LABEL] == "2"
    assert last_status(kube)["phase"] == "Retrying"
    # the script learns its attempt and when it started (tputorch.train.attempt(), checkpoint())
    head = second["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in head["env"]}
    assert (env[train.ENV_ATTEMPT], env[train.ENV_ATTEMPT_STARTED]) == ("2", "2026-11-30T00:00:00Z")


def gone_all(ctl) -> None:
    """Every pod of the job's clusters deleted (their DELETED events)."""
    for p in list(ctl.pods.indexed(("tputorch.io/job", "ml", "demo"))):
        ctl.pods._pop(("ml", p["metadata"]["name"]))
        ctl.pod_changed("DELETED", p)


def ended_attempt_one(kube: FakeKube):
    """Attempt 1 ended on a lost host and its RayJob is gone, while the other pods of its slice
    are still terminating (the head held by a finalizer)."""
    ctl = started(kube, status_interval=0)  # every status change written at once
    ctl.pods._pop(("ml", "demo-tpu-2"))
    ctl.pod_changed("DELETED", pod("demo-tpu-2"))
    assert run(ctl.reconcile(KEY)) == "attempt-ended"
    for p in [pod("demo-head", "head")] + [pod(f"demo-tpu-{i}") for i in (0, 1, 3)]:
        raw = {**p, "metadata": {**p["metadata"], "resourceVersion": "9", "deletionTimestamp": "2026-11-30T00:00:30Z",
                                 "deletionGracePeriodSeconds": 30}}
        if p["metadata"]["name"] == "demo-head":
            raw["metadata"]["finalizers"] = ["example.com/hold"]
        ctl.pods._put(stores.slim_pod(raw))  # the watch brings the pod being deleted
    ctl.child.seen(KEY, "DELETED", ctl.children[KIND]._pop(("ml", "demo")))
    kube.calls.clear()
    return ctl


def test_the_next_attempt_waits_until_every_pod_of_the_previous_one_is_gone():
    """The RayJob of attempt 1 is gone but its pods are not: attempt 2 is not created, the status
    says why and names them; once they are gone it is."""
    kube = FakeKube()
    ctl = ended_attempt_one(kube)
    assert run(ctl.reconcile(KEY)) == "waiting"
    assert kube.called("create") == []
    status = last_status(kube)
    created = next(c for c in status["conditions"] if c["type"] == "RayJobCreated")
    assert (status["phase"], status["attempts"], created["status"], created["reason"]) == \
        ("Retrying", 2, "False", "PreviousAttemptTerminating")
    for name in ("demo-head", "demo-tpu-0", "demo-tpu-1", "demo-tpu-3"):
        assert name in created["message"] and name in status["message"]

    ctl.pods._pop(("ml", "demo-tpu-0"))  # one pod left: still waiting
    ctl.pod_changed("DELETED", pod("demo-tpu-0"))
    assert run(ctl.reconcile(KEY)) == "waiting" and kube.called("create") == []

    gone_all(ctl)
    assert run(ctl.reconcile(KEY)) == "created"
    assert kube.objects[("rayjobs", "ml", "demo")]["metadata"]["labels"][ATTEMPT_LABEL] == "2"


def test_past_the_deadline_the_status_names_the_pod_that_holds_the_next_attempt():
    kube = FakeKube()
    ctl = ended_attempt_one(kube)
    run(ctl.reconcile(KEY))
    ctl.clock = lambda: "2026-11-30T00:10:01Z"  # attempt 1 ended at 00:00:00
    assert run(ctl.reconcile(KEY)) == "waiting"
    run(ctl.recorder.drain())
    created = next(c for c in last_status(kube)["conditions"] if c["type"] == "RayJobCreated")
    assert created["reason"] == "PreviousAttemptStuck"
    assert "pod demo-head holds it" in created["message"] and "example.com/hold" in created["message"]
    assert ("event", "demo", "PreviousAttemptStuck") in kube.called("event")
    assert kube.called("create") == []


def test_a_rayjob_of_an_ended_attempt_seen_again_is_deleted_not_observed():
    """After a restart (nothing in memory) the status says attempt 2 and the store still has
    attempt 1's RayJob: it is deleted, never reported on."""
    kube = FakeKube()
    ctl = started(kube)
    parent = ctl.parents[KIND].get(("ml", "demo"))
    seen(ctl.parents[KIND], {**parent, "metadata": {**parent["metadata"], "resourceVersion": "11"},
                                "status": {"phase": "Retrying", "attempts": 2, "attemptHistory": [
                                    {"attempt": 1, "result": "Infrastructure", "reason": "NodeDeleted", "message": "m",
                                     "endTime": "2026-12-01T10:00:00Z"}]}})
    kube.calls.clear()
    assert run(ctl.reconcile(KEY)) == "retry"
    assert [c[0] for c in kube.calls if c[0] in ("delete", "create")] == ["delete"]


def test_a_script_that_fails_is_not_retried_and_its_rayjob_stays():
    kube = FakeKube()
    ctl = started(kube)
    rayjob = ctl.children[KIND].get(("ml", "demo"))
    seen(ctl.children[KIND], newer(rayjob, {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED",
                                               "reason": "AppFailed", "message": "RuntimeError: boom"}))
    run(ctl.reconcile(KEY))
    status = last_status(kube)
    assert (status["phase"], status["attempts"]) == ("Failed", 1)
    assert kube.called("delete") == []


def test_pods_of_an_earlier_cluster_deleted_later_do_not_end_the_current_attempt():
    kube = FakeKube()
    ctl = started(kube)
    ctl.pod_changed("DELETED", pod("demo-tpu-0", cluster="demo-older"))
    run(ctl.reconcile(KEY))
    assert last_status(kube)["phase"] == "Running" and kube.called("delete") == []


def test_a_job_that_just_succeeded_is_not_retried_on_its_cleanup():
    """KubeRay deletes a finished job's cluster: when the pods' deletions arrive before the RayJob's
    own event, the RayJob is read again before its attempt is ended, and it says Succeeded."""
    kube = FakeKube()
    ctl = started(kube)
    stored = kube.objects[("rayjobs", "ml", "demo")]
    kube.objects[("rayjobs", "ml", "demo")] = newer(newer(stored, {}), {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    ctl.pods._pop(("ml", "demo-tpu-0"))
    ctl.pod_changed("DELETED", pod("demo-tpu-0"))
    run(ctl.reconcile(KEY))
    status = last_status(kube)
    assert (status["phase"], status["attempts"]) == ("Succeeded", 1)
    assert kube.called("delete") == []


def test_the_rayjob_read_again_before_an_attempt_ends_never_outlives_its_deletion_in_the_store():
    """The read is the reconcile's alone: had it gone into the store, a deletion event that came
    while it was on the wire would leave a RayJob there that no longer exists, and the next
    attempt would wait for it until the next re-list."""
    kube = FakeKube()
    ctl = started(kube)
    store = ctl.children[KIND]
    rayjob = kube.objects[("rayjobs", "ml", "demo")]
    ctl.pods._pop(("ml", "demo-tpu-2"))
    ctl.pod_changed("DELETED", pod("demo-tpu-2"))
    get = kube.get

    async def get_then_deleted(res, namespace, name):
        answer = newer(newer(await get(res, namespace, name), RUNNING), RUNNING)  # newer than the store's
        del kube.objects[(res.plural, namespace, name)]  # then deleted (KubeRay, a user) ...
        ctl.child.seen(KEY, "DELETED", store._pop((namespace, name)))  # ... and its event handled
        return answer
    kube.get = get_then_deleted
    assert run(ctl.reconcile(KEY)) == "attempt-ended"
    assert store.get(("ml", "demo")) is None
    kube.get = get
    gone_all(ctl)  # the old slice's pods gone too
    assert run(ctl.reconcile(KEY)) == "created"  # the next attempt's RayJob, at once
    assert kube.objects[("rayjobs", "ml", "demo")]["metadata"]["uid"] != rayjob["metadata"]["uid"]
    assert kube.objects[("rayjobs", "ml", "demo")]["metadata"]["labels"][ATTEMPT_LABEL] == "2"
