"""The parse cache of the reconcile and the wiring of informers to the controller (no API server)."""

import asyncio
import copy

import pytest

from tputorch.controller import handlers, kinds
from tputorch.api import spec

from ..fakekube import FakeKube, FakeSource
from ..jobs import body

JOB = kinds.JOB


@pytest.fixture
def ctl():
    return handlers.build(FakeKube(), lambda path, selector: FakeSource(), asyncio.new_event_loop(), None)


def test_a_status_write_does_not_parse_again(ctl):
    job = body()
    first = ctl._parse(JOB, job, "ml")
    echoed = copy.deepcopy(job)
    echoed["status"] = {"phase": "Pending"}
    echoed["metadata"]["resourceVersion"] = "42"
    assert ctl._parse(JOB, echoed, "ml") is first


def test_a_new_generation_or_new_labels_parse_again(ctl):
    job = body()
    first = ctl._parse(JOB, job, "ml")
    changed = body(entrypoint="python other.py")
    changed["metadata"]["generation"] = 2
    assert ctl._parse(JOB, changed, "ml").entrypoint == "python other.py"
    relabelled = copy.deepcopy(changed)
    relabelled["metadata"]["labels"] = {"team": "ml"}
    assert ctl._parse(JOB, relabelled, "ml").labels == {"team": "ml"}
    assert first.entrypoint == "python train.py"


def test_an_invalid_spec_stays_invalid_until_it_changes(ctl):
    bad = body(tpu={"topology": "3x3"})
    for _ in range(2):
        with pytest.raises(spec.InvalidSpec, match="spec.tpu.topology"):
            ctl._parse(JOB, bad, "ml")
    fixed = body()
    fixed["metadata"]["generation"] = 2
    assert ctl._parse(JOB, fixed, "ml").slice.topology == "4x4"


def test_the_namespace_is_the_objects_own_whatever_the_body_says(ctl):
    assert ctl._parse(JOB, body(namespace="elsewhere"), "ml").namespace == "ml"


def test_every_kind_gets_an_informer_for_itself_and_its_child_and_one_for_pods(ctl):
    assert set(ctl.parents) == set(ctl.children) == {k.resource.kind for k in kinds.KINDS}
    assert ctl.children["TPUTorchJob"].source is not ctl.parents["TPUTorchJob"].source
    assert ctl.pods.index_of is kinds.pod_index


def test_informer_changes_reach_the_controller_on_its_loop():
    loop = asyncio.new_event_loop()
    ctl = handlers.build(FakeKube(), lambda path, selector: FakeSource(), loop, None)
    ctl.parents["TPUTorchJob"].on_change("ADDED", body())
    assert len(ctl.queue) == 0  # scheduled on the loop, not run in the informer's thread
    loop.run_until_complete(asyncio.sleep(0))
    assert list(ctl.queue._queue) == [("TPUTorchJob", "ml", "demo")]
    loop.close()


# --- startup: stores first, then workers (issue 20) -------------------------------------------------

class _Store:
    def __init__(self, what):
        import threading
        self.what, self.synced = what, threading.Event()


def test_stores_sync_concurrently_within_one_deadline_and_workers_start_only_after():
    async def scenario():
        stores = [_Store("a"), _Store("b")]
        started = []
        task = asyncio.create_task(handlers.sync_then_run(stores, lambda: started.append(True)))
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, stores[1].synced.set)
        await asyncio.sleep(0.15)
        assert started == []  # one store still lists: no worker may run on half the world
        stores[0].synced.set()
        await asyncio.wait_for(task, 1)
        assert started == [True]
        late = [_Store("a"), _Store("slow")]
        late[0].synced.set()
        t0 = loop.time()
        assert await handlers.wait_synced(late, 0.2) == ["slow"]
        assert loop.time() - t0 < 0.5  # one deadline for all, not one per store
    handlers.RUNTIME.election = None
    asyncio.run(scenario())


def test_a_standby_queues_nothing_and_queues_everything_once_it_leads(ctl):
    ctl.active = False
    ctl.parents["TPUTorchJob"].remember(body())
    for _ in range(3):
        ctl.parent_changed("TPUTorchJob", "MODIFIED", body())
        ctl.pod_changed("ADDED", {"metadata": {"namespace": "ml", "name": "p",
                                               "labels": {"tputorch.io/job": "other"}}})
    assert len(ctl.queue) == 0 and not ctl.queue._dirty
    ctl.activate()
    assert list(ctl.queue._queue) == [("TPUTorchJob", "ml", "demo")]


def test_events_still_held_at_shutdown_are_posted_within_a_bound(caplog):
    from tputorch.controller.events import EventRecorder
    from tputorch.status.conditions import Event

    async def scenario(post):
        recorder = EventRecorder(post, busy=lambda: True)  # reconciles queued: events were held
        for i in range(3):
            recorder.record({"uid": f"u{i}", "kind": "TPUTorchJob", "namespace": "ml", "name": f"j{i}"},
                            [Event("Normal", "Running", "running")])
        await handlers.drain_events(recorder, 0.5)
        return recorder

    posted = []

    async def post(regarding, event):
        posted.append(regarding["name"])
    assert not asyncio.run(scenario(post)).pending and posted == ["j0", "j1", "j2"]

    async def hangs(regarding, event):
        await asyncio.sleep(3600)
    assert len(asyncio.run(scenario(hangs)).pending) == 2  # one was taken, then the bound ended it
    assert "2 events not posted within 0.5s" in caplog.text
