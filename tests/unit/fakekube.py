"""A fake of the operator's API adapter (tputorch.kube.Kube) and of an informer's Source, so that
the reconcile's decisions and the informer's list/watch handling are tested without a cluster.

FakeKube keeps children in a dict like the API server would (resourceVersion, 409 on a second
create), records every call, and raises the exceptions queued in ``fail[method]`` first."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict
from typing import Callable

from kubernetes.client.rest import ApiException

from tputorch.api import crd
from tputorch.controller import kinds, stores
from tputorch.controller.informer import Informer
from tputorch.controller.reconcile import Controller

_rv = itertools.count(100)


def api_error(status: int, reason: str = "", body: str = "") -> ApiException:
    return ApiException(status=status, reason=reason or {404: "Not Found", 409: "Conflict", 403: "Forbidden",
                                                          500: "Internal Server Error"}.get(status, "Error"), body=body)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple, dict] = {}  # (plural, namespace, name) -> object
        self.calls: list[tuple] = []
        self.fail: dict[str, list[Exception]] = defaultdict(list)
        self.status_uids: list = []  # the uid precondition of each status patch
        # plural -> what the API server's structural schema drops from a created object of it (an
        # older CRD): called on the stored copy, which the create returns
        self.prune: dict[str, Callable[[dict], None]] = {}

    def _maybe_fail(self, method: str) -> None:
        if self.fail[method]:
            raise self.fail[method].pop(0)

    async def create(self, res, namespace, body):
        self.calls.append(("create", res.plural, namespace, body["metadata"]["name"]))
        self._maybe_fail("create")
        key = (res.plural, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise api_error(409)
        obj = {**body, "metadata": {**body["metadata"], "uid": f"uid-{next(_rv)}", "resourceVersion": str(next(_rv))}}
        if res.plural in self.prune:
            obj = copy.deepcopy(obj)
            self.prune[res.plural](obj)
        self.objects[key] = obj
        return obj

    async def create_secret(self, namespace, body):
        self.calls.append(("create", "secrets", namespace, body["metadata"]["name"]))
        self._maybe_fail("create_secret")
        key = ("secrets", namespace, body["metadata"]["name"])
        if key in self.objects:
            raise api_error(409)
        self.objects[key] = body

    async def read_crd(self, name):
        """A CRD by name from objects[("customresourcedefinitions", "", name)]; ours are this
        release's unless a test put others there."""
        self.calls.append(("get", "customresourcedefinitions", "", name))
        self._maybe_fail("read_crd")
        if ("customresourcedefinitions", "", name) in self.objects:
            return self.objects[("customresourcedefinitions", "", name)]
        return crd.BUILDERS[crd.NAMES[name]]() if name in crd.NAMES else None

    async def get(self, res, namespace, name):
        self.calls.append(("get", res.plural, namespace, name))
        self._maybe_fail("get")
        try:
            return self.objects[(res.plural, namespace, name)]
        except KeyError:
            raise api_error(404) from None

    async def patch(self, res, namespace, name, patch):
        self.calls.append(("patch", res.plural, namespace, name, patch))
        self._maybe_fail("patch")

    async def delete(self, res, namespace, name, uid):
        self.calls.append(("delete", res.plural, namespace, name, uid))
        self._maybe_fail("delete")
        obj = self.objects.get((res.plural, namespace, name))
        if obj is None:
            raise api_error(404)
        if uid and obj["metadata"].get("uid") != uid:
            raise api_error(409)
        del self.objects[(res.plural, namespace, name)]

    async def patch_status(self, res, namespace, name, status, uid=None):
        self.calls.append(("patch_status", res.plural, namespace, name, status))
        self.status_uids.append(uid)
        self._maybe_fail("patch_status")

    async def post_event(self, regarding, event):
        self.calls.append(("event", regarding["name"], event.reason))

    def called(self, method: str) -> list[tuple]:
        return [c for c in self.calls if c[0] == method]


class FakeSource:
    """Answers an informer's list with ``listing`` and its watch with the next queued stream (a list
    of events, or an exception to raise)."""

    def __init__(self) -> None:
        self.listing: dict = {"items": [], "metadata": {"resourceVersion": "1"}}
        self.list_error: list[Exception] = []
        self.streams: list = []
        self.lists = 0
        self.watched_from: list[str] = []

    def list(self, scope):
        self.lists += 1
        if self.list_error:
            raise self.list_error.pop(0)
        return self.listing

    def watch(self, scope, resource_version):
        self.watched_from.append(resource_version)
        stream = self.streams.pop(0) if self.streams else StopWatching()
        if isinstance(stream, Exception):
            raise stream
        return iter(stream)


class StopWatching(Exception):
    """Ends a test's informer loop (as a dropped connection would)."""


def informer(what="things", source=None, slim=stores.slim_object, index=None):
    changes: list[tuple[str, dict]] = []
    inf = Informer(what, source or FakeSource(), None, lambda e, o: changes.append((e, o)), slim, index=index)
    return inf, changes


def controller(kube: FakeKube | None = None, clock=lambda: "2026-11-30T00:00:00Z", extras=(), **options) -> Controller:
    """A controller on a FakeKube and fake sources; ``options`` go to Controller (status_interval,
    monotonic); ``extras`` get a fake informer each."""
    noop = lambda *_: None  # noqa: E731
    ctl = Controller(kinds.KINDS, kube or FakeKube(), {}, {}, None, clock=clock, extras=extras, **options)
    for extra in ctl.extras.extras:
        ctl.extra_stores[extra.resource.plural] = Informer(extra.resource.plural, FakeSource(), None, noop, stores.slim_extra)
    for kind in kinds.KINDS:
        name = kind.resource.kind
        ctl.parents[name] = Informer(kind.resource.plural, FakeSource(), None, noop, stores.slim_object)
        ctl.children[name] = Informer(kind.child.plural, FakeSource(), None, noop, kind.slim_child)
    ctl.pods = Informer("pods", FakeSource(), None, noop, stores.slim_pod, index=stores.pod_index)
    return ctl
