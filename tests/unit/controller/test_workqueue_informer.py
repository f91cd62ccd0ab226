"""The work queue (coalescing, one worker per key, backoff) and the informer (re-list, echo, 404,
403, 410, resourceVersion) through a fake Source."""

from __future__ import annotations

import asyncio
import json

import pytest

from tputorch.controller import informer as informer_module, rest as rest_module
from tputorch.controller import stores
from tputorch.controller.informer import Informer, _Relist, key_of
from tputorch.controller.rest import RestSource
from tputorch.controller.workqueue import Backoff, Bucket, WorkQueue

from ..fakekube import FakeSource, StopWatching, api_error, informer


def obj(name, rv, ns="ml", **extra):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, **extra}, "spec": {}, "status": {}}


# --- work queue -----------------------------------------------------------------------------------

def test_a_burst_for_one_key_coalesces_and_a_key_runs_once_at_a_time():
    async def scenario():
        q = WorkQueue()
        for _ in range(5):
            q.add("a")
        q.add("b")
        assert len(q) == 2
        key = await q.get()
        q.add(key)  # changed while being reconciled: not handed to a second worker now
        assert (len(q), await q.get()) == (1, "b")
        assert len(q) == 0
        q.done(key)  # ... but right after
        assert await q.get() == "a"
    asyncio.run(scenario())


def test_a_ready_key_wakes_one_idle_worker_and_a_cancelled_wake_passes_on():
    async def scenario():
        q = WorkQueue()
        resumed = []

        async def worker(i):
            key = await q.get()
            resumed.append((i, key))

        tasks = [asyncio.create_task(worker(i)) for i in range(8)]
        await asyncio.sleep(0)
        assert len(q._waiters) == 8
        q.add("a")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert resumed == [(0, "a")] and len([w for w in q._waiters if not w.done()]) == 7
        # worker 1 is woken for "b" and cancelled (the operator stopping) before it runs: "b" goes on
        q.add("b")
        tasks[1].cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert resumed == [(0, "a"), (2, "b")] and tasks[1].cancelled()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.run(scenario())


def test_delayed_adds_keep_the_earliest():
    async def scenario():
        q = WorkQueue()
        q.add_after("a", 0.05)
        q.add_after("a", 10)  # later: ignored
        q.add_after("b", 10)
        q.add_after("b", 0.01)  # earlier: replaces
        got = [await asyncio.wait_for(q.get(), 1), await asyncio.wait_for(q.get(), 1)]
        assert got == ["b", "a"] and q.known() == set()
    asyncio.run(scenario())


def test_backoff_doubles_up_to_its_cap_and_forget_resets():
    b = Backoff(base=0.5, cap=4)
    assert [b.next("k") for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    b.forget("k")
    assert b.next("k") == 0.5


# --- informer -------------------------------------------------------------------------------------

def test_retries_of_all_keys_together_are_spread_by_one_bucket():
    now = [0.0]
    bucket = Bucket(rate=10.0, burst=100, clock=lambda: now[0])

    async def scenario():
        q = WorkQueue(Backoff(base=1.0), bucket=bucket)
        q.add_after = lambda key, delay: None  # observe the delays only
        return [q.retry(f"k{i}") for i in range(150)]
    delays = asyncio.run(scenario())
    # an outage fails 150 objects at once: 100 retry after their own 1 s, then 10 per second
    assert delays[:100] == [1.0] * 100
    assert delays[100:] == pytest.approx([(i + 1) / 10 if (i + 1) / 10 > 1 else 1.0 for i in range(50)])
    now[0] = 60.0  # a quiet minute refills the bucket
    assert bucket.reserve() == 0.0


def test_relist_reports_what_vanished_and_what_exists():
    src = FakeSource()
    inf, changes = informer(source=src)
    inf._put(obj("gone", "1"))
    inf._put(obj("kept", "1"))
    src.listing = {"items": [obj("kept", "2"), obj("new", "3")], "metadata": {"resourceVersion": "9"}}
    assert inf.relist(None) == "9"
    assert [(e, o.get("metadata", {}).get("name")) for e, o in changes] == [
        ("DELETED", "gone"), ("SYNCED", "kept"), ("SYNCED", "new"), ("LISTED", None)]
    assert inf.keys() == {("ml", "kept"), ("ml", "new")} and inf.synced.is_set()


def test_watch_resumes_from_the_listed_version_and_skips_our_own_echo():
    src = FakeSource()
    src.listing = {"items": [obj("mine", "6")], "metadata": {"resourceVersion": "5"}}
    inf, changes = informer(source=src)
    src.streams = [[{"type": "ADDED", "object": obj("mine", "6")},  # its echo
                    {"type": "MODIFIED", "object": obj("mine", "7")},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}],
                   StopWatching()]
    with pytest.raises(StopWatching):
        inf.run_scope_once(None)
    assert src.watched_from == ["5", "8"]
    assert [(e, o["metadata"]["resourceVersion"]) for e, o in changes if e in ("ADDED", "MODIFIED")] == [
        ("MODIFIED", "7")]
    inf.remember(obj("mine", "6"))  # what a create answered, older than what the watch brought
    assert inf.get(("ml", "mine"))["metadata"]["resourceVersion"] == "7"


def test_a_410_inside_the_stream_lists_again_at_once():
    src = FakeSource()
    inf, _ = informer(source=src)
    src.streams = [[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]]
    with pytest.raises(_Relist) as err:
        inf.run_scope_once(None)
    assert err.value.code == 410
    assert inf._failed(None, api_error(410)) is None  # no wait before the new list


def test_a_kind_not_served_empties_the_store_then_reports_served():
    src = FakeSource()
    inf, changes = informer(source=src)
    inf.relist(None)
    inf._put(obj("a", "1"))
    inf.clock = Clock()
    inf._failed(None, api_error(404))
    assert inf.served is True and inf.keys() == {("ml", "a")}  # one 404 is not "gone"
    inf.clock.now += informer_module.NOT_SERVED_AFTER
    inf._failed(None, api_error(404))
    assert inf.served is False and inf.keys() == set()
    assert ("DELETED", "a") in [(e, o.get("metadata", {}).get("name")) for e, o in changes]
    changes.clear()
    inf.relist(None)
    assert "SERVED" in [e for e, _ in changes] and inf.served is True


def test_one_404_of_a_served_child_kind_does_not_empty_its_store():
    """An API server whose CRD handlers are not ready yet answers 404 for a moment: the store and
    every Running object must not follow it."""
    src = FakeSource()
    inf, changes = informer(source=src)
    src.listing = {"items": [obj("a", "1")], "metadata": {"resourceVersion": "2"}}
    inf.clock = Clock()
    assert inf.cycle(None) is not None  # listed, then the watch ended
    changes.clear()
    src.list_error = [api_error(404)]
    assert inf.cycle(None) > 0
    assert inf.keys() == {("ml", "a")} and "DELETED" not in [e for e, _ in changes]
    inf.clock.now += 5
    assert inf.cycle(None) is not None  # served again: listed
    assert inf.keys() == {("ml", "a")} and "DELETED" not in [e for e, _ in changes]


def test_a_404_streak_interrupted_by_refused_connections_starts_again():
    """Issue 34: a 404, then an API server refusing connections for longer than NOT_SERVED_AFTER,
    then one 404 emptied the child store (every running job lost its RayJob to the reconcile)."""
    src = FakeSource()
    inf, changes = informer(source=src)
    src.listing = {"items": [obj("a", "1")], "metadata": {"resourceVersion": "2"}}
    inf.clock = Clock()
    inf.cycle(None)
    src.list_error = [api_error(404)]
    inf.cycle(None)
    for _ in range(3):
        inf.clock.now += informer_module.NOT_SERVED_AFTER
        src.list_error = [ConnectionRefusedError("refused")]
        inf.cycle(None)
    src.list_error = [api_error(404)]
    inf.cycle(None)
    assert inf.served is True and inf.keys() == {("ml", "a")}, "one 404 after the outage is not a streak"


def test_a_namespace_pattern_with_an_exclusion_excludes_it():
    """Issue 34: `!ns` patterns (kopf's exclusions) matched nothing, so nothing was reconciled."""
    from tputorch.controller.informer import Informer as Inf
    inf = Inf("things", FakeSource(), ["!kube-system", "!team-b-*"], lambda e, o: None, stores.slim_object)
    assert inf.scopes == [None]
    wanted = [ns for ns in ("ml", "kube-system", "team-b-1", "team-a") if inf._wanted({"metadata": {"namespace": ns}})]
    assert wanted == ["ml", "team-a"]
    both = Inf("things", FakeSource(), ["team-*", "!team-b-*"], lambda e, o: None, stores.slim_object)
    assert [ns for ns in ("ml", "team-a", "team-b-1") if both._wanted({"metadata": {"namespace": ns}})] == ["team-a"]


def test_a_kind_missing_at_start_counts_as_listed_at_once():
    src = FakeSource()
    inf, _ = informer(source=src)
    src.list_error = [api_error(404)]
    inf.cycle(None)
    assert inf.served is False and inf.synced.is_set()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_list_that_works_while_the_watch_fails_backs_off_to_30s_and_says_forbidden_once():
    """RBAC with list but not watch (or 429s, or a proxy cutting streams): every cycle lists and
    reconciles everything; the backoff must not be reset by the good list."""
    src = FakeSource()
    inf, changes = informer(source=src)
    inf.clock = Clock()
    delays = []
    for _ in range(12):
        src.streams = [api_error(403, body="cannot watch rayjobs")]
        delay = inf.cycle(None)
        delays.append(delay)
        inf.clock.now += delay
    nominal = [min(informer_module.BACKOFF_BASE * 2 ** i, informer_module.BACKOFF_CAP) for i in range(12)]
    assert all(n <= d <= n * 1.5 for n, d in zip(nominal, delays)), delays  # never reset by the good list
    elapsed, lists_after_a_minute = 0.0, 0
    for d in delays:
        elapsed += d
        lists_after_a_minute += elapsed > 60
    assert min(delays[6:]) >= informer_module.BACKOFF_CAP
    assert [e for e, _ in changes].count("FORBIDDEN") == 1 and inf.forbidden
    assert src.lists == 12 and lists_after_a_minute <= (elapsed - 60) / 30 + 1


def test_429s_from_the_watch_back_off_and_a_watch_that_stays_up_resets_the_backoff():
    src = FakeSource()
    inf, _ = informer(source=src)
    inf.clock = Clock()
    delays = []
    for _ in range(5):
        src.streams = [api_error(429)]
        delays.append(inf.cycle(None))
    assert delays[-1] > 8 * 0.8

    def healthy_then_cut():
        inf.clock.now += informer_module.HEALTHY_WATCH
        yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}
        raise ConnectionResetError("cut")
    src.streams = [healthy_then_cut()]
    assert inf.cycle(None) < 0.8 * 1.5  # back to the base delay


def test_a_stream_cut_short_without_an_error_backs_off_before_watching_again():
    src = FakeSource()
    inf, _ = informer(source=src)
    inf.clock = Clock()
    waits = []
    inf._stop.wait = lambda delay: waits.append(delay) or False
    src.streams = [[], [], []]  # three streams that end at once, then StopWatching
    inf.cycle(None)
    assert len(waits) == 3 and waits[0] < waits[2]


def test_a_full_relist_comes_round_and_drops_a_ghost():
    src = FakeSource()
    inf, changes = informer(source=src)
    inf.clock = Clock()
    src.listing = {"items": [obj("a", "1")], "metadata": {"resourceVersion": "2"}}
    inf.cycle(None)
    inf._put(obj("ghost", "3"))  # left behind by a missed event

    def long_watch():
        inf.clock.now += informer_module.RELIST_PERIOD * 1.5
        yield from ()
    src.streams = [long_watch()]
    inf._stop.wait = lambda delay: False
    assert inf.run_scope_once(None) is None
    assert src.lists == 2
    src.streams = [long_watch()]
    inf.run_scope_once(None)  # the due re-list sweeps the ghost
    assert ("ml", "ghost") not in inf.keys()


def test_a_403_is_reported_once_per_streak():
    src = FakeSource()
    inf, changes = informer(source=src)
    for _ in range(3):
        inf._failed(None, api_error(403, body="rayjobs.ray.io is forbidden"))
    assert [e for e, _ in changes].count("FORBIDDEN") == 1
    assert "forbidden" in inf.forbidden and inf.synced.is_set()
    inf.relist(None)
    assert inf.forbidden is None


def test_the_index_follows_label_changes():
    inf, _ = informer(index=lambda o: o["metadata"].get("labels", {}).get("job"))
    inf._put(obj("p", "1", labels={"job": "a"}))
    inf._put(obj("p", "2", labels={"job": "b"}))
    assert inf.indexed("a") == [] and [o["metadata"]["name"] for o in inf.indexed("b")] == ["p"]
    inf._pop(("ml", "p"))
    assert inf.indexed("b") == [] and inf.by_index == {}


class _Response:
    def __init__(self, body: dict) -> None:
        self.status, self.reason, self._body = 200, "OK", json.dumps(body).encode()

    def read(self) -> bytes:
        return self._body


class _Raw:
    """A response whose body is given as text: a list page (read) or a watch stream (stream)."""

    def __init__(self, text: str, stream: bool = False) -> None:
        self.status, self.reason, self._body = 200, "OK", text.encode()
        self.response = self

    def read(self) -> bytes:
        return self._body

    def stream(self, amt=None, decode_content=False):
        yield self._body

    def release_conn(self) -> None:
        pass


class _PagingApi:
    """The two ApiClient calls RestSource makes; answers lists in pages as the API server does."""

    def __init__(self, items: list[dict], page: int) -> None:
        self.items, self.page, self.queries = items, page, []

    def param_serialize(self, method, path, query_params, header_params, body, auth_settings):
        assert body is None  # the informer only reads
        return method, (path, dict(query_params)), header_params, None, None

    def call_api(self, method, url, header_params, body, _request_timeout):
        path, query = url
        self.queries.append(query)
        start = int(query.get("continue", 0))
        end = start + min(int(query["limit"]), self.page)
        meta = {"resourceVersion": "77" if start == 0 else "99"}
        if end < len(self.items):
            meta["continue"] = str(end)
        return _Response({"items": self.items[start:end], "metadata": meta})


def test_a_list_is_read_in_pages_as_it_is_consumed_and_keeps_the_first_pages_version(monkeypatch):
    monkeypatch.setattr(rest_module, "LIST_PAGE", 3)
    monkeypatch.setattr(rest_module, "FIRST_PAGE", 3)
    items = [{"metadata": {"namespace": "ml", "name": f"job-{i}", "resourceVersion": str(i)}} for i in range(7)]
    api = _PagingApi(items, page=3)
    listing = RestSource(api, lambda scope: f"/apis/x/v1/namespaces/{scope}/things", "app=ours").list("ml")
    assert len(api.queries) == 1  # later pages only once the caller reads that far
    assert [i["metadata"]["name"] for i in listing["items"]] == [f"job-{i}" for i in range(7)]
    assert listing["metadata"]["resourceVersion"] == "77"  # the snapshot every page belongs to
    assert [q.get("continue") for q in api.queries] == [None, "3", "6"]
    assert all(q["labelSelector"] == "app=ours" for q in api.queries)


def test_a_field_selector_reads_one_object_by_name_on_every_page():
    """Kueue's Workload CRD is read by name: not every CRD of the cluster (each up to 1.5 MB)."""
    items = [{"metadata": {"name": "workloads.kueue.x-k8s.io", "resourceVersion": "5"}}]
    api = _PagingApi(items, page=3)
    source = RestSource(api, lambda scope: "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", None,
                        "metadata.name=workloads.kueue.x-k8s.io")
    assert [i["metadata"]["name"] for i in source.list(None)["items"]] == ["workloads.kueue.x-k8s.io"]
    assert api.queries and all(q["fieldSelector"] == "metadata.name=workloads.kueue.x-k8s.io" and "labelSelector" not in q
                               for q in api.queries)


def test_list_pages_are_bounded_in_bytes_not_only_in_objects():
    """Issue 34: pages of 500 labelled 1.4 MB pods were parsed whole (464 MB for 100 of them)."""
    big = "x" * (1024 * 1024)
    items = [{"metadata": {"namespace": "ml", "name": f"pod-{i}", "resourceVersion": str(i),
                           "annotations": {"a": big}}} for i in range(120)]
    api = _PagingApi(items, page=500)
    listing = RestSource(api, lambda scope: "/api/v1/pods", "app=ours").list(None)
    assert sum(1 for _ in listing["items"]) == 120
    limits = [int(q["limit"]) for q in api.queries]
    assert limits[0] <= rest_module.FIRST_PAGE
    # after the first page, as many objects as make PAGE_BYTES at their size (1 MB each: 8)
    assert max(limits[1:]) * len(big) <= rest_module.PAGE_BYTES
    small = [{"metadata": {"namespace": "ml", "name": f"p-{i}", "resourceVersion": str(i)}} for i in range(2000)]
    api = _PagingApi(small, page=500)
    assert sum(1 for _ in RestSource(api, lambda scope: "/api/v1/pods", None).list(None)["items"]) == 2000
    assert int(api.queries[1]["limit"]) == rest_module.LIST_PAGE  # small objects: full pages


def test_objects_a_store_does_not_keep_are_dropped_unstored_and_one_that_stops_being_ours_leaves():
    """Pods and NetworkPolicies are selected by a label any tenant can set: only those whose
    controller is a RayCluster (pods) or one of our objects (NetworkPolicies) are stored."""
    def pod(name, owner_kind, rv="1"):
        refs = [{"apiVersion": "ray.io/v1", "kind": owner_kind, "name": "c", "uid": "u", "controller": True}] if owner_kind else []
        return {"metadata": {"namespace": "ml", "name": name, "resourceVersion": rv, "ownerReferences": refs,
                             "labels": {"tputorch.io/job": "demo"}}}
    source = FakeSource()
    source.listing = {"items": [pod("ours", "RayCluster"), pod("bare", None), pod("other", "ReplicaSet")],
                      "metadata": {"resourceVersion": "5"}}
    changes = []
    inf = Informer("pods", source, None, lambda e, o: changes.append((e, key_of(o) if o else None)), stores.slim_pod,
                   keep=stores.keep_pod)
    inf.relist(None)
    assert inf.keys() == {("ml", "ours")}
    assert ("SYNCED", ("ml", "bare")) not in changes  # never even reported
    inf._apply({"type": "ADDED", "object": pod("late", None)})
    assert inf.keys() == {("ml", "ours")}
    inf._apply({"type": "MODIFIED", "object": pod("ours", None, rv="2")})  # its owner removed
    assert inf.keys() == set() and changes[-1] == ("DELETED", ("ml", "ours"))
    policy = {"metadata": {"namespace": "ml", "name": "np", "resourceVersion": "1", "ownerReferences": [
        {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob", "name": "demo", "uid": "u", "controller": True}]}}
    assert stores.keep_extra(policy) and not stores.keep_pod(policy)


def test_an_informer_relists_a_paged_listing_into_its_store():
    inf, changes = informer()
    inf.source.listing = {"items": iter([{"metadata": {"namespace": "ml", "name": "a", "resourceVersion": "1"}},
                                         {"metadata": {"namespace": "ml", "name": "b", "resourceVersion": "2"}}]),
                          "metadata": {"resourceVersion": "5"}}
    assert inf.relist(None) == "5"
    assert inf.keys() == {("ml", "a"), ("ml", "b")}


# --- bounded decode: one deeply nested object must not stop the informer ------------------------

def _nested(depth: int) -> str:
    """A runtimeEnv nested ``depth`` levels, as JSON text (json.dumps itself would recurse)."""
    return '{"a":' * depth + '"leaf \\" ] } \\\\"' + "}" * depth


def _page(*items: str) -> str:
    return '{"metadata":{"resourceVersion":"9"},"items":[' + ",".join(items) + "]}"


def _item(name: str, runtime_env: str = "{}") -> str:
    return ('{"metadata":{"namespace":"ml","name":"%s","resourceVersion":"1"},"spec":{"runtimeEnv":%s}}'
            % (name, runtime_env))


@pytest.mark.parametrize("depth", [1_000, 20_000])
def test_a_page_with_one_object_deeper_than_pythons_decoder_keeps_every_object(depth):
    with pytest.raises(RecursionError):
        json.loads(_page(_item("deep", _nested(depth))))  # what stopped the informer before
    page = rest_module.decode(_page(_item("ok-1"), _item("deep", _nested(depth)), _item("ok-2")))
    assert [i["metadata"]["name"] for i in page["items"]] == ["ok-1", "deep", "ok-2"]
    assert page["items"][0]["spec"] == {"runtimeEnv": {}}
    value, levels = page["items"][1]["spec"]["runtimeEnv"], 0
    while isinstance(value, dict):
        value, levels = value["a"], levels + 1
    # items, the object, spec and runtimeEnv take 4 levels of the page's budget
    assert value == rest_module.TOO_DEEP and levels == rest_module.MAX_DECODE_DEPTH - 4


def test_an_object_within_the_limit_decodes_unchanged_and_bytes_work_too():
    text = _page(_item("a", _nested(50)))
    assert rest_module.decode(text.encode()) == json.loads(text)


def test_an_informer_lists_and_watches_past_a_deep_object():
    api = _PagingApi([], page=rest_module.LIST_PAGE)
    api.call_api = lambda method, url, header_params, body, _request_timeout: _Raw(
        _page(_item("ok"), _item("deep", _nested(5_000))))
    inf, changes = informer(source=RestSource(api, lambda scope: "/things", None))
    assert inf.relist(None) == "9"
    assert inf.keys() == {("ml", "ok"), ("ml", "deep")}
    line = '{"type":"MODIFIED","object":' + _item("deep", _nested(5_000)).replace('"1"', '"2"') + "}"
    api.call_api = lambda method, url, header_params, body, _request_timeout: _Raw(line + "\n", stream=True)
    events = list(RestSource(api, lambda scope: "/things", None).watch(None, "9"))
    assert [e["object"]["metadata"]["name"] for e in events] == ["deep"]


def test_a_silent_watch_ends_like_a_server_timeout_not_like_a_failure():
    from urllib3.exceptions import ProtocolError, ReadTimeoutError

    from tputorch.controller.rest import _silent

    assert _silent(ReadTimeoutError(None, "/w", "Read timed out."))
    assert _silent(ProtocolError("Connection broken: TimeoutError('timed out')"))
    assert not _silent(ProtocolError("Connection broken: ConnectionResetError(104)"))


def test_a_403_in_one_namespace_is_that_namespaces_alone_and_said_once():
    """Per-namespace Roles: pods refused in one watched namespace, allowed in another. The other
    namespace's good lists neither clear nor re-announce the refusal (it was logged and posted on
    every cycle when one flag served every scope)."""
    changes = []
    inf = informer_module.Informer("pods", FakeSource(), ["team-a", "team-b"], lambda e, o: changes.append(e),
                                   lambda o: o)
    for _ in range(3):
        inf._step["team-a"] = "watch"  # listing works, watching does not
        inf._failed("team-a", api_error(403, body='pods is forbidden: cannot watch resource "pods"'))
        inf.relist("team-b")
        inf.relist("team-a")  # the list works: the refusal of the watch stays
    assert changes.count("FORBIDDEN") == 1 and "ALLOWED" not in changes
    step, message = inf.forbidden_in("team-a")
    assert step == "watch" and "cannot watch" in message
    assert inf.forbidden_in("team-b") is None and inf.forbidden == message

    def healthy_watch():
        inf.clock = lambda: 10_000.0  # the watch stayed up past HEALTHY_WATCH
        yield from ()
    inf.clock = lambda: 0.0
    inf._relist_due["team-a"] = 0.0
    inf.source.streams = [healthy_watch()]
    inf.run_scope_once("team-a")
    assert inf.forbidden_in("team-a") is None and changes.count("ALLOWED") == 1


def test_a_cluster_wide_403_covers_every_namespace():
    inf, changes = informer(source=FakeSource())
    inf._failed(None, api_error(403, body="pods is forbidden"))
    assert inf.forbidden_in("anything")[0] == "list"
    inf.relist(None)
    assert inf.forbidden_in("anything") is None and [e for e, _ in changes].count("ALLOWED") == 1


def test_a_parked_key_comes_back_when_the_queue_runs_dry_or_after_its_max_wait():
    async def scenario():
        q = WorkQueue()
        q.add("b")
        q.add_when_idle("a", 60.0)
        q.add_when_idle("a", 0.0)  # parked already: its first max_wait holds
        parked = (len(q), q.busy())
        assert await q.get() == "b"  # the last waiting key taken: "a" is let out
        released = (len(q), q.busy())  # "a" alone waits, and it may not park behind itself
        assert await q.get() == "a"
        q.done("a")
        q.done("b")
        q.add("c")
        q.add_when_idle("d", 0.01)
        await asyncio.sleep(0.05)  # "c" still waits, but "d"'s max_wait is over
        timed_out = list(q._queue)
        q.add_when_idle("e", 60.0)
        q.drop("e")
        return parked, released, timed_out, q._parked
    parked, released, timed_out, left = asyncio.run(scenario())
    assert parked == (1, True) and released == (1, False)
    assert timed_out == ["c", "d"] and left == {}


def test_a_key_parked_on_an_empty_queue_goes_at_once():
    async def scenario():
        q = WorkQueue()
        q.add_when_idle("a", 60.0)
        return list(q._queue), q.busy()
    assert asyncio.run(scenario()) == (["a"], False)
