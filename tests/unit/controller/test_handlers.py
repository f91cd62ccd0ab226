"""The parse cache of the reconcile and the wiring of informers to the controller (no API server)."""

import asyncio
import copy
import logging

import pytest

from tputorch.render.network import NetworkPolicyConfig
from tputorch.controller import handlers, kinds, stores
from tputorch.api import spec

from ..fakekube import FakeKube, FakeSource
from ..jobs import body

JOB = kinds.JOB


@pytest.fixture
def ctl():
    return handlers.build(FakeKube(), lambda path, *_: FakeSource(), asyncio.new_event_loop(), None)


def test_a_status_write_does_not_parse_again(ctl):
    job = body()
    first = ctl.specs.parse(JOB, job, "ml")
    echoed = copy.deepcopy(job)
    echoed["status"] = {"phase": "Pending"}
    echoed["metadata"]["resourceVersion"] = "42"
    assert ctl.specs.parse(JOB, echoed, "ml") is first


def test_a_new_generation_or_new_labels_parse_again(ctl):
    job = body()
    first = ctl.specs.parse(JOB, job, "ml")
    changed = body(entrypoint="python other.py")
    changed["metadata"]["generation"] = 2
    assert ctl.specs.parse(JOB, changed, "ml").entrypoint == "python other.py"
    relabelled = copy.deepcopy(changed)
    relabelled["metadata"]["labels"] = {"team": "ml"}
    assert ctl.specs.parse(JOB, relabelled, "ml").labels == {"team": "ml"}
    assert first.entrypoint == "python train.py"


def test_an_invalid_spec_stays_invalid_until_it_changes(ctl):
    bad = body(tpu={"topology": "3x3"})
    for _ in range(2):
        with pytest.raises(spec.InvalidSpec, match="spec.tpu.topology"):
            ctl.specs.parse(JOB, bad, "ml")
    fixed = body()
    fixed["metadata"]["generation"] = 2
    assert ctl.specs.parse(JOB, fixed, "ml").slice.topology == "4x4"


def test_the_namespace_is_the_objects_own_whatever_the_body_says(ctl):
    assert ctl.specs.parse(JOB, body(namespace="elsewhere"), "ml").namespace == "ml"


def test_every_kind_gets_an_informer_for_itself_and_its_child_and_one_for_pods(ctl):
    assert set(ctl.parents) == set(ctl.children) == {k.resource.kind for k in kinds.KINDS}
    assert ctl.children["TPUTorchJob"].source is not ctl.parents["TPUTorchJob"].source
    assert ctl.pods.index_of is stores.pod_index


def test_informer_changes_reach_the_controller_on_its_loop():
    loop = asyncio.new_event_loop()
    ctl = handlers.build(FakeKube(), lambda path, *_: FakeSource(), loop, None)
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


# --- a store that never lists (issue 34) -----------------------------------------------------------

class _FailsForEver:
    """A list that answers 500 every time (Kueue's conversion webhook left behind)."""

    def __init__(self):
        self.lists = 0

    def list(self, scope):
        from ..fakekube import api_error
        self.lists += 1
        raise api_error(500, "Internal Server Error")

    def watch(self, scope, resource_version):
        raise AssertionError("never listed: never watched")


def _built(failing_path):
    """A controller whose informers' sources are fakes; the one of ``failing_path`` fails for ever.
    Every informer is cycled once (list, then its watch ends)."""
    from tputorch.controller.kind import WORKLOAD
    loop = asyncio.new_event_loop()
    failing = {"workloads": WORKLOAD, "rayjobs": kinds.JOB.child}[failing_path].path(None)
    ctl = handlers.build(FakeKube(), lambda path, *_: _FailsForEver() if path(None) == failing else FakeSource(),
                         loop, None, extras=kinds.extras(NetworkPolicyConfig()))
    required, optional = handlers.required_stores(ctl), handlers.optional_stores(ctl)
    for informer in required + optional:
        informer.cycle(None)
    return loop, ctl, required, optional


def test_an_optional_store_that_never_lists_gates_nothing_and_is_named(caplog):
    loop, ctl, required, optional = _built("workloads")
    assert [i.what for i in optional if not i.synced.is_set()] == ["Kueue Workloads"]
    assert {"networkpolicies", "Kueue WorkloadPriorityClasses"} <= {i.what for i in optional}
    started = []
    handlers.RUNTIME.election = None
    loop.run_until_complete(asyncio.wait_for(
        handlers.sync_then_run(required, lambda: started.append(True), optional, deadline=60, optional_wait=0.1), 5))
    assert started == [True]  # the required stores listed: the workers run without Kueue's
    assert "running without Kueue Workloads (HTTP 500 Internal Server Error)" in caplog.text
    ready, text = handlers.health.readiness(required, optional)
    assert ready and "not listed (optional, running without): Kueue Workloads (HTTP 500" in text
    loop.close()


def test_a_required_store_that_never_lists_fails_readiness_and_after_the_deadline_runs_with_what_there_is(caplog):
    loop, ctl, required, optional = _built("rayjobs")
    ready, text = handlers.health.readiness(required, optional)
    assert not ready and text == "not listed (required): rayjobs (HTTP 500 Internal Server Error)"
    started = []
    handlers.RUNTIME.election = None
    loop.run_until_complete(asyncio.wait_for(
        handlers.sync_then_run(required, lambda: started.append(True), optional, deadline=0.3, optional_wait=0.1), 5))
    assert started == [True]
    assert "without a full list of: rayjobs (HTTP 500 Internal Server Error)" in caplog.text
    loop.close()


def test_a_store_that_never_lists_shows_in_the_metrics():
    from tputorch.controller.metrics import Metrics
    loop, ctl, required, optional = _built("workloads")
    m = Metrics()
    m.sources.listed = lambda: {i.what: i.synced.is_set() for i in required + optional}
    text = m.exposition()
    assert 'tputorch_informer_listed{resource="Kueue Workloads"} 0.0' in text
    assert 'tputorch_informer_listed{resource="pods"} 1.0' in text
    loop.close()


def test_the_readiness_endpoint_answers_503_naming_the_store_then_200():
    import urllib.request
    import urllib.error
    from freeports import free_port  # tests/ (the unit package's parent) is on sys.path

    state = {"ready": False}

    async def scenario():
        port = free_port()
        runner = await handlers.health.serve("127.0.0.1", port, "/readyz",
                                             lambda: (state["ready"], "not listed (required): pods"))
        try:
            def get():
                try:
                    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                            f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                        return resp.status, resp.read().decode()
                except urllib.error.HTTPError as err:
                    return err.code, err.read().decode()
            first = await asyncio.to_thread(get)
            state["ready"] = True
            return first, await asyncio.to_thread(get)
        finally:
            await runner.cleanup()
    (code, text), (code2, _) = asyncio.run(scenario())
    assert (code, text, code2) == (503, "not listed (required): pods\n", 200)


def test_startup_switches_kopfs_scanning_off(monkeypatch):
    """kopf's resource and namespace observers start after the startup handlers, whatever handlers
    exist: scanning off, they list and watch no CRD and no namespace (the chart grants neither)."""
    import kopf

    runtime = handlers.Runtime()
    runtime.controller = object()  # built already: start() only configures kopf
    monkeypatch.setattr(handlers, "RUNTIME", runtime)
    monkeypatch.setattr(handlers, "CONFIG", handlers.Config())
    settings = kopf.OperatorSettings()
    assert not settings.scanning.disabled
    asyncio.run(handlers.start(settings))
    assert settings.scanning.disabled and settings.posting.level == logging.WARNING


# --- startup is idempotent (issue 34) --------------------------------------------------------------

def test_a_startup_that_failed_after_its_informers_started_builds_nothing_twice(monkeypatch):
    """kopf runs a failed startup again: the metrics port taken must not make a second controller
    with a second set of stores (without leader election, two controllers would write)."""
    import socket

    import kopf

    from freeports import free_port  # tests/ (the unit package's parent) is on sys.path

    class Kube(FakeKube):
        api_client, drain = None, None

        def __init__(self, *args, **kwargs):
            super().__init__()

    started = []
    monkeypatch.setattr(handlers, "RUNTIME", handlers.Runtime())
    monkeypatch.setattr(handlers, "load_config", lambda: None)
    monkeypatch.setattr(handlers, "Kube", Kube)
    monkeypatch.setattr(handlers, "RestSource", lambda api, path, *selectors: FakeSource())
    monkeypatch.setattr(handlers.Informer, "start", lambda self: started.append(self))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    monkeypatch.setattr(handlers, "CONFIG", handlers.Config(metrics_host="127.0.0.1", metrics_port=taken.getsockname()[1]))

    async def scenario():
        with pytest.raises(OSError):
            await handlers.start(kopf.OperatorSettings())
        first, stores, syncing = handlers.RUNTIME.controller, list(started), handlers.RUNTIME.syncing
        with pytest.raises(OSError):
            await handlers.start(kopf.OperatorSettings())  # still taken: kopf's retry fails again
        assert handlers.RUNTIME.controller is first and started == stores and handlers.RUNTIME.syncing is syncing
        handlers.CONFIG.metrics_port = free_port()  # freed: the retry serves metrics, nothing else
        await handlers.start(kopf.OperatorSettings())
        assert handlers.RUNTIME.controller is first and started == stores and handlers.RUNTIME.metrics is not None
        assert len(stores) == len(handlers.RUNTIME.informers) == len({id(s) for s in stores})
        syncing.cancel()
        await handlers.RUNTIME.metrics.cleanup()
    try:
        asyncio.run(scenario())
    finally:
        taken.close()


def test_the_operators_pod_bound_reaches_both_kinds_parse():
    ctl = handlers.build(FakeKube(), lambda path, *_: FakeSource(), asyncio.new_event_loop(), None, max_pods=5)
    job = ctl.kinds["TPUTorchJob"]
    with pytest.raises(spec.InvalidSpec, match="spec.tpu.topology: '6 pods' must make at most 5 pods per job"):
        ctl.specs.parse(job, body(), "ml")
    service = {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService", "metadata": {"name": "s", "namespace": "ml"},
               "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.com/vllm:1",
                        "model": {"source": "Qwen/Qwen3-8B"}, "replicas": {"min": 1, "max": 3}}}
    with pytest.raises(spec.InvalidSpec, match=r"spec.replicas.max: '13 pods' must make at most 5"):
        ctl.specs.parse(ctl.kinds["TPUTorchService"], service, "ml")
    default = handlers.build(FakeKube(), lambda path, *_: FakeSource(), asyncio.new_event_loop(), None)
    assert default.specs.parse(default.kinds["TPUTorchJob"], body(), "ml").slice.hosts == 4


def test_kueues_workload_crd_is_read_by_name_as_an_optional_store_that_reaches_the_controller():
    asked: list = []

    def source_for(path, *selectors):
        asked.append((path(None), selectors))
        return FakeSource()

    loop = asyncio.new_event_loop()
    try:
        ctl = handlers.build(FakeKube(), source_for, loop, None)
        assert ("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                (None, "metadata.name=workloads.kueue.x-k8s.io")) in asked
        assert ctl.workload_crd in handlers.optional_stores(ctl) and ctl.workload_crd not in handlers.required_stores(ctl)
        # its changes reach workload_crd_changed on the loop
        ctl.workload_crd.source.listing = {"items": [{"metadata": {"name": "workloads.kueue.x-k8s.io", "resourceVersion": "3"},
                                                      "spec": {"versions": []}}], "metadata": {"resourceVersion": "3"}}
        ctl.workload_crd.relist(None)
        loop.run_until_complete(asyncio.sleep(0))
        assert ctl.kueue_cap.seen is not None and ctl.kueue_cap.seen.max_podsets == 8  # listed, no maxItems: the smallest known
    finally:
        loop.close()


# --- memory against hostile objects (issue 34) -----------------------------------------------------

def test_a_large_refused_job_is_stored_as_its_refusal_and_still_gets_its_status():
    """300 CRD-valid 1.4 MB TPUTorchJobs that the parser refuses were kept whole (410 MB)."""
    from tputorch.controller.kind import REFUSED
    big = body(entrypoint="python " + "x" * (1024 * 1024))
    big["metadata"].update(uid="u-big", resourceVersion="3")
    loop = asyncio.new_event_loop()
    ctl = handlers.build(FakeKube(), lambda path, *_: FakeSource(), loop, None)
    parents = ctl.parents["TPUTorchJob"]
    parents.source.listing = {"items": [big], "metadata": {"resourceVersion": "9"}}
    parents.relist(None)
    stored = parents.get(("ml", "demo"))
    assert stored["spec"] == {} and "spec.entrypoint" in str(stored[REFUSED])
    assert len(str(stored)) < 2000  # nothing of the megabyte is kept
    assert loop.run_until_complete(ctl.reconcile(("TPUTorchJob", "ml", "demo"))) == "invalid"
    status = ctl.kube.called("patch_status")[-1][4]
    assert status["phase"] == "Failed" and "spec.entrypoint" in status["message"]
    assert all(e.value is None for e in ctl.specs.parsed["u-big"][1].errors)  # nor in the parse cache
    small = body()  # a valid job is stored as it is
    small["metadata"].update(uid="u-small", resourceVersion="4", name="small")
    parents.source.listing = {"items": [small], "metadata": {"resourceVersion": "10"}}
    parents.relist(None)
    assert parents.get(("ml", "small"))["spec"] == small["spec"]
    loop.close()
