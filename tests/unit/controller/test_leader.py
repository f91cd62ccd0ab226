"""Leader election against a fake Lease API (no API server): a failed renewal of any kind, renewals
bounded by the renew deadline, no write after it, a release that checks the holder and waits for
writes in flight, health; and the real Lease client's total timeout against a silent socket."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import urllib3

from tputorch.controller import leader
from tputorch.controller.leader import Conflict, Election


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeLeases:
    """One namespace's Leases with resourceVersions; ``fail`` queues exceptions for the next calls,
    ``hang`` blocks every call until set."""

    def __init__(self) -> None:
        self.leases: dict[str, dict] = {}
        self.rv = 0
        self.fail: list[Exception] = []
        self.timeouts: list[float] = []
        self.writes: list[dict] = []
        self.hang: threading.Event | None = None

    def _call(self, timeout) -> None:
        self.timeouts.append(timeout)
        if self.hang is not None:
            self.hang.wait()
        if self.fail:
            raise self.fail.pop(0)

    def get(self, name, namespace, timeout):
        self._call(timeout)
        lease = self.leases.get(name)
        return None if lease is None else {**lease, "spec": dict(lease["spec"])}

    def create(self, name, namespace, spec, timeout):
        self._call(timeout)
        if name in self.leases:
            raise Conflict("exists")
        self.rv += 1
        self.leases[name] = {"metadata": {"name": name, "namespace": namespace, "resourceVersion": str(self.rv)},
                             "spec": dict(spec)}
        self.writes.append(dict(spec))
        return self.leases[name]

    def replace(self, lease, timeout):
        self._call(timeout)
        name = lease["metadata"]["name"]
        if self.leases[name]["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]:
            raise Conflict("resourceVersion")
        self.rv += 1
        self.leases[name] = {"metadata": {**lease["metadata"], "resourceVersion": str(self.rv)},
                             "spec": dict(lease["spec"])}
        self.writes.append(dict(lease["spec"]))
        return self.leases[name]

    def holder(self, name="lease"):
        return self.leases[name]["spec"]["holderIdentity"]


def election(api, who, clock, **kw):
    events = {"leading": 0, "lost": 0}

    def on_leading():
        events["leading"] += 1

    def on_lost():
        events["lost"] += 1

    e = Election("lease", "ns", api, on_leading, on_lost, who=who, clock=clock, **kw)
    return e, events


def test_a_refused_connection_is_a_failed_renewal_and_the_lease_is_lost_after_the_deadline():
    api, clock = FakeLeases(), Clock()
    e, events = election(api, "a", clock)
    e.step()
    assert e.may_write() and events["leading"] == 1
    for _ in range(6):  # the API server is gone: urllib3 raises, not ApiException
        clock.now += 2
        api.fail.append(urllib3.exceptions.MaxRetryError(None, "/lease", "Connection refused"))
        e.step()  # never raises
        if clock.now < e.renewed_at + leader.RENEW_DEADLINE:
            assert e.may_write() and events["lost"] == 0
    assert not e.may_write()
    assert events["lost"] == 1 and not e.healthy()


def test_no_write_after_the_last_good_renewal_plus_the_renew_deadline_even_while_a_renewal_hangs():
    api = FakeLeases()
    e, events = election(api, "a", time.monotonic, lease_duration=1.5, renew_deadline=0.6, retry_period=0.1)
    e.start()
    deadline = time.monotonic() + 5
    while not e.may_write() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert e.may_write()
    api.hang = threading.Event()  # every call from now on blocks: a silent connection
    hung_at = time.monotonic()
    while e.may_write() and time.monotonic() < deadline:
        time.sleep(0.02)
    stopped_writing = time.monotonic()
    time.sleep(0.5)  # the watchdog declares it lost though the loop is stuck in a call
    api.hang.set()
    e._stop.set()
    assert stopped_writing - hung_at <= 0.6 + 0.1
    assert events["lost"] == 1
    assert e.write_timeout() is None


def test_each_call_of_an_attempt_gets_only_what_is_left_of_the_renew_deadline():
    api, clock = FakeLeases(), Clock()
    e, _ = election(api, "a", clock)

    slow_get = api.get

    def get(name, namespace, timeout):
        clock.now += 7  # the GET took 7 of the 10 seconds
        return slow_get(name, namespace, timeout)
    api.get = get
    e.step()
    assert api.timeouts[0] == leader.RENEW_DEADLINE and api.timeouts[1] == pytest.approx(3)
    clock.now += 2
    api.get = lambda *a: (setattr(clock, "now", clock.now + 11), slow_get(*a))[1]
    e.step()  # the deadline passed during the GET: no PUT is sent
    assert len(api.writes) == 1


def test_a_standby_takes_the_lease_only_after_the_lease_duration_without_renewal():
    api, clock = FakeLeases(), Clock()
    a, _ = election(api, "a", clock)
    b, b_events = election(api, "b", clock)
    a.step()
    b.step()
    assert api.holder() == "a" and not b.may_write()
    clock.now += 14  # a stopped renewing: b waits the lease duration from when it saw the renewal
    b.step()
    assert api.holder() == "a"
    clock.now += 2
    b.step()
    assert api.holder() == "b" and b.may_write() and b_events["leading"] == 1
    assert api.leases["lease"]["spec"]["leaseTransitions"] == 1
    assert not a.may_write()  # its renew deadline (10 s) ran out long before


def test_a_leader_stops_writing_before_a_standby_can_take_over():
    api, clock = FakeLeases(), Clock()
    a, _ = election(api, "a", clock)
    b, _ = election(api, "b", clock)
    a.step()
    b.step()
    took_over = None
    last_write_end = None
    for _ in range(200):
        clock.now += 0.1
        if a.may_write():
            last_write_end = clock.now + a.write_timeout()  # the latest a write started now can end
        b.step()
        if b.may_write():
            took_over = clock.now
            break
    assert took_over is not None and last_write_end < took_over


def test_release_writes_only_while_this_replica_holds_the_lease():
    api, clock = FakeLeases(), Clock()
    a, _ = election(api, "a", clock)
    a.step()
    # someone else took it meanwhile (a was partitioned): releasing must not clear their Lease
    lease = api.leases["lease"]
    api.leases["lease"] = {**lease, "spec": {**lease["spec"], "holderIdentity": "b"}}
    writes = len(api.writes)
    assert a.release() is False
    assert len(api.writes) == writes and api.holder() == "b"


def test_release_waits_for_writes_in_flight_then_frees_the_lease_for_the_standby():
    api, clock = FakeLeases(), Clock()
    drained = []
    a, _ = election(api, "a", clock, drain=lambda timeout: drained.append(timeout) or True)
    b, _ = election(api, "b", clock)
    a.step()
    b.step()
    assert a.release() is True and drained
    assert not a.may_write() and api.holder() == ""
    a.step()  # a released replica never takes the lease back
    clock.now += 0.5
    b.step()
    assert api.holder() == "b"


def test_release_with_writes_still_in_flight_leaves_the_lease_to_run_out():
    api, clock = FakeLeases(), Clock()
    a, _ = election(api, "a", clock, drain=lambda timeout: False)
    a.step()
    assert a.release() is False and api.holder() == "a"


def test_health_fails_when_a_leaders_renewals_stopped():
    api, clock = FakeLeases(), Clock()
    a, _ = election(api, "a", clock)
    assert a.healthy()  # a candidate that never led
    a.step()
    assert a.healthy()
    a.lost.set()  # e.g. on_lost did not end the process
    assert not a.healthy()


def test_the_lease_client_bounds_a_call_in_total_against_a_silent_server():
    """A server that accepts and never answers (a blackholed API server): one call, no retries,
    within its total timeout."""
    from kubernetes import client

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    conns = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(server.accept()[0])
            except OSError:
                pass
    threading.Thread(target=accept, daemon=True).start()
    try:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{server.getsockname()[1]}"
        api = leader.KubeLeaseApi(cfg)
        started = time.monotonic()
        with pytest.raises(Exception):
            api.get("lease", "ns", 0.5)
        took = time.monotonic() - started
        # A hang guard, not a speed measure: unbounded, this call never returns from a silent
        # server; 1.5 s (3x the timeout) failed once at load 24 (1.01 s seen), so the margin is wide.
        assert took < 15, took
        assert len(conns) == 1  # no retry by urllib3
    finally:
        stop.set()
        for c in conns:
            c.close()
        server.close()


# --- the writes' fence in the API adapter ------------------------------------------------------

class RecordingCustom:
    """The CustomObjectsApi calls Kube makes; each records its timeout, ``gate`` can hold them."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.gate: threading.Event | None = None
        self.started = threading.Event()

    def create_namespaced_custom_object(self, *args, _request_timeout=None):
        self.calls.append(("create", args[-1]["metadata"]["name"], _request_timeout))
        self.started.set()
        if self.gate is not None:
            self.gate.wait(5)
        return {"metadata": {"name": args[-1]["metadata"]["name"]}}

    def create_namespaced_secret(self, namespace, body, _request_timeout=None):
        self.calls.append(("create_secret", body["metadata"]["name"], _request_timeout))

    def get_namespaced_custom_object(self, *args, _request_timeout=None):
        self.calls.append(("get", args[-1], _request_timeout))
        return {}

    def patch_namespaced_custom_object_status(self, *args, _request_timeout=None, _preload_content=True):
        self.calls.append(("patch_status", args[-2], _request_timeout))
        return _Answer()

    def create_namespaced_event(self, *args, _request_timeout=None, _preload_content=True):
        self.calls.append(("event", args[0], _request_timeout))
        return _Answer()


class _Answer:
    def drain_conn(self):
        pass

    def release_conn(self):
        pass


def kube_with(fence=None, workers=1):
    from kubernetes import client

    from tputorch.controller.kube import Kube

    kube = Kube(client.Configuration(), workers, 1, fence=fence)
    kube.custom = kube.events = kube.secrets = RecordingCustom()
    return kube


def test_a_write_is_refused_once_the_fence_says_this_replica_may_not_write():
    import asyncio

    from tputorch.controller.kind import RAYJOB
    from tputorch.controller.kube import NotLeading

    allowed = {"timeout": 8.0}
    kube = kube_with(fence=lambda: allowed["timeout"])
    body = {"metadata": {"name": "a"}}
    asyncio.run(kube.create(RAYJOB, "ml", body))
    assert kube.custom.calls[-1][2] == 8.0  # bounded by what the Lease still allows
    allowed["timeout"] = None
    with pytest.raises(NotLeading):
        asyncio.run(kube.create(RAYJOB, "ml", {"metadata": {"name": "b"}}))
    asyncio.run(kube.get(RAYJOB, "ml", "a"))  # reads go on: a standby keeps reading
    assert [c[:2] for c in kube.custom.calls] == [("create", "a"), ("get", "a")]


def test_the_fence_is_checked_when_the_write_leaves_not_when_it_was_queued():
    import asyncio

    from tputorch.controller.kind import RAYJOB
    from tputorch.controller.kube import NotLeading

    allowed = {"timeout": 8.0}
    kube = kube_with(fence=lambda: allowed["timeout"])
    kube.custom.gate = threading.Event()

    async def scenario():
        first = asyncio.create_task(kube.create(RAYJOB, "ml", {"metadata": {"name": "a"}}))
        second = asyncio.create_task(kube.create(RAYJOB, "ml", {"metadata": {"name": "b"}}))
        await asyncio.sleep(0.05)  # b waits for the one thread, held by a
        allowed["timeout"] = None  # the lease ran out meanwhile
        kube.custom.gate.set()
        await first
        with pytest.raises(NotLeading):
            await second
    asyncio.run(scenario())
    assert [c[1] for c in kube.custom.calls] == ["a"]
    assert kube.drain(1)


def test_an_abandoned_reconcile_sends_nothing_more_and_its_key_waits_for_its_call_in_flight(monkeypatch):
    """The reconcile timeout cancels the coroutine, not the call on its thread: the key's next
    reconcile must not start while that call may still land."""
    import asyncio

    from tputorch.controller import reconcile

    from .test_reconcile import KEY, job, setup

    monkeypatch.setattr(reconcile, "RECONCILE_TIMEOUT", 0.05)
    kube = kube_with(workers=2)
    kube.custom.gate = threading.Event()
    ctl = setup(job(), kube=kube)
    ctl.queue.add_after = lambda key, delay: ctl.queue.add(key)  # retry at once

    async def scenario():
        workers = [asyncio.create_task(ctl.work()) for _ in range(2)]
        ctl.queue.add(KEY)
        await asyncio.sleep(0.4)  # the first create hangs on its thread; the reconcile timed out
        during = [c[0] for c in kube.custom.calls if c[0] != "create_secret"]
        kube.custom.gate.set()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if any(c[0] == "patch_status" for c in kube.custom.calls):
                break
        for w in workers:
            w.cancel()
        return during
    during = asyncio.run(scenario())
    assert during == ["create"]  # no second create and no status write while the first is in flight
    assert [c[0] for c in kube.custom.calls if c[0] != "create_secret"][:2] == ["create", "create"]
