"""The reconcile's decisions through a fake API adapter: create, wait for a previous object's child,
refuse a foreign one, adopt our own after a 409, suspend, retry with backoff, status that heals,
state swept after a re-list."""

from __future__ import annotations

import asyncio
import copy
import json

import re

import pytest
import urllib3

from tputorch import render
from tputorch.api.network import Peer
from tputorch.render.names import INITIALIZING_TIMEOUT_ANNOTATION, SERVICE_LABEL
from tputorch.render.network import NetworkPolicyConfig
from tputorch.render.raytoken import with_ray_token_secret
from tputorch.controller import kinds, stores
from tputorch import status as statuses
from tputorch.api import spec as statuses_spec
from tputorch.controller.kind import ownership

from ..fakekube import FakeKube, api_error, controller
from ..jobs import body
from ..services import merge_patch

KIND = "TPUTorchJob"
KEY = (KIND, "ml", "demo")


def job(uid="uid-new", rv="10", status=None, **spec):
    b = body(**spec)
    b["metadata"].update(uid=uid, resourceVersion=rv)
    if status is not None:
        b["status"] = status
    return b


def rayjob(owner_uid, name="demo", owner_kind=KIND, rv="50", suspend=False, labels=None, deleting=False, status=None):
    meta = {"name": name, "namespace": "ml", "uid": f"rj-{owner_uid}", "resourceVersion": rv,
            "labels": labels if labels is not None else {"tputorch.io/job": name}}
    if owner_uid:
        meta["ownerReferences"] = [{"apiVersion": "tputorch.io/v1alpha1", "kind": owner_kind, "name": name,
                                    "uid": owner_uid, "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    return {"metadata": meta, "spec": {"suspend": suspend}, "status": status or {}}


def run(coro):
    return asyncio.run(coro)


def setup(parent, child=None, kube=None):
    ctl = controller(kube)
    ctl.parents[KIND].remember(parent)
    if child is not None:
        ctl.children[KIND].remember(child)
    return ctl


def last_status(kube: FakeKube) -> dict:
    return kube.called("patch_status")[-1][4]


def condition(status: dict, ctype: str) -> dict:
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_a_new_job_gets_its_rayjob_owned_by_its_uid():
    ctl = setup(job())
    assert run(ctl.reconcile(KEY)) == "created"
    created = ctl.kube.objects[("rayjobs", "ml", "demo")]
    (owner,) = created["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["kind"], owner["controller"], owner["blockOwnerDeletion"]) == ("uid-new", KIND, True, True)
    assert created["metadata"]["namespace"] == "ml"
    # the store knows it at once: the next event does not create again
    assert run(ctl.reconcile(KEY)) == "unchanged"
    assert [c[1] for c in ctl.kube.called("create")] == ["rayjobs", "secrets"]  # then its token's Secret
    assert condition(last_status(ctl.kube), "RayJobCreated")["status"] == "True"


def test_the_ray_token_secret_comes_right_after_the_rayjob_which_names_and_owns_it(caplog):
    """Owned by the RayJob, not the job: deleting a running TPUTorchJob deletes the RayJob, whose
    finalizer (KubeRay's StopJob) still calls the head with the token; a Secret owned by the job
    would be gone first and hold the RayJob for ever."""
    from tputorch.controller.raytoken import RayTokens

    tokens = RayTokens(b"k" * 32)
    ctl = controller(ray_tokens=tokens)
    ctl.parents[KIND].remember(job())
    with caplog.at_level("INFO", logger="tputorch"):
        assert run(ctl.reconcile(KEY)) == "created"
    # one info line for both (a line costs CPU in a burst): the RayJob's says its Secret comes next
    assert "its Ray token Secret next" in caplog.text and "(the Ray token of" not in caplog.text
    rayjob_ = ctl.kube.objects[("rayjobs", "ml", "demo")]
    name = rayjob_["spec"]["rayClusterSpec"]["authOptions"]["secretName"]
    assert rayjob_["spec"]["rayClusterSpec"]["authOptions"]["mode"] == "token"
    assert re.fullmatch(r"demo-ray-token-[0-9a-f]{6}", name)  # this RayJob's alone
    secret = ctl.kube.objects[("secrets", "ml", name)]
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("RayJob", "demo", rayjob_["metadata"]["uid"])
    token = secret["stringData"]["auth_token"]
    # derived, not random: another replica or a restart with the same key knows it; another key not
    assert token == RayTokens(b"k" * 32).token("ml", name) != RayTokens(b"j" * 32).token("ml", name)
    assert len(token) == 64
    # a RayJob made again (deleted behind the operator's back) names a new Secret
    del ctl.kube.objects[("rayjobs", "ml", "demo")]
    ctl.child.expected.clear()
    assert run(ctl.reconcile(KEY)) == "created"
    assert ctl.kube.objects[("rayjobs", "ml", "demo")]["spec"]["rayClusterSpec"]["authOptions"]["secretName"] != name


def test_a_refused_ray_token_secret_is_said_and_made_on_the_next_try_once():
    ctl = controller(status_interval=0)  # every status change written at once
    ctl.parents[KIND].remember(job())
    ctl.kube.fail["create_secret"].append(api_error(403, body='{"message": "secrets is forbidden: User cannot create"}'))
    assert run(ctl.reconcile(KEY)) == "retry"  # with backoff
    assert ("rayjobs", "ml", "demo") in ctl.kube.objects and ctl.kube.called("create")[-1][1] == "secrets"
    cond = condition(last_status(ctl.kube), "RayJobCreated")
    assert (cond["status"], cond["reason"]) == ("False", "RayTokenSecretNotCreated") and "cannot create" in cond["message"]
    run(ctl.reconcile(KEY))
    assert [c[1] for c in ctl.kube.called("create")] == ["rayjobs", "secrets", "secrets"]
    run(ctl.reconcile(KEY))  # made: not asked again
    assert [c[1] for c in ctl.kube.called("create")] == ["rayjobs", "secrets", "secrets"]
    assert KEY not in ctl.child.problems
    assert condition(last_status(ctl.kube), "RayJobCreated")["status"] == "True"


def with_token(child: dict, secret_name: str = "demo-ray-token-abc123") -> dict:
    child["spec"]["rayClusterSpec"] = {}
    with_ray_token_secret(child, secret_name)
    return child


RUNNING = {"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}


@pytest.mark.parametrize("there", [False, True])
def test_a_new_process_makes_the_token_secret_of_a_rayjob_it_finds_once(there, caplog):
    """Level-based: the process that created the RayJob may have died before its Secret (KubeRay's
    pods would wait for it for ever). A fresh process makes it, or finds it there (409: the name is
    that RayJob's alone, its token derived), and asks no more. Made so, it is logged at info (a
    repair worth reading; made right after its RayJob it is a debug line, see the test above)."""
    ctl = setup(job(), with_token(rayjob("uid-new", status=RUNNING)))
    ctl.writes.interval = 0
    if there:
        ctl.kube.objects[("secrets", "ml", "demo-ray-token-abc123")] = {"made": "earlier"}
    with caplog.at_level("INFO", logger="tputorch"):
        run(ctl.reconcile(KEY))
    assert ("Secret ml/demo-ray-token-abc123 (the Ray token of RayJob demo) created" in caplog.text) == (not there)
    assert [c[1:] for c in ctl.kube.called("create")] == [("secrets", "ml", "demo-ray-token-abc123")]
    secret = ctl.kube.objects[("secrets", "ml", "demo-ray-token-abc123")]
    if not there:
        assert secret["metadata"]["ownerReferences"][0]["uid"] == "rj-uid-new"
        assert secret["stringData"]["auth_token"] == ctl.tokens.ray_tokens.token("ml", "demo-ray-token-abc123")
    assert KEY not in ctl.child.problems
    assert condition(last_status(ctl.kube), "RayJobCreated")["status"] == "True"
    run(ctl.reconcile(KEY))
    assert len(ctl.kube.called("create")) == 1


def test_a_new_process_refused_the_token_secret_says_so_and_tries_again():
    ctl = setup(job(), with_token(rayjob("uid-new", status=RUNNING)))
    ctl.writes.interval = 0
    ctl.kube.fail["create_secret"].append(api_error(403, body='{"message": "secrets is forbidden: User cannot create"}'))
    assert run(ctl.reconcile(KEY)) == "retry"
    cond = condition(last_status(ctl.kube), "RayJobCreated")
    assert (cond["status"], cond["reason"]) == ("False", "RayTokenSecretNotCreated")
    assert "demo-ray-token-abc123" in cond["message"] and "cannot create" in cond["message"]
    run(ctl.reconcile(KEY))
    assert ("secrets", "ml", "demo-ray-token-abc123") in ctl.kube.objects
    assert condition(last_status(ctl.kube), "RayJobCreated")["status"] == "True"


def test_the_token_secret_memory_follows_the_rayjob_and_is_dropped_with_the_job():
    ctl = setup(job(), with_token(rayjob("uid-new", status=RUNNING)))
    run(ctl.reconcile(KEY))
    assert ctl.tokens.made == {KEY: "rj-uid-new"}
    # the RayJob made again (another uid, another Secret): its Secret is made, the entry replaced
    again = with_token(rayjob("uid-new", status=RUNNING), "demo-ray-token-def456")
    again["metadata"]["uid"] = "rj-again"
    ctl.children[KIND]._pop(("ml", "demo"))
    ctl.children[KIND].remember(again)
    run(ctl.reconcile(KEY))
    assert [c[3] for c in ctl.kube.called("create")] == ["demo-ray-token-abc123", "demo-ray-token-def456"]
    assert ctl.tokens.made == {KEY: "rj-again"}
    ctl.parents[KIND]._pop(("ml", "demo"))
    assert run(ctl.reconcile(KEY)) == "gone" and ctl.tokens.made == {}


@pytest.mark.parametrize("secret_name", ["someone-elses", "other-ray-token-abc123"])
def test_no_secret_is_made_for_a_name_the_operator_does_not_give(secret_name):
    """An owned RayJob edited to name another Secret: the operator creates only its own names."""
    ctl = setup(job(), with_token(rayjob("uid-new", status=RUNNING), secret_name))
    run(ctl.reconcile(KEY))
    assert ctl.kube.called("create") == []


def test_the_ray_token_key_must_be_long_enough_and_is_read_without_its_newline(tmp_path):
    from tputorch.controller.raytoken import RayTokens

    with pytest.raises(ValueError, match="at least 32 bytes"):
        RayTokens(b"short")
    (tmp_path / "key").write_bytes(b"k" * 32 + b"\n")
    assert RayTokens.from_file(str(tmp_path / "key")).token("a", "b") == RayTokens(b"k" * 32).token("a", "b")


def test_a_rerun_waits_for_the_previous_jobs_rayjob_then_creates_its_own():
    old = rayjob("uid-old", deleting=True, status={"jobStatus": "STOPPED", "jobDeploymentStatus": "Running"})
    ctl = setup(job(), old)
    assert run(ctl.reconcile(KEY)) == "retry"
    assert ctl.kube.called("create") == [] and ctl.kube.called("patch") == []
    status = last_status(ctl.kube)
    assert status["phase"] == "Pending"
    cond = condition(status, "RayJobCreated")
    assert (cond["status"], cond["reason"]) == ("False", "PreviousRayJobTerminating")
    assert "jobStatus" not in status  # the old job's Ray status is not ours to report
    ctl.children[KIND]._pop(("ml", "demo"))  # the old RayJob is gone (its DELETED event)
    assert run(ctl.reconcile(KEY)) == "created"
    owner = ctl.kube.objects[("rayjobs", "ml", "demo")]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-new"
    assert condition(last_status(ctl.kube), "RayJobCreated")["status"] == "True"


@pytest.mark.parametrize("child", [
    rayjob(None),  # no owner, our labels (as `tputorch render | kubectl apply` makes it)
    rayjob("someone", owner_kind="Workflow"),  # another controller's
])
def test_a_foreign_rayjob_is_never_taken_over(child):
    ctl = setup(job(suspend=True), child)
    assert run(ctl.reconcile(KEY)) == "retry"
    assert ctl.kube.called("patch") == [] and ctl.kube.called("create") == []
    assert condition(last_status(ctl.kube), "RayJobCreated")["reason"] == "RayJobNameTaken"


def test_a_409_on_create_reads_the_rayjob_and_takes_only_its_own():
    kube = FakeKube()
    ctl = setup(job(), kube=kube)
    kube.objects[("rayjobs", "ml", "demo")] = rayjob("uid-new")  # created, watch event late
    assert run(ctl.reconcile(KEY)) == "exists"
    assert ctl.children[KIND].get(("ml", "demo")) is None  # the store is the watch's alone
    assert ctl.child.of(KEY, job()) is not None  # but it counts as existing until its event
    # (that RayJob names no token Secret of ours: none is made for it)
    assert run(ctl.reconcile(KEY)) == "unchanged" and [c[1] for c in kube.called("create")] == ["rayjobs"]

    kube2 = FakeKube()
    ctl2 = setup(job(), kube=kube2)
    kube2.objects[("rayjobs", "ml", "demo")] = rayjob("someone-else", owner_kind="Workflow")
    assert run(ctl2.reconcile(KEY)) == "retry"
    assert condition(last_status(kube2), "RayJobCreated")["reason"] == "RayJobNameTaken"


def test_suspend_follows_the_job_and_nothing_else_is_patched():
    ctl = setup(job(suspend=True), rayjob("uid-new", suspend=False))
    assert run(ctl.reconcile(KEY)) == "child-patched"
    assert ctl.kube.called("patch")[-1][4] == {"spec": {"suspend": True}}
    ctl2 = setup(job(suspend=True), rayjob("uid-new", suspend=True))
    assert run(ctl2.reconcile(KEY)) == "unchanged"
    assert ctl2.kube.called("patch") == []


def test_a_finished_jobs_vanished_rayjob_is_not_made_again():
    done = {"phase": "Succeeded", "completionTime": "2026-11-30T00:00:00Z"}
    ctl = setup(job(status=done))
    assert run(ctl.reconcile(KEY)) == "finished"
    assert ctl.kube.called("create") == [] and ctl.kube.called("patch_status") == []


def test_a_job_being_deleted_gets_nothing_created():
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    ctl = setup(deleting)
    assert run(ctl.reconcile(KEY)) == "deleting"
    assert ctl.kube.calls == []


def test_kuberay_missing_is_reported_and_retried():
    kube = FakeKube()
    kube.fail["create"].append(api_error(404))
    ctl = setup(job(), kube=kube)
    assert run(ctl.reconcile(KEY)) == "retry"
    assert condition(last_status(kube), "RayJobCreated")["reason"] == "KubeRayNotInstalled"
    assert run(ctl.reconcile(KEY)) == "created"


@pytest.mark.parametrize("error", [
    api_error(500), api_error(429, "Too Many Requests"), ConnectionResetError("reset by peer"),
    urllib3.exceptions.ProtocolError("Connection aborted."), TimeoutError("timed out"),
])
def test_every_transient_error_is_retried_with_growing_capped_backoff(error):
    async def scenario():
        kube = FakeKube()
        ctl = setup(job(), kube=kube)
        delays = []
        ctl.queue.add_after = lambda key, delay: delays.append(delay)  # observe, do not sleep
        for _ in range(12):
            kube.fail["create"].append(copy.copy(error))
        worker = asyncio.create_task(ctl.work())
        for _ in range(12):
            ctl.queue.add(KEY)
            while ctl.queue._queue or KEY in ctl.queue._processing:
                await asyncio.sleep(0)
        ctl.queue.add(KEY)  # no failure left: created, and the backoff starts over
        while ctl.queue._queue or KEY in ctl.queue._processing:
            await asyncio.sleep(0)
        worker.cancel()
        return delays, ctl, kube
    delays, ctl, kube = run(scenario())
    # doubling from 1 s, each with up to 10 % jitter, capped at 300 s (plus its jitter)
    assert all(2 ** n <= d <= 2 ** n * 1.1 for n, d in enumerate(delays[:5])), delays
    assert 300 <= max(delays) <= 330 and len(delays) == 12
    assert ("rayjobs", "ml", "demo") in kube.objects
    assert KEY not in ctl.queue.backoff.failures


def test_a_status_wiped_by_someone_else_is_written_again():
    ctl = setup(job(rv="10"), rayjob("uid-new"))
    run(ctl.reconcile(KEY))
    written = last_status(ctl.kube)
    n = len(ctl.kube.called("patch_status"))
    # our write's echo not seen yet (same resourceVersion): nothing new to write
    run(ctl.reconcile(KEY))
    assert len(ctl.kube.called("patch_status")) == n
    # the echo arrives: still nothing to write
    ctl.parents[KIND]._put(job(rv="11", status=written))
    run(ctl.reconcile(KEY))
    assert len(ctl.kube.called("patch_status")) == n
    # someone wipes the status: a newer version without it is put right
    ctl.parents[KIND]._put(job(rv="12", status={}))
    run(ctl.reconcile(KEY))
    assert len(ctl.kube.called("patch_status")) == n + 1
    assert last_status(ctl.kube)["phase"] == written["phase"]


def test_an_invalid_job_gets_a_failed_status_once_and_no_rayjob():
    ctl = setup(job(tpu={"topology": "3x3"}))
    assert run(ctl.reconcile(KEY)) == "invalid"
    assert run(ctl.reconcile(KEY)) == "invalid"
    assert ctl.kube.called("create") == []
    assert len(ctl.kube.called("patch_status")) == 1
    assert condition(last_status(ctl.kube), "Validated")["reason"] == "ValidationFailed"


def test_pods_of_another_raycluster_do_not_count():
    child = rayjob("uid-new", status={"rayClusterName": "demo-new", "jobDeploymentStatus": "Running"})
    ctl = setup(job(tpu={"topology": "2x2"}), child)
    for cluster, pod in (("demo-old", "old-worker"), ("demo-new", "new-worker")):
        ctl.pods.remember({"metadata": {"name": pod, "namespace": "ml", "resourceVersion": "1", "labels": {
            "tputorch.io/job": "demo", "ray.io/cluster": cluster, "ray.io/node-type": "worker"}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if cluster == "demo-old" else "False"}]}})
    run(ctl.reconcile(KEY))
    assert last_status(ctl.kube)["readyHosts"] == 0


def test_state_of_vanished_objects_is_swept_after_a_relist():
    ctl = setup(job(), rayjob("uid-new"))
    run(ctl.reconcile(KEY))
    ctl.child.problems[KEY] = ("X", "y")
    ctl.queue.backoff.next(KEY)
    assert ctl.specs.parsed and ctl.sweeps.uids
    ctl.parents[KIND]._pop(("ml", "demo"))  # deleted while the operator was not watching
    ctl.parent_changed(KIND, "LISTED", {})
    assert (ctl.specs.parsed, ctl.writes.written, ctl.child.problems, ctl.sweeps.uids, ctl.queue.known()) == ({}, {}, {}, {}, set())
    assert [n for counts in ctl.phases().values() for n in counts.values() if n] == []


def test_a_new_object_under_an_old_name_keeps_nothing_of_the_old_one():
    ctl = setup(job(uid="uid-old", tpu={"topology": "2x2"}))
    run(ctl.reconcile(KEY))
    ctl.parents[KIND]._put(job(uid="uid-new", rv="20"))
    ctl.children[KIND]._pop(("ml", "demo"))
    run(ctl.reconcile(KEY))
    assert "uid-old" not in ctl.specs.parsed and ctl.sweeps.uids[KEY] == "uid-new"
    assert last_status(ctl.kube)["hosts"] == 4  # 4x4, not the old 2x2


def test_ownership_is_by_uid_not_by_name_or_labels():
    parent = job()
    assert ownership(kinds.JOB, parent, rayjob("uid-new")) == "ours"
    assert ownership(kinds.JOB, parent, rayjob("uid-old")) == "previous"
    assert ownership(kinds.JOB, parent, rayjob("uid-old", name="other")) == "foreign"
    assert ownership(kinds.JOB, parent, rayjob(None)) == "foreign"
    not_controller = rayjob("uid-new")
    not_controller["metadata"]["ownerReferences"][0]["controller"] = False
    assert ownership(kinds.JOB, parent, not_controller) == "foreign"


def test_events_of_children_and_pods_enqueue_their_object():
    ctl = controller()
    ctl.child_changed(KIND, "MODIFIED", rayjob("x", name="a"))
    ctl.pod_changed("ADDED", {"metadata": {"name": "p", "namespace": "ml", "labels": {"tputorch.io/job": "b"}}})
    ctl.pod_changed("ADDED", {"metadata": {"name": "q", "namespace": "ml", "labels": {}}})
    assert list(ctl.queue._queue) == [(KIND, "ml", "a"), (KIND, "ml", "b")]


def test_statuses_module_reports_a_wait_as_pending():
    # the derive of a job without a RayJob of its own, with the wait's reason
    from tputorch.api import spec
    s = statuses.derive(spec.parse(job()), 1, None, [], {}, "t", ("PreviousRayJobTerminating", "m"))
    assert s["phase"] == "Pending" and s["message"] == "m"


# --- the serving kind through the same machinery ----------------------------------------------------

SVC_KEY = ("TPUTorchService", "ml", "qwen")


def service(uid="svc-uid", rv="10", generation=1, **spec):
    from ..services import service_body
    b = service_body(**spec)
    b["metadata"].update(uid=uid, resourceVersion=rv, generation=generation)
    return b


def test_a_service_gets_its_rayservice_and_an_edit_reaches_it_once():
    from tputorch import render
    ctl = controller()
    ctl.parents["TPUTorchService"].remember(service())
    assert run(ctl.reconcile(SVC_KEY)) == "created"
    created = ctl.kube.objects[("rayservices", "ml", "qwen")]
    ctl.children["TPUTorchService"]._put(ctl.children["TPUTorchService"].slim(created))  # its watch event
    assert created["metadata"]["ownerReferences"][0]["uid"] == "svc-uid"
    assert created["metadata"]["labels"][SERVICE_LABEL] == "qwen"
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    # replicas edited: the live RayService is patched with the new spec and hash, once
    ctl.parents["TPUTorchService"]._put(service(rv="11", generation=2, replicas={"min": 1, "max": 3}))
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    (patch,) = [c[4] for c in ctl.kube.called("patch") if c[1] == "rayservices"]
    assert patch["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] == 3
    observed = ctl.children["TPUTorchService"].get(("ml", "qwen"))
    patched = {**observed, "metadata": {**observed["metadata"], "resourceVersion": "99",
                                        "annotations": patch["metadata"]["annotations"]},
               "spec": merge_patch(observed["spec"], patch["spec"])}  # as the API server applies it
    ctl.children["TPUTorchService"]._put(patched)
    assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    # an edit by hand of what we render, under our hash, is put back; its event brings the key
    edited = {**patched, "metadata": {**patched["metadata"], "resourceVersion": "100"},
              "spec": {**patched["spec"], "serveConfigV2": "applications: []\n"}}
    ctl.children["TPUTorchService"]._put(edited)
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    assert [c[4] for c in ctl.kube.called("patch")][-1]["spec"]["serveConfigV2"] == patched["spec"]["serveConfigV2"]


def test_a_queued_service_gets_its_initializing_timeout_when_kueue_admits_it():
    """Issue 35: none while Kueue holds it (KubeRay would count the queue wait), then the wait plus
    spec.serve.initializingTimeoutSeconds, patched on the RayService."""
    from tputorch import render
    svc = service(queueName="tpu", serve={"initializingTimeoutSeconds": 60})
    ctl = kueue_setup(job(), None)
    ctl.parents["TPUTorchService"].remember(svc)
    assert run(ctl.reconcile(SVC_KEY)) == "created"
    created = ctl.kube.objects[("rayservices", "ml", "qwen")]
    assert INITIALIZING_TIMEOUT_ANNOTATION not in created["metadata"]["annotations"]
    created["metadata"]["uid"] = "rs-uid"
    created["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "Initializing",
                                         "lastTransitionTime": "2026-12-01T10:00:00Z"}]}
    ctl.children["TPUTorchService"]._put(ctl.children["TPUTorchService"].slim(created))
    workload = {"metadata": {"name": "rayservice-qwen-1a2b3", "namespace": "ml", "resourceVersion": "7",
                             "ownerReferences": [{"kind": "RayService", "name": "qwen", "uid": "rs-uid", "controller": True}]},
                "spec": {"active": True, "queueName": "tpu"},
                "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                           "message": "insufficient unused quota"}]}}
    ctl.workloads.remember(workload)
    run(ctl.reconcile(SVC_KEY))
    assert [c for c in ctl.kube.called("patch") if c[1] == "rayservices"] == []
    assert last_status(ctl.kube)["phase"] == "Queued"
    workload = {**workload, "metadata": {**workload["metadata"], "resourceVersion": "8"}, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "lastTransitionTime": "2026-12-01T10:05:00Z"},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": "2026-12-01T10:05:00Z"}]}}
    ctl.workloads._put(ctl.workloads.slim(workload))  # its watch event
    run(ctl.reconcile(SVC_KEY))
    (patch,) = [c[4] for c in ctl.kube.called("patch") if c[1] == "rayservices"]
    assert patch == {"metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: "360s"}}}  # 300 s queued + 60


def test_a_services_pods_count_for_its_active_and_pending_clusters_only():
    ctl = controller()
    ctl.parents["TPUTorchService"].remember(service(tpu={"topology": "2x2"}))
    run(ctl.reconcile(SVC_KEY))
    ctl.children["TPUTorchService"]._put(
        ctl.children["TPUTorchService"].slim(ctl.kube.objects[("rayservices", "ml", "qwen")]))  # its watch event
    observed = ctl.children["TPUTorchService"].get(("ml", "qwen"))
    ctl.children["TPUTorchService"]._put({**observed, "metadata": {**observed["metadata"], "resourceVersion": "98"},
                                          "status": {"activeServiceStatus": {"rayClusterName": "qwen-a"}}})
    for cluster in ("qwen-a", "qwen-old"):
        ctl.pods.remember({"metadata": {"name": f"{cluster}-w", "namespace": "ml", "resourceVersion": "1", "labels": {
            "tputorch.io/service": "qwen", "ray.io/cluster": cluster, "ray.io/node-type": "worker"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    run(ctl.reconcile(SVC_KEY))
    assert last_status(ctl.kube)["readyHosts"] == 1


def test_a_reconcile_stuck_on_a_call_is_abandoned_and_retried(monkeypatch):
    from tputorch.controller import reconcile

    monkeypatch.setattr(reconcile, "RECONCILE_TIMEOUT", 0.05)

    async def scenario():
        kube = FakeKube()
        ctl = setup(job(), kube=kube)
        hang = asyncio.Event()
        real_create = kube.create

        async def create_once_stuck(res, namespace, body):
            if not [c for c in kube.called("create") if c[1] == "rayjobs"]:
                kube.calls.append(("create", res.plural, namespace, body["metadata"]["name"]))
                await hang.wait()  # a call on a connection that went silent
            return await real_create(res, namespace, body)
        kube.create = create_once_stuck
        delays = []
        ctl.queue.add_after = lambda key, delay: (delays.append(delay), ctl.queue.add(key))
        worker = asyncio.create_task(ctl.work())
        ctl.queue.add(KEY)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if ("rayjobs", "ml", "demo") in kube.objects:
                break
        worker.cancel()
        return delays, kube
    delays, kube = run(scenario())
    assert len(delays) == 1 and 1 <= delays[0] <= 1.1  # abandoned once, then retried (with jitter)
    assert ("rayjobs", "ml", "demo") in kube.objects


def test_the_pod_store_keeps_phase_and_why_a_container_waits():
    pod = {"metadata": {"name": "w0", "namespace": "ml", "resourceVersion": "5", "annotations": {"a": "b"},
                        "labels": {"tputorch.io/service": "qwen", "ray.io/node-type": "worker", "other": "x"}},
           "spec": {"containers": [{"name": "ray-worker"}]},
           "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False", "lastProbeTime": None}],
                      "containerStatuses": [{"name": "ray-worker", "image": "i", "ready": False, "restartCount": 0,
                                             "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                                   "message": 'secret "hf" not found'}}},
                                            {"name": "sidecar", "state": {"running": {"startedAt": "t"}}}],
                      "initContainerStatuses": [{"name": "wait-gcs-ready", "image": "i", "ready": False,
                                                 "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    slim = stores.slim_pod(pod)
    assert slim["status"] == {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
                              "containerStatuses": [{"name": "ray-worker", "image": "i", "state": {"waiting": {
                                  "reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}}}],
                              "initContainerStatuses": [{"name": "wait-gcs-ready", "image": "i", "state": {"waiting": {
                                  "reason": "PodInitializing"}}}]}
    assert slim["metadata"]["labels"] == {"tputorch.io/service": "qwen", "ray.io/node-type": "worker"}
    assert stores.slim_pod({"metadata": {"name": "p"}, "status": {}})["status"] == {"conditions": []}
    assert "spec" not in slim  # no TPU container, no node yet


def test_the_pod_store_keeps_which_tpu_variables_a_tpu_container_got():
    pod = {"metadata": {"name": "w0", "namespace": "ml"}, "spec": {"nodeName": "n1", "containers": [
        {"name": "ray-worker", "resources": {"limits": {"google.com/tpu": "4", "cpu": "8"}},
         "env": [{"name": "TPU_WORKER_ID", "value": "0"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {}}}]},
        {"name": "sidecar", "env": [{"name": "TPU_NAME", "value": "x"}]}]}, "status": {}}
    assert stores.slim_pod(pod)["spec"] == {"nodeName": "n1", "containers": [
        {"name": "ray-worker", "resources": {"limits": {"google.com/tpu": "4"}}, "env": [{"name": "TPU_WORKER_ID"}]}]}


# --- Kueue: it owns a queued RayJob's suspend; the user's spec.suspend goes to its Workload ----------

def kueue_setup(parent, child, workloads=(), kueue_served=True):
    from tputorch.controller.informer import Informer
    from ..fakekube import FakeSource
    ctl = setup(parent, child)
    noop = lambda *_: None  # noqa: E731
    ctl.workloads = Informer("workloads", FakeSource(), None, noop, stores.slim_workload, index=stores.workload_index)
    ctl.workloads.served = kueue_served
    ctl.workloads.synced.set()  # listed (a store that never lists: test_a_workloads_list_that_fails_...)
    ctl.priority_classes = Informer("priorityclasses", FakeSource(), None, noop, stores.slim_name)
    for w in workloads:
        ctl.workloads.remember(w)
    return ctl


def kueue_workload(active=True, admitted=True):
    cond = {"type": "Admitted", "status": "True" if admitted else "False", "reason": "Admitted" if admitted else "Pending",
            "message": ""}
    return {"metadata": {"name": "rayjob-demo-1a2b3", "namespace": "ml", "resourceVersion": "7",
                         "ownerReferences": [{"kind": "RayJob", "name": "demo", "uid": "rj-uid-new", "controller": True}]},
            "spec": {"active": active, "queueName": "tpu"}, "status": {"conditions": [cond]}}


QUEUED_LABELS = {"tputorch.io/job": "demo", "kueue.x-k8s.io/queue-name": "tpu"}


def test_a_queued_rayjob_suspended_by_kueue_is_never_patched_by_the_operator():
    ctl = kueue_setup(job(queueName="tpu"), rayjob("uid-new", suspend=True, labels=QUEUED_LABELS),
                      [kueue_workload(admitted=False)])
    assert run(ctl.reconcile(KEY)) == "unchanged"
    assert ctl.kube.called("patch") == []
    assert last_status(ctl.kube)["phase"] == "Queued"


def test_the_users_suspend_of_a_queued_job_deactivates_its_workload_and_resume_activates_it():
    ctl = kueue_setup(job(queueName="tpu", suspend=True), rayjob("uid-new", suspend=False, labels=QUEUED_LABELS),
                      [kueue_workload(active=True)])
    run(ctl.reconcile(KEY))
    (call,) = ctl.kube.called("patch")
    assert (call[1], call[3], call[4]) == ("workloads", "rayjob-demo-1a2b3", {"spec": {"active": False}})
    ctl2 = kueue_setup(job(queueName="tpu"), rayjob("uid-new", suspend=True, labels=QUEUED_LABELS),
                       [kueue_workload(active=False)])
    run(ctl2.reconcile(KEY))
    (call,) = ctl2.kube.called("patch")
    assert (call[1], call[4]) == ("workloads", {"spec": {"active": True}})


def test_without_kueue_installed_the_queue_label_changes_nothing():
    ctl = kueue_setup(job(queueName="tpu", suspend=True), rayjob("uid-new", suspend=False, labels=QUEUED_LABELS),
                      kueue_served=False)
    run(ctl.reconcile(KEY))
    assert ctl.kube.called("patch")[-1][4] == {"spec": {"suspend": True}}
    assert condition(last_status(ctl.kube), "SliceReady") is not None
    assert "queue" in last_status(ctl.kube) and not any(c["type"] == "Admitted" for c in last_status(ctl.kube)["conditions"])


def test_a_workloads_list_that_fails_is_said_in_the_admission_not_guessed_as_no_workload():
    """Issue 34: Kueue's Workloads list answers 500 (a conversion webhook left behind): the job is
    still reconciled, and its Admitted condition says why admission is unknown."""
    ctl = kueue_setup(job(queueName="tpu"), rayjob("uid-new", suspend=True, labels=QUEUED_LABELS))
    ctl.workloads.synced.clear()
    ctl.workloads.list_error = "HTTP 500 Internal Server Error"
    run(ctl.reconcile(KEY))
    admitted = condition(last_status(ctl.kube), "Admitted")
    assert (admitted["status"], admitted["reason"]) == ("False", "WorkloadsNotListed")
    assert "HTTP 500" in admitted["message"]


# --- what the watch must decide, not the reconcile (issue 20) -------------------------------------

def test_a_foreign_rayjob_found_by_a_409_never_enters_the_store_and_its_deletion_frees_the_name():
    """A RayJob of someone else without our labels is invisible to the label-filtered watch: if the
    reconcile put it into the store, nothing would ever take it out again (a ghost)."""
    kube = FakeKube()
    ctl = setup(job(), kube=kube)
    kube.objects[("rayjobs", "ml", "demo")] = rayjob(None, labels={})
    assert run(ctl.reconcile(KEY)) == "retry"
    assert condition(last_status(kube), "RayJobCreated")["reason"] == "RayJobNameTaken"
    assert ctl.children[KIND].get(("ml", "demo")) is None
    del kube.objects[("rayjobs", "ml", "demo")]  # the user deletes it, as the status asks
    assert run(ctl.reconcile(KEY)) == "created"  # the retry (with backoff) creates ours
    assert condition(last_status(kube), "RayJobCreated")["status"] == "True"


def test_a_rayjob_deleted_right_after_its_creation_is_not_revived_by_the_create():
    kube = FakeKube()
    ctl = setup(job(), kube=kube)
    real_create = kube.create

    async def create_then_deleted(res, namespace, body):
        created = await real_create(res, namespace, body)
        # its ADDED and DELETED events reach the loop before the create returns
        ctl.child_changed(KIND, "ADDED", created)
        ctl.child_changed(KIND, "DELETED", created)
        del kube.objects[(res.plural, namespace, body["metadata"]["name"])]
        return created
    kube.create = create_then_deleted
    assert run(ctl.reconcile(KEY)) == "created"
    assert ctl.child.of(KEY, job()) is None  # gone: the next reconcile makes it again
    kube.create = real_create
    # a rerun under that name (a new uid) does not wait on a RayJob that no longer exists
    ctl.parents[KIND]._put(job(uid="uid-rerun", rv="20"))
    assert run(ctl.reconcile(KEY)) == "created"


def test_our_rayjob_that_lost_its_label_gets_it_back_instead_of_a_frozen_copy():
    kube = FakeKube()
    ctl = setup(job(), kube=kube)
    kube.objects[("rayjobs", "ml", "demo")] = rayjob("uid-new", labels={})  # someone removed our labels
    assert run(ctl.reconcile(KEY)) == "exists"
    (patch,) = [c for c in kube.called("patch") if c[1] == "rayjobs"]
    assert patch[4]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tputorch-operator"
    assert ctl.children[KIND].get(("ml", "demo")) is None


def test_an_expectation_lasts_only_until_its_watch_event_or_its_time():
    from tputorch.controller import child as rec

    ctl = setup(job())
    assert run(ctl.reconcile(KEY)) == "created"
    created = ctl.kube.objects[("rayjobs", "ml", "demo")]
    assert KEY in ctl.child.expected
    ctl.child_changed(KIND, "ADDED", created)
    assert KEY not in ctl.child.expected
    ctl.child.expect(KEY, {**created, "metadata": {**created["metadata"], "uid": "other"}})
    ctl.child.expected[KEY] = (ctl.child.expected[KEY][0], ctl.child.expected[KEY][1] - rec.EXPECT_FOR - 1)
    ctl.children[KIND]._pop(("ml", "demo"))
    assert ctl.child.of(KEY, job()) is None and KEY not in ctl.child.expected


# --- terminal phases are sticky (issue 20) ----------------------------------------------------------

DONE = {"phase": "Succeeded", "completionTime": "2026-11-30T00:00:00Z", "conditions": []}


def test_a_stale_child_never_turns_a_succeeded_job_back_into_running():
    """A new leader whose child watch lags (or a late write) sees the RayJob still Running."""
    stale = rayjob("uid-new", status={"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    ctl = setup(job(status=DONE), stale)
    run(ctl.reconcile(KEY))
    assert all(c[4].get("phase") in (None, "Succeeded") for c in ctl.kube.called("patch_status"))
    assert all(c[4].get("completionTime") for c in ctl.kube.called("patch_status"))
    # ... and once that RayJob is gone, the job is not run again
    ctl.children[KIND]._pop(("ml", "demo"))
    assert run(ctl.reconcile(KEY)) == "finished" and ctl.kube.called("create") == []


def test_a_terminal_status_seen_once_holds_for_that_uid_even_if_the_status_is_rolled_back():
    ctl = setup(job(status=DONE), rayjob("uid-new", status={"jobDeploymentStatus": "Complete",
                                                             "jobStatus": "SUCCEEDED"}))
    run(ctl.reconcile(KEY))
    ctl.parents[KIND]._put(job(rv="30", status={"phase": "Running"}))  # a late write of a Running status
    ctl.children[KIND]._pop(("ml", "demo"))
    assert run(ctl.reconcile(KEY)) == "finished" and ctl.kube.called("create") == []
    # another object under the same name is a new job
    ctl.parents[KIND]._put(job(uid="uid-2", rv="40"))
    assert run(ctl.reconcile(KEY)) == "created"


def test_a_terminal_status_this_process_wrote_holds_when_a_foreign_edit_drops_its_echo():
    """Issue 34: the job's Succeeded is written by this process; before its echo, a label edit by
    someone else bumps the resourceVersion (the written-status cache no longer applies) and
    KubeRay deletes the RayJob. The job must not be created again."""
    done = rayjob("uid-new", status={"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    ctl = setup(job(status={"phase": "Running"}), done)
    run(ctl.reconcile(KEY))
    assert last_status(ctl.kube)["phase"] == "Succeeded"  # written by us, not yet seen back
    relabelled = job(rv="11", status={"phase": "Running"})
    relabelled["metadata"]["labels"] = {"team": "a"}  # a foreign edit before our write's echo
    ctl.parents[KIND]._put(relabelled)
    ctl.children[KIND]._pop(("ml", "demo"))
    assert run(ctl.reconcile(KEY)) == "finished" and ctl.kube.called("create") == []
    # nor does its status go back to Running from the stale status the edit carried
    assert all(c[4].get("phase") in (None, "Succeeded") for c in ctl.kube.called("patch_status"))


def test_status_patches_carry_the_objects_uid_as_precondition():
    ctl = setup(job())
    run(ctl.reconcile(KEY))
    assert ctl.kube.status_uids and set(ctl.kube.status_uids) == {"uid-new"}


def test_a_status_patch_refused_by_the_uid_test_is_not_an_error():
    kube = FakeKube()
    ctl = setup(job(), kube=kube)
    kube.fail["patch_status"].append(api_error(422, body='{"reason":"Invalid","details":{},"code":422}'))
    assert run(ctl.reconcile(KEY)) == "created"
    kube.fail["patch_status"].append(api_error(422, body='{"details":{"causes":[{"field":"status.x"}]}}'))
    ctl.parents[KIND]._put(job(rv="50"))
    ctl.writes.written.clear()
    with pytest.raises(Exception, match="422"):
        run(ctl.reconcile(KEY))


def test_a_job_whose_rayjob_would_be_too_large_fails_alone_without_a_create():
    # Each env value is within the spec's limits; head and workers both carry the env, so the
    # RayJob would exceed what Kubernetes stores.
    env = [{"name": f"V{i}", "value": "x" * 20_000} for i in range(30)]
    ctl = setup(job(env=env))
    other = job(uid="uid-other")
    other["metadata"]["name"] = "other"
    ctl.parents[KIND].remember(other)
    assert run(ctl.reconcile(KEY)) == "invalid"
    status = last_status(ctl.kube)
    assert status["phase"] == "Failed" and "renders a RayJob of" in condition(status, "Validated")["message"]
    assert ctl.kube.called("create") == []
    assert run(ctl.reconcile(KEY)) == "invalid" and len(ctl.kube.called("patch_status")) == 1  # nothing rewritten
    assert run(ctl.reconcile((KIND, "ml", "other"))) == "created"


# --- extra children: the NetworkPolicy ---------------------------------------------------------------

PEERS = (Peer("ray-system", (("app.kubernetes.io/name", "kuberay-operator"),)),)
POLICY = NetworkPolicyConfig(peers=PEERS)


def test_every_job_gets_its_network_policy_owned_by_its_uid_and_kept_as_rendered():
    ctl = controller(extras=kinds.extras(POLICY))
    ctl.parents[KIND].remember(job())
    assert run(ctl.reconcile(KEY)) == "created"
    policy = ctl.kube.objects[("networkpolicies", "ml", "demo-rayjob")]
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["controller"]) == ("uid-new", True)
    assert policy["spec"]["podSelector"] == {"matchLabels": {"tputorch.io/job": "demo"}}
    run(ctl.reconcile(KEY))
    assert [c[1] for c in ctl.kube.called("create")] == ["rayjobs", "secrets", "networkpolicies"]  # not again
    # edited by someone: put back; deleted: made again
    ctl.extra_stores["networkpolicies"].store[("ml", "demo-rayjob")] = {**policy, "spec": {"podSelector": {}}}
    run(ctl.reconcile(KEY))
    (patch,) = ctl.kube.called("patch")
    assert patch[1:4] == ("networkpolicies", "ml", "demo-rayjob") and patch[4]["spec"] == policy["spec"]
    ctl.extra_stores["networkpolicies"].store.clear()
    del ctl.kube.objects[("networkpolicies", "ml", "demo-rayjob")]
    run(ctl.reconcile(KEY))
    assert [c[1] for c in ctl.kube.called("create")].count("networkpolicies") == 2


def test_the_network_policy_create_goes_out_beside_the_rayjob_create_not_after_its_answer():
    """Issue 40: one job's creates are not serial where the API allows them at once. The RayJob's
    create here answers only once the NetworkPolicy's create has been sent: serial, it would wait."""
    class Kube(FakeKube):
        def __init__(self):
            super().__init__()
            self.policy_sent = asyncio.Event()

        async def create(self, res, namespace, body):
            if res.plural == "networkpolicies":
                self.policy_sent.set()
            else:
                await asyncio.wait_for(self.policy_sent.wait(), 5)
            return await super().create(res, namespace, body)

    ctl = controller(Kube(), extras=kinds.extras(POLICY))
    ctl.parents[KIND].remember(job())
    assert run(ctl.reconcile(KEY)) == "created"
    assert sorted(c[1] for c in ctl.kube.called("create")) == ["networkpolicies", "rayjobs", "secrets"]
    assert condition(last_status(ctl.kube), "NetworkPolicyReady")["status"] == "True"


def test_a_foreign_network_policy_of_that_name_is_left_alone_and_the_job_still_runs():
    ctl = controller(extras=kinds.extras(POLICY), status_interval=0)  # every status change written at once
    ctl.parents[KIND].remember(job())
    foreign = {"metadata": {"name": "demo-rayjob", "namespace": "ml", "uid": "np", "resourceVersion": "3"}, "spec": {"podSelector": {}}}
    ctl.extra_stores["networkpolicies"].remember(foreign)
    assert run(ctl.reconcile(KEY)) == "created"
    assert ctl.kube.called("patch") == [] and [c[1] for c in ctl.kube.called("create")] == ["rayjobs", "secrets"]
    taken = condition(last_status(ctl.kube), "NetworkPolicyReady")
    assert (taken["status"], taken["reason"]) == ("False", "NetworkPolicyNameTaken") and "demo-rayjob" in taken["message"]
    # gone: the operator's own is made, and the status says so
    ctl.extra_stores["networkpolicies"].store.clear()
    run(ctl.reconcile(KEY))
    assert ("networkpolicies", "ml", "demo-rayjob") in ctl.kube.objects
    assert condition(last_status(ctl.kube), "NetworkPolicyReady")["status"] == "True"


def test_a_foreign_network_policy_without_our_labels_is_found_by_its_409():
    ctl = controller(extras=kinds.extras(POLICY))
    ctl.parents[KIND].remember(job())
    ctl.kube.objects[("networkpolicies", "ml", "demo-rayjob")] = {  # invisible to the labelled watch
        "metadata": {"name": "demo-rayjob", "namespace": "ml", "uid": "np"}, "spec": {"podSelector": {}}}
    original = ctl.kube.create

    async def create(res, namespace, body):
        if res.plural == "networkpolicies":
            raise api_error(409)
        return await original(res, namespace, body)
    ctl.kube.create = create
    assert run(ctl.reconcile(KEY)) == "created"
    assert ("get", "networkpolicies", "ml", "demo-rayjob") in ctl.kube.calls
    assert condition(last_status(ctl.kube), "NetworkPolicyReady")["reason"] == "NetworkPolicyNameTaken"


def test_a_failed_network_policy_write_never_holds_the_job():
    ctl = controller(extras=kinds.extras(POLICY))
    ctl.parents[KIND].remember(job())
    original = ctl.kube.create

    async def create(res, namespace, body):
        if res.plural == "networkpolicies":
            raise api_error(403, body="networkpolicies is forbidden")
        return await original(res, namespace, body)
    ctl.kube.create = create
    assert run(ctl.reconcile(KEY)) == "created"
    assert ("rayjobs", "ml", "demo") in ctl.kube.objects
    refused = condition(last_status(ctl.kube), "NetworkPolicyReady")
    assert (refused["status"], refused["reason"]) == ("False", "NetworkPolicyNotWritten")
    assert "networkpolicies is forbidden" in refused["message"]


def test_a_network_policy_call_that_times_out_still_writes_the_status_and_is_tried_again():
    ctl = controller(extras=kinds.extras(POLICY), status_interval=0)
    ctl.parents[KIND].remember(job())
    original = ctl.kube.create

    async def create(res, namespace, body):
        if res.plural == "networkpolicies":
            raise TimeoutError("timed out")  # no answer: what urllib3's read timeout is under the adapter
        return await original(res, namespace, body)
    ctl.kube.create = create

    async def reconcile_and_look():
        result = await ctl.reconcile(KEY)
        return result, KEY in ctl.queue.known()  # a delayed add is pending (inside the loop that made it)
    assert run(reconcile_and_look()) == ("created", True)
    status = last_status(ctl.kube)
    assert status["phase"] == "Pending"
    refused = condition(status, "NetworkPolicyReady")
    assert (refused["status"], refused["reason"]) == ("False", "NetworkPolicyNotWritten")
    assert "TimeoutError: timed out" in refused["message"]


def test_a_service_is_rendered_once_per_version_of_its_spec_not_per_reconcile(monkeypatch):
    from tputorch.render import output
    renders = []
    template = output.template

    def counting(name):
        renders.append(name)
        return template(name)
    monkeypatch.setattr(output, "template", counting)
    ctl = controller()
    ctl.parents["TPUTorchService"].remember(service())
    assert run(ctl.reconcile(SVC_KEY)) == "created"
    created = ctl.kube.objects[("rayservices", "ml", "qwen")]
    ctl.children["TPUTorchService"]._put(ctl.children["TPUTorchService"].slim(created))  # its watch event
    for _ in range(3):
        assert run(ctl.reconcile(SVC_KEY)) == "unchanged"
    assert renders.count("rayservice.json.j2") == 1
    ctl.parents["TPUTorchService"]._put(service(rv="11", generation=2, replicas={"min": 1, "max": 3}))
    assert run(ctl.reconcile(SVC_KEY)) == "child-patched"
    assert renders.count("rayservice.json.j2") == 2  # the new version's, once


def test_no_network_policy_when_switched_off():
    assert kinds.extras(None) == []


def test_a_child_of_an_earlier_object_stays_previous_across_a_crd_version_bump():
    old = rayjob("uid-old")
    old["metadata"]["ownerReferences"][0]["apiVersion"] = "tputorch.io/v1alpha0"
    assert ownership(kinds.JOB, job(), old) == "previous"
    other_group = rayjob("uid-old")
    other_group["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1alpha1"
    assert ownership(kinds.JOB, job(), other_group) == "foreign"


def test_an_event_note_is_cut_at_1024_bytes_not_characters():
    from tputorch.controller.kube import note

    cut = note("é" * 1000)  # 2000 bytes
    assert len(cut.encode()) <= 1024 and cut == "é" * 512
    assert note("short") == "short"


def test_a_webhooks_denial_is_shown_with_its_own_message():
    from tputorch.controller.kind import create_problem
    body = json.dumps({"kind": "Status", "message": 'admission webhook "vrayjob.kb.io" denied the request: '
                       "spec.shutdownAfterJobFinishes: Invalid value: false"})
    reason, message = create_problem(kinds.JOB, api_error(403, "Forbidden", body))
    assert reason == "Forbidden"
    assert message == ('the RayJob was refused: admission webhook "vrayjob.kb.io" denied the request: '
                       "spec.shutdownAfterJobFinishes: Invalid value: false")


def test_pods_the_operator_may_not_read_are_a_condition_on_that_namespaces_objects():
    child = rayjob("uid-new", status={"rayClusterName": "demo-x", "jobDeploymentStatus": "Initializing"})
    ctl = controller(status_interval=0.0)  # every change written at once
    ctl.parents[KIND].remember(job())
    ctl.children[KIND].remember(child)
    ctl.pods._forbidden["ml"] = ("watch", 'Forbidden: pods is forbidden: cannot watch resource "pods" in "ml"')
    ctl.pods.scopes = ["ml", "other"]
    ctl.pods.on_change = lambda e, o: None
    run(ctl.reconcile(KEY))
    st = last_status(ctl.kube)
    c = condition(st, "SliceReady")
    assert (c["status"], c["reason"]) == ("Unknown", "PodsForbidden")
    assert c["message"].startswith('the operator may not watch pods in namespace ml (Forbidden: pods is forbidden: '
                                   'cannot watch resource "pods" in "ml"): it cannot see the slice\'s hosts')
    assert st["phase"] == "Pending" and st["message"] == c["message"]
    # Allowed again: the informer's ALLOWED event brings every object back, and the condition goes.
    del ctl.pods._forbidden["ml"]
    queued = []
    ctl.enqueue = queued.append
    ctl.pod_changed("ALLOWED", {})
    assert queued == [KEY]
    run(ctl.reconcile(KEY))
    assert condition(last_status(ctl.kube), "SliceReady")["reason"] == "WaitingForHosts"


def test_the_pod_store_keeps_what_tells_the_training_slice_from_the_groups():
    """With spec.groups only the training slice's pods are its hosts: the stored (slimmed) pods must
    still say which group each belongs to, or the count falls back to KubeRay's, groups included."""
    job_spec = statuses_spec.parse(body(groups=[{"name": "rollout", "tpu": {"accelerator": "v6e", "topology": "4x4"}}]))

    def pod(name, group, ready):
        return {"metadata": {"name": name, "namespace": "ml", "resourceVersion": "1", "labels": {
            "tputorch.io/job": "demo", "ray.io/node-type": "worker", "ray.io/group": group}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    pods = [pod("t0", "tpu-slice", True), pod("t1", "tpu-slice", False)] + [pod(f"r{i}", "rollout", True) for i in range(4)]
    child = {"metadata": {"name": "demo"}, "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                      "rayClusterStatus": {"readyWorkerReplicas": 5}}}
    st = statuses.derive(job_spec, 1, child, [stores.slim_pod(p) for p in pods], {}, "2026-11-30T00:00:00Z")
    assert st["hostsReady"] == "1/4"


def test_rayjobs_refused_in_another_namespace_do_not_hold_this_one():
    ctl = setup(job())
    ctl.children[KIND].scopes = ["ml", "other"]
    ctl.children[KIND]._forbidden["other"] = ("watch", "Forbidden: cannot watch rayjobs in other")
    assert run(ctl.reconcile(KEY)) == "created"
    ctl = setup(job())
    ctl.children[KIND].scopes = ["ml", "other"]
    ctl.children[KIND]._forbidden["ml"] = ("list", "Forbidden: cannot list rayjobs in ml")
    assert run(ctl.reconcile(KEY)) == "retry"
    assert ctl.child.problems[KEY] == ("Forbidden", "the operator may not list RayJobs: Forbidden: cannot list rayjobs in ml")
    assert ctl.kube.called("create") == []


# --- deleted pods are swept (issue 34) -------------------------------------------------------------

def _ray_pod(name="demo-tpu-0"):
    return {"metadata": {"namespace": "ml", "name": name, "resourceVersion": "5",
                         "labels": {"tputorch.io/job": "demo", "ray.io/cluster": "demo-abc"}}}


def test_deleted_pods_of_finished_or_deleted_jobs_are_not_kept():
    """A standby kept every deleted job's pods (62 MB per 1,000 jobs of 17 pods), the leader every
    finished job's."""
    ctl = setup(job(status=DONE))
    ctl.active = False  # a standby: it reconciles nothing that would clear them
    ctl.pod_changed("DELETED", _ray_pod())
    assert ctl.attempts.deleted_pods == {}  # finished: no host of it can be lost any more
    ctl.parents[KIND]._put(job(rv="11", status={"phase": "Running"}))
    ctl.pod_changed("DELETED", _ray_pod())
    assert len(ctl.attempts.deleted_pods[KEY]) == 1  # running: kept for its reconcile
    gone = ctl.parents[KIND]._pop(("ml", "demo"))
    ctl.parent_changed(KIND, "DELETED", gone)
    assert ctl.attempts.deleted_pods == {}
    ctl.pod_changed("DELETED", _ray_pod("demo-tpu-1"))  # its pods go after it
    assert ctl.attempts.deleted_pods == {}
    ctl.attempts.deleted_pods[KEY] = [_ray_pod()]  # whatever was left: the sweep after a re-list takes it
    ctl.sweeps.sweep()
    assert ctl.attempts.deleted_pods == {}


def test_rbac_granted_again_brings_back_every_object_that_read_the_refusal():
    """Issue 34: a FORBIDDEN re-enqueued the objects, the ALLOWED that follows a fix did not: their
    statuses kept saying Forbidden until something else changed."""
    ctl = kueue_setup(job(queueName="tpu"), rayjob("uid-new", labels=QUEUED_LABELS))
    ctl.child_changed(KIND, "ALLOWED", {})
    assert list(ctl.queue._queue) == [KEY]
    ctl.queue._queue.clear(), ctl.queue._dirty.clear()  # taken by a worker
    ctl.workload_changed("ALLOWED", {})
    assert list(ctl.queue._queue) == [KEY]


def test_a_failing_workload_patch_does_not_freeze_the_jobs_status():
    """Issue 34: the Workload's spec.active patch ran before the status write, and its failure
    ended the reconcile: the job's status stayed as it was for as long as the patch failed."""
    ctl = kueue_setup(job(queueName="tpu", suspend=True), rayjob("uid-new", suspend=False, labels=QUEUED_LABELS),
                      [kueue_workload(active=True)])
    ctl.kube.fail["patch"].append(api_error(500, "Internal Server Error"))
    with pytest.raises(Exception, match="500"):
        run(ctl.reconcile(KEY))  # the reconcile fails (and is retried with backoff) ...
    assert ctl.kube.called("patch_status"), "... once the status is written"
    assert condition(last_status(ctl.kube), "Admitted") is not None


def test_a_replicas_edit_reaches_the_running_rayclusters_bounds_of_its_rayservice_only():
    """Issue 35: KubeRay's cluster hash leaves out replicas and min/max, so the RayService patch
    alone never reaches the RayCluster whose bounds the Ray autoscaler reads."""
    ctl = controller()
    ctl.parents["TPUTorchService"].remember(service())
    run(ctl.reconcile(SVC_KEY))
    created = ctl.kube.objects[("rayservices", "ml", "qwen")]
    group = created["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    ctl.children["TPUTorchService"]._put({**ctl.children["TPUTorchService"].slim(created), "status": {
        "activeServiceStatus": {"rayClusterName": "qwen-a"}, "pendingServiceStatus": {"rayClusterName": "qwen-b"}}})

    def cluster(name, owner_uid, **bounds):
        return {"metadata": {"name": name, "namespace": "ml", "uid": f"{name}-uid", "ownerReferences": [
                    {"apiVersion": "ray.io/v1", "kind": "RayService", "name": "qwen", "uid": owner_uid, "controller": True}]},
                "spec": {"workerGroupSpecs": [{"groupName": group["groupName"], **bounds}]}}
    ctl.kube.objects[("rayclusters", "ml", "qwen-a")] = cluster("qwen-a", created["metadata"]["uid"],
                                                               replicas=1, minReplicas=1, maxReplicas=1)
    ctl.kube.objects[("rayclusters", "ml", "qwen-b")] = cluster("qwen-b", "someone-elses", replicas=1, minReplicas=1, maxReplicas=1)
    run(ctl.reconcile(SVC_KEY))
    assert not [c for c in ctl.kube.called("patch") if c[1] == "rayclusters"]  # bounds already hold
    gets = len(ctl.kube.called("get"))
    run(ctl.reconcile(SVC_KEY))
    assert len(ctl.kube.called("get")) == gets  # read once per spec version

    ctl.parents["TPUTorchService"]._put(service(rv="11", generation=2, replicas={"min": 2, "max": 3}))
    run(ctl.reconcile(SVC_KEY))
    (patched,) = [c for c in ctl.kube.called("patch") if c[1] == "rayclusters"]
    assert patched[3] == "qwen-a"  # never qwen-b: its controller is another RayService
    ops = patched[4]
    assert ops[0] == {"op": "test", "path": "/metadata/uid", "value": "qwen-a-uid"}
    assert ops[1] == {"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": group["groupName"]}
    assert ops[2] == {"op": "test", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}
    assert {o["path"].rsplit("/", 1)[1]: o["value"] for o in ops[3:]} == {"minReplicas": 2, "maxReplicas": 3, "replicas": 2}

    # Issue 56: the autoscaler writes replicas between our read and our patch. The patch's test of
    # the replicas read fails (the API server's bare 422) and the cluster is read again: the next
    # patch tests and keeps the autoscaler's 3, never putting back the 2 read before.
    ctl.kube.objects[("rayclusters", "ml", "qwen-a")]["spec"]["workerGroupSpecs"][0].update(replicas=1, minReplicas=1, maxReplicas=1)
    sent = []
    real_patch = ctl.kube.patch

    async def racing_patch(res, namespace, name, patch):
        if res.plural != "rayclusters":
            return await real_patch(res, namespace, name, patch)
        sent.append(patch)
        group_now = ctl.kube.objects[("rayclusters", "ml", name)]["spec"]["workerGroupSpecs"][0]
        if len(sent) == 1:
            group_now["replicas"] = 3  # the autoscaler's write, after our read
        if any(o["op"] == "test" and o["path"].endswith("/replicas") and o["value"] != group_now["replicas"] for o in patch):
            raise api_error(422, "Unprocessable Entity", '{"kind": "Status", "message": "test operation failed"}')
    ctl.kube.patch = racing_patch
    ctl.parents["TPUTorchService"]._put(service(rv="12", generation=3, replicas={"min": 2, "max": 4}))
    run(ctl.reconcile(SVC_KEY))
    assert len(sent) == 2
    assert {o["path"].rsplit("/", 1)[1]: o["value"] for o in sent[1] if o["op"] == "add"} == {"minReplicas": 2, "maxReplicas": 4, "replicas": 3}


# --- a KubeRay whose CRD drops authOptions ------------------------------------------------------------

def _drop_auth(field: str, key: str | None = None):
    """What an older KubeRay's structural schema does at create: 1.5.0 has no authOptions, 1.5.1 only
    its ``mode`` (read in their CRDs, ray-operator/config/crd/bases)."""
    def prune(obj: dict) -> None:
        options = obj["spec"][field]
        if key is None:
            options.pop("authOptions", None)
        else:
            options["authOptions"].pop(key, None)
    return prune


async def _reconciled_with_events(ctl, key):
    result = await ctl.reconcile(key)
    await ctl.recorder.drain()
    return result


@pytest.mark.parametrize("kind_key, parent, plural, field", [
    (KEY, job(), "rayjobs", "rayClusterSpec"),
    (SVC_KEY, service(), "rayservices", "rayClusterConfig"),
])
def test_a_child_whose_auth_options_kuberay_dropped_is_a_condition_and_a_warning(kind_key, parent, plural, field):
    kube = FakeKube()
    kube.prune[plural] = _drop_auth(field)  # KubeRay 1.5.0's CRD
    ctl = controller(kube)
    ctl.parents[kind_key[0]].remember(parent)
    assert run(_reconciled_with_events(ctl, kind_key)) == "created"
    auth = condition(last_status(kube), "RayAuth")
    assert (auth["status"], auth["reason"]) == ("False", "AuthOptionsDropped")
    assert f"spec.{field}.authOptions" in auth["message"] and "WITHOUT token authentication" in auth["message"]
    assert "upgrade KubeRay to 1.6" in auth["message"]
    assert ("event", kind_key[2], "AuthOptionsDropped") in kube.calls
    # the same child seen again: no second event
    ctl.children[kind_key[0]]._put(ctl.children[kind_key[0]].slim(kube.objects[(plural, "ml", kind_key[2])]))
    run(_reconciled_with_events(ctl, kind_key))
    assert [c for c in kube.calls if c[0] == "event" and c[2] == "AuthOptionsDropped"] == [("event", kind_key[2], "AuthOptionsDropped")]


def test_a_rayjob_whose_token_secret_name_kuberay_dropped_says_progress_cannot_be_read():
    kube = FakeKube()
    kube.prune["rayjobs"] = _drop_auth("rayClusterSpec", "secretName")  # KubeRay 1.5.1's CRD
    ctl = setup(job(), kube=kube)
    assert run(_reconciled_with_events(ctl, KEY)) == "created"
    auth = condition(last_status(kube), "RayAuth")
    assert (auth["status"], auth["reason"]) == ("False", "AuthSecretNameDropped")
    assert "training progress cannot be read" in auth["message"]
    assert ("event", "demo", "AuthSecretNameDropped") in kube.calls
    assert [c[1] for c in kube.called("create")] == ["rayjobs"]  # no Secret for a name the RayJob lost


@pytest.mark.parametrize("kind_key, parent", [(KEY, job()), (SVC_KEY, service())])
def test_a_child_that_kept_its_auth_options_says_so_quietly(kind_key, parent):
    ctl = controller()
    ctl.parents[kind_key[0]].remember(parent)
    assert run(_reconciled_with_events(ctl, kind_key)) == "created"
    auth = condition(last_status(ctl.kube), "RayAuth")
    assert (auth["status"], auth["reason"]) == ("True", "TokenAuth")
    assert ("Secret demo-ray-token-" in auth["message"]) == (kind_key == KEY)
    assert not [c for c in ctl.kube.calls if c[0] == "event" and c[2] == "TokenAuth"]


# --- Kueue's cap on pod sets per Workload: read from its Workload CRD, applied before a create -------

def workload_crd(max_items: int | None, rv: str = "1", unserved_max: int | None = None) -> dict:
    """Kueue's Workload CRD as the API serves it (the parts read): spec.podSets maxItems per version."""
    def version(name, served, cap):
        podsets = {"type": "array", **({"maxItems": cap} if cap is not None else {})}
        return {"name": name, "served": served, "storage": name == "v1beta2",
                "schema": {"openAPIV3Schema": {"properties": {"spec": {"properties": {"podSets": podsets}}}}}}
    versions = [version("v1beta2", True, max_items), version("v1beta1", True, max_items)]
    if unserved_max is not None:
        versions.append(version("v1alpha1", False, unserved_max))
    return {"metadata": {"name": "workloads.kueue.x-k8s.io", "resourceVersion": rv}, "spec": {"versions": versions}}


def with_workload_crd(ctl, crd: dict | None, listed: bool = True):
    from tputorch.controller.informer import Informer
    from ..fakekube import FakeSource
    ctl.workload_crd = Informer("Kueue's Workload CRD", FakeSource(), None, lambda *_: None, stores.slim_workload_crd)
    if crd is not None:
        ctl.workload_crd.remember(crd)
    if listed:
        ctl.workload_crd.synced.set()
    return ctl


def cpu_groups(n: int) -> list[dict]:
    return [{"name": f"g{i}"} for i in range(n)]


def test_the_workload_crds_pod_set_cap_is_the_smallest_over_its_served_versions():
    from tputorch.status import kueue
    assert kueue.podsets_max_items(workload_crd(18)) == 18
    assert kueue.podsets_max_items(workload_crd(18, unserved_max=4)) == 18  # an unserved version makes no Workload
    crd = workload_crd(18)
    crd["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["podSets"]["maxItems"] = 8
    assert kueue.podsets_max_items(crd) == 8
    assert kueue.podsets_max_items(workload_crd(None)) is None
    assert stores.slim_workload_crd(workload_crd(18)) == {
        "metadata": {"name": "workloads.kueue.x-k8s.io", "resourceVersion": "1"}, "podSetsMaxItems": 18}


def test_a_queued_jobs_groups_follow_the_installed_kueue_and_an_upgrade_admits_what_was_refused():
    """Kueue 0.17's Workload CRD (8 pod sets): a queued job of 6 groups is refused before any RayJob,
    naming the field, the value, the cap and why. Kueue 0.19's CRD (18) replaces it: the watch
    looks at the queued job again and its RayJob is created."""
    ctl = with_workload_crd(setup(job(queueName="tpu", groups=cpu_groups(6))), workload_crd(8))
    assert run(ctl.reconcile(KEY)) == "invalid"
    assert ctl.kube.called("create") == []
    st = last_status(ctl.kube)
    assert st["phase"] == "Failed" and condition(st, "Validated")["reason"] == "ValidationFailed"
    for part in ("spec.groups: '6 groups' must hold at most 5 groups while spec.queueName is set",
                 "at most 8 pod sets (the installed Kueue's Workload CRD, spec.podSets maxItems)"):
        assert part in st["message"], st["message"]
    assert run(ctl.reconcile(KEY)) == "invalid" and ctl.kube.called("create") == []  # kept, not re-checked
    ctl.workload_crd.store[("", "workloads.kueue.x-k8s.io")] = stores.slim_workload_crd(workload_crd(18, rv="2"))
    ctl.workload_crd_changed("MODIFIED", workload_crd(18, rv="2"))
    assert KEY in ctl.queue._dirty  # queued again
    assert run(ctl.reconcile(KEY)) == "created"
    created = ctl.kube.objects[("rayjobs", "ml", "demo")]
    assert len(created["spec"]["rayClusterSpec"]["workerGroupSpecs"]) == 7  # the slice and 6 groups


def test_without_kueues_workload_crd_there_is_no_kueue_cap_and_an_unreadable_one_gets_the_smallest_known(caplog):
    ctl = with_workload_crd(setup(job(queueName="tpu", groups=cpu_groups(16))), None)  # listed: not installed
    assert ctl.kueue_cap.podsets() is None
    assert run(ctl.reconcile(KEY)) == "created"
    unread = with_workload_crd(setup(job(queueName="tpu", groups=cpu_groups(6))), None, listed=False)
    unread.workload_crd.list_error = "HTTP 403 Forbidden"
    with caplog.at_level("WARNING", logger="tputorch"):
        assert run(unread.reconcile(KEY)) == "invalid"
    assert "could not be read (not listed yet (HTTP 403 Forbidden))" in caplog.text and "8 pod sets (5 spec.groups)" in caplog.text
    assert "Kueue's Workload CRD could not be read, not listed yet" in last_status(unread.kube)["message"]
    no_cap = with_workload_crd(setup(job(queueName="tpu", groups=cpu_groups(6))), workload_crd(None))
    assert run(no_cap.reconcile(KEY)) == "invalid"
    assert "its schema has no spec.podSets maxItems" in last_status(no_cap.kube)["message"]


def test_the_kueue_cap_never_refuses_an_unqueued_job_nor_one_whose_rayjob_exists():
    unqueued = with_workload_crd(setup(job(groups=cpu_groups(6))), workload_crd(8))
    assert run(unqueued.reconcile(KEY)) == "created"
    # Its RayJob exists (made under a larger cap, or before the operator restarted): never turned Failed.
    made = with_workload_crd(setup(job(queueName="tpu", groups=cpu_groups(6)),
                                   rayjob("uid-new", suspend=True, labels=QUEUED_LABELS)), None, listed=False)
    assert run(made.reconcile(KEY)) != "invalid"
    assert last_status(made.kube)["phase"] != "Failed"


def test_a_job_refused_before_the_workload_crd_was_listed_is_looked_at_again_when_it_lists_without_kueue():
    ctl = with_workload_crd(setup(job(queueName="tpu", groups=cpu_groups(6))), None, listed=False)
    assert run(ctl.reconcile(KEY)) == "invalid"  # not listed yet: Kueue 0.17's cap
    ctl.workload_crd.synced.set()  # listed: no Kueue installed
    ctl.workload_crd_changed("LISTED", {})
    assert KEY in ctl.queue._dirty
    assert run(ctl.reconcile(KEY)) == "created"

