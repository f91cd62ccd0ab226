"""Our own watch of the operator's RayJobs, in place of a kopf index + event handler on them.

Why not kopf: KubeRay's CRDs may be installed after the operator starts, or removed under it.
kopf stops the whole operator when a watched kind disappears (its watch gets 404 before its CRD
rescan drops the kind), and may never start watching a kind whose CRD appears later (its rescan
runs on the CRD event, when API discovery may not list the kind yet). This watch treats "the
RayJob kind is not served" as a normal state: it retries every few seconds and lists again.

The store maps (namespace, TPUTorchJob name) to the latest RayJob; ``get`` answers like a kopf
index (a list) so the handlers read both alike. Every change is handed to an async callback on the
operator's event loop: ("ADDED" | "MODIFIED" | "DELETED" | "RELISTED", rayjob).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Awaitable, Callable

from kubernetes import watch
from kubernetes.client.rest import ApiException

from . import render

log = logging.getLogger("tputorch")

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
SELECTOR = f"{render.MANAGED_BY_LABEL}={render.MANAGED_BY}"
NOT_SERVED_RETRY = 5.0


def _slim(obj: dict) -> dict:
    """What the operator reads of a RayJob: metadata without managedFields, spec, status."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {"metadata": meta, "spec": obj.get("spec") or {}, "status": obj.get("status") or {}}


def _version(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def key_of(obj: dict) -> tuple[str, str | None]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace"), (meta.get("labels") or {}).get(render.JOB_LABEL)


class RayJobWatch:
    def __init__(self, custom_api, namespaces: list[str] | None,
                 callback: Callable[[str, dict], Awaitable[None]], loop: asyncio.AbstractEventLoop) -> None:
        self.api = custom_api
        # Exact names get a namespaced watch (works with per-namespace Roles); no names or a glob
        # pattern need a cluster-wide watch, filtered here.
        names = namespaces or []
        self.scopes: list[str | None] = names if names and not any(c in n for n in names for c in "*?[!") else [None]
        self.patterns = names
        self.callback = callback
        self.loop = loop
        self.store: dict[tuple[str, str], dict] = {}
        self.served: bool | None = None  # unknown until the first list
        self.listed = threading.Event()
        self._stop = threading.Event()
        self._listed_scopes: set = set()
        self.queue: asyncio.Queue = asyncio.Queue()

    # an index-like read for the handlers
    def get(self, key):
        obj = self.store.get(key)
        return [obj] if obj is not None else None

    def remember(self, obj: dict) -> None:
        """A RayJob this operator just created: known at once, before its watch event arrives, so
        that the next event of its TPUTorchJob does not try to create it again."""
        self.store.setdefault(key_of(obj), _slim(obj))

    def start(self) -> None:
        for scope in self.scopes:
            threading.Thread(target=self._run, args=(scope,), name=f"rayjob-watch-{scope or 'all'}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _wanted(self, obj: dict) -> bool:
        ns, job = key_of(obj)
        if job is None:
            return False
        if self.scopes != [None] or not self.patterns:
            return True
        import fnmatch
        return any(fnmatch.fnmatchcase(ns or "", p) for p in self.patterns)

    def _emit(self, kind: str, obj: dict) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, obj))

    async def dispatch(self) -> None:
        """Run the callback for each change as a task on the operator's event loop."""
        tasks: set[asyncio.Task] = set()
        while True:
            kind, obj = await self.queue.get()
            task = asyncio.create_task(self.callback(kind, obj))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(_log_failure)

    def _list(self, scope):
        if scope is None:
            return self.api.list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector=SELECTOR, _request_timeout=60)
        return self.api.list_namespaced_custom_object(GROUP, VERSION, scope, PLURAL, label_selector=SELECTOR, _request_timeout=60)

    def _stream(self, scope, rv):
        args = (GROUP, VERSION, PLURAL) if scope is None else (GROUP, VERSION, scope, PLURAL)
        fn = self.api.list_cluster_custom_object if scope is None else self.api.list_namespaced_custom_object
        return watch.Watch().stream(fn, *args, label_selector=SELECTOR, resource_version=rv, timeout_seconds=300,
                                    allow_watch_bookmarks=True, _request_timeout=330)

    def _relist(self, scope) -> str:
        listing = self._list(scope)
        fresh = {key_of(o): _slim(o) for o in listing.get("items") or [] if self._wanted(o)}
        gone = [k for k in list(self.store) if (scope is None or k[0] == scope) and k not in fresh]
        for k, obj in fresh.items():
            self.store[k] = obj
        for k in gone:
            self._emit("DELETED", self.store.pop(k))
        for obj in fresh.values():  # level-based: whatever was missed while not watching
            self._emit("RELISTED", obj)
        if self.served is not True:
            log.info("RayJob kind served: watching RayJobs %s", f"in {scope}" if scope else "cluster-wide")
            if self.served is False:  # KubeRay's CRDs came (back): jobs without a RayJob can get one now
                self._emit("SERVED", {})
        self.served = True
        self._listed_scopes.add(scope)
        if self._listed_scopes >= set(self.scopes):
            self.listed.set()
        return listing["metadata"]["resourceVersion"]

    def _run(self, scope) -> None:
        while not self._stop.is_set():
            try:
                rv = self._relist(scope)
                while not self._stop.is_set():  # watch on from rv; a server timeout just resumes
                    for event in self._stream(scope, rv):
                        obj = _slim(event["object"])
                        rv = _version(obj) or rv
                        if event["type"] == "ERROR":  # e.g. 410 Gone inside the stream: list again
                            rv = self._relist(scope)
                            break
                        if event["type"] == "BOOKMARK" or not self._wanted(obj):
                            continue
                        k = key_of(obj)
                        if event["type"] == "DELETED":
                            self.store.pop(k, None)
                        elif k in self.store and _version(self.store[k]) == _version(obj):
                            continue  # known already: the echo of our own create (remember)
                        else:
                            self.store[k] = obj
                        self._emit(event["type"], obj)
            except ApiException as err:
                if err.status == 404:
                    if self.served is not False:
                        log.warning("the RayJob kind (ray.io/v1) is not served: KubeRay's CRDs are missing; "
                                    "retrying every %.0fs", NOT_SERVED_RETRY)
                    self.served = False
                    self._listed_scopes.add(scope)
                    if self._listed_scopes >= set(self.scopes):
                        self.listed.set()
                    self._forget(scope)
                    self._stop.wait(NOT_SERVED_RETRY)
                elif err.status == 410:
                    continue  # resourceVersion too old: list again
                else:
                    log.warning("RayJob watch: HTTP %s %s; retrying", err.status, err.reason)
                    self._stop.wait(2)
            except Exception as err:  # connection refused/reset while the API server restarts
                log.warning("RayJob watch interrupted (%s); retrying", type(err).__name__)
                self._stop.wait(2)

    def _forget(self, scope) -> None:
        """The kind is gone, and every RayJob with it (deleting a CRD deletes its objects)."""
        for k in [k for k in list(self.store) if scope is None or k[0] == scope]:
            self._emit("DELETED", self.store.pop(k))

    def wait_listed(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.listed.wait(0.1):
                return True
        return False


def _log_failure(fut) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("handling a RayJob change failed: %r", fut.exception())
