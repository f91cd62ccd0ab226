"""List + watch of one resource into an in-memory store, one thread per scope (the kubernetes
client is blocking). Used for every kind the operator reads: its own kinds, KubeRay's children
and the Ray pods. What it reads through is a ``Source``: rest.py's over the API, a fake in tests.

Why not kopf's watches and indexes: kopf never drops from an index an object that vanished while
it was not watching (its re-list only yields what exists), it stops the operator when a watched
kind's CRD disappears, and each event costs its per-object machinery. Here:
- a re-list replaces the store and reports every vanished object as DELETED (the sweep);
- a kind that is not served (404: KubeRay's CRDs missing) is a normal state, re-listed with backoff,
  and reported once when it becomes served; a kind that was served must stay unserved for
  NOT_SERVED_AFTER before its store is emptied (an API server whose CRD handlers are not ready yet
  answers 404 for a moment);
- a 403 is logged once per streak and scope, and exposed as ``forbidden_in(namespace)`` for the
  status of that namespace's objects to show;
- failures back off as client-go's reflector: 0.8 s doubling to 30 s with jitter, reset only after
  a watch that stayed up for HEALTHY_WATCH (a list that works while the watch fails is no recovery);
- the store is written by the scope threads only (what the operator just created is kept apart,
  by the controller); a full re-list every RELIST_PERIOD (jittered) bounds the life of anything a
  missed event left behind;
- an object is stored slimmed to what the operator reads.

Changes reach the operator's event loop through ``on_change(event, obj)`` with event one of
ADDED, MODIFIED, DELETED, SYNCED (an object seen by a re-list), LISTED (a scope was (re)listed;
obj is {}), SERVED (the kind became served; obj is {}), FORBIDDEN / ALLOWED (a scope's list or
watch was refused / works again; obj is {}).
"""

from __future__ import annotations

import fnmatch
import logging
import random
import threading
import time
from typing import Callable, Hashable, Iterable, Protocol

from kubernetes.client.rest import ApiException

from .workqueue import Backoff

log = logging.getLogger("tputorch")

Key = tuple[str, str]  # (namespace, name)

BACKOFF_BASE, BACKOFF_CAP = 0.8, 30.0  # client-go's reflector
HEALTHY_WATCH = 30.0  # a watch up this long resets the backoff
RELIST_PERIOD = 900.0  # a full re-list at least this often (+ up to half of it, jittered)
NOT_SERVED_AFTER = 30.0  # a served kind answering 404 this long is taken as gone


class Source(Protocol):
    """How an informer reads one resource; the real one wraps the kubernetes client, tests fake it."""

    def list(self, scope: str | None) -> dict: ...  # {"items": iterable, "metadata": {"resourceVersion": rv}}

    def watch(self, scope: str | None, resource_version: str) -> Iterable[dict]: ...  # {"type", "object"}


def key_of(obj: dict) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def version_of(obj: dict | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def scopes_for(namespaces: list[str] | None) -> list[str | None]:
    """Exact names get a namespaced list/watch each (works with per-namespace Roles); no names or a
    glob pattern need one cluster-wide list/watch, filtered here."""
    names = namespaces or []
    return names if names and not any(c in n for n in names for c in "*?[!") else [None]


class Informer:
    def __init__(self, what: str, source: Source, namespaces: list[str] | None,
                 on_change: Callable[[str, dict], None], slim: Callable[[dict], dict],
                 index: Callable[[dict], Hashable | None] | None = None,
                 backoff: Backoff | None = None, clock: Callable[[], float] = time.monotonic,
                 keep: Callable[[dict], bool] | None = None) -> None:
        self.what = what  # for logs: "RayJobs", "pods", ...
        # Whether an object is ours to keep (its controller ownerReference): what a label anyone may
        # set selects costs nothing beyond discarding it. None: every object.
        self.keep = keep
        self.source = source
        self.scopes = scopes_for(namespaces)
        self.patterns = (namespaces or []) if self.scopes == [None] else []
        self.on_change = on_change
        self.slim = slim
        self.index_of = index
        self.store: dict[Key, dict] = {}
        self.by_index: dict[Hashable, set[Key]] = {}
        self.served: bool | None = None  # unknown until the first list
        self.synced = threading.Event()
        self._listed: set = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the store is written by the scope threads, read on the loop
        self._step: dict = {}  # scope -> "list" or "watch": what its thread is doing
        self._watch_began: dict = {}  # scope -> clock() when its current watch began
        self._backoff = backoff or Backoff(base=BACKOFF_BASE, cap=BACKOFF_CAP, jitter=0.5)
        self.clock = clock
        # Why the last list failed (None once one succeeded): a store that cannot sync says why in
        # readiness, the metrics and the log (a Kueue conversion webhook left behind answers 500).
        self.list_error: str | None = None
        self.relists = 0  # lists made (metrics)
        self.watch_restarts = 0  # watches that ended before a re-list was due (metrics)
        # scope -> ("list" or "watch": which one is refused, the API's message); per scope, as a
        # per-namespace Role may refuse one namespace and allow the others
        self._forbidden: dict = {}
        self._not_found_since: dict = {}  # scope -> clock() of the first 404 of a streak
        self._relist_due: dict = {}  # scope -> clock() by which the next full list is made

    # --- reads (any thread) ----------------------------------------------------------------------

    @property
    def forbidden(self) -> str | None:
        """The API's message while listing or watching is refused (in any scope)."""
        refused = list(self._forbidden.values())
        return refused[0][1] if refused else None

    def forbidden_in(self, namespace: str) -> tuple[str, str] | None:
        """("list" or "watch", the API's message) while the operator may not do that where the
        objects of ``namespace`` are read (its own scope, or the cluster-wide one)."""
        return self._forbidden.get(namespace if namespace in self.scopes else None)

    def get(self, key: Key) -> dict | None:
        return self.store.get(key)

    def indexed(self, value: Hashable) -> list[dict]:
        with self._lock:
            return [self.store[k] for k in self.by_index.get(value, ()) if k in self.store]

    def keys(self) -> set[Key]:
        with self._lock:
            return set(self.store)

    def values(self) -> list[dict]:
        with self._lock:
            return list(self.store.values())

    # --- writes ----------------------------------------------------------------------------------

    def remember(self, obj: dict) -> None:
        """Seed the store (tests). The controller never writes here: the scope threads are the one
        writer, and what the operator just created is kept apart (child.py's expectations)."""
        self._put(self.slim(obj), keep_newer=True)

    def _put(self, obj: dict, keep_newer: bool = False) -> bool:
        """Store ``obj``; False when it is the very version already stored (our own echo)."""
        key = key_of(obj)
        with self._lock:
            old = self.store.get(key)
            if old is not None and version_of(old) == version_of(obj):
                return False
            if keep_newer and old is not None:
                return False  # the watch already brought this object (or a newer version of it)
            self.store[key] = obj
            self._reindex(key, old, obj)
        return True

    def reslim(self, key: Key, version: str | None) -> None:
        """Slim the stored object again, if it is still that version: what the slim keeps may shrink
        once the controller knows more of it (a refused spec). Never changes the version stored."""
        with self._lock:
            old = self.store.get(key)
            if old is not None and version_of(old) == version:
                self.store[key] = self.slim(old)

    def _pop(self, key: Key) -> dict | None:
        with self._lock:
            old = self.store.pop(key, None)
            if old is not None:
                self._reindex(key, old, None)
        return old

    def _reindex(self, key: Key, old: dict | None, new: dict | None) -> None:
        if self.index_of is None:
            return
        before = self.index_of(old) if old is not None else None
        after = self.index_of(new) if new is not None else None
        if before == after:
            return
        if before is not None:
            keys = self.by_index.get(before)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_index[before]
        if after is not None:
            self.by_index.setdefault(after, set()).add(key)

    def _wanted(self, obj: dict) -> bool:
        """In the namespaces asked for: matching a pattern (none: any), and no ``!pattern`` (kopf's
        exclusions)."""
        if not self.patterns:
            return True
        ns = key_of(obj)[0]
        included = [p for p in self.patterns if not p.startswith("!")]
        if included and not any(fnmatch.fnmatchcase(ns, p) for p in included):
            return False
        return not any(fnmatch.fnmatchcase(ns, p[1:]) for p in self.patterns if p.startswith("!"))

    # --- the scope threads -----------------------------------------------------------------------

    def start(self) -> None:
        for scope in self.scopes:
            threading.Thread(target=self._run, args=(scope,), name=f"watch-{self.what}-{scope or 'all'}",
                             daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _mark_listed(self, scope) -> None:
        self._listed.add(scope)
        if self._listed >= set(self.scopes):
            self.synced.set()

    def relist(self, scope) -> str:
        self.relists += 1
        listing = self.source.list(scope)
        self._not_found_since.pop(scope, None)
        self.list_error = None
        self._relist_due[scope] = self.clock() + RELIST_PERIOD * (1 + 0.5 * random.random())
        fresh = {}
        for item in listing.get("items") or []:
            if self._wanted(item) and (self.keep is None or self.keep(item)):
                obj = self.slim(item)
                fresh[key_of(obj)] = obj
        in_scope = [k for k in self.keys() if scope is None or k[0] == scope]
        for key in in_scope:
            if key not in fresh:
                gone = self._pop(key)
                if gone is not None:
                    self.on_change("DELETED", gone)
        for obj in fresh.values():
            self._put(obj)
            self.on_change("SYNCED", obj)  # level-based: whatever was missed while not watching
        if self.served is not True:
            log.info("%s served: watching %s", self.what, f"in {scope}" if scope else "cluster-wide")
            if self.served is False:
                self.on_change("SERVED", {})
        self.served = True
        if self._forbidden.get(scope, ("",))[0] == "list":
            self._allowed_again(scope)
        self._mark_listed(scope)
        self.on_change("LISTED", {})
        return (listing.get("metadata") or {}).get("resourceVersion") or ""

    def _apply(self, event: dict) -> str | None:
        """One watch event into the store; returns its resourceVersion. Raises _Relist on ERROR."""
        etype, raw = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            raise _Relist(raw.get("code") if isinstance(raw, dict) else None)
        if etype == "BOOKMARK":
            return version_of(raw)
        if not self._wanted(raw):
            return version_of(raw)
        if self.keep is not None and not self.keep(raw):  # not (or no longer) ours: never stored
            gone = self._pop(key_of(raw)) if etype != "DELETED" else None
            if gone is not None:
                self.on_change("DELETED", gone)
            return version_of(raw)
        obj = self.slim(raw)
        if etype == "DELETED":
            self._pop(key_of(obj))
            self.on_change("DELETED", obj)
        elif self._put(obj):
            self.on_change(etype, obj)
        return version_of(obj)

    def _allowed_again(self, scope) -> None:
        step, _ = self._forbidden.pop(scope)
        log.info("%s: %s allowed again%s", self.what, "listing" if step == "list" else "watching",
                 f" in {scope}" if scope else "")
        self.on_change("ALLOWED", {})

    def run_scope_once(self, scope) -> None:
        """List, then watch until the stream fails or a full re-list is due; every failure returns
        to the caller (tests drive this directly; the thread loops over it through cycle())."""
        self._step[scope] = "list"
        rv = self.relist(scope)
        self._step[scope] = "watch"
        while not self._stop.is_set():  # a server-side timeout just resumes from rv
            started = self._watch_began[scope] = self.clock()
            for event in self.source.watch(scope, rv):
                rv = self._apply(event) or rv
                if self._stop.is_set():
                    return
            if self._watch_ended(scope, started):
                return  # a full re-list is due
            if self.clock() - started < HEALTHY_WATCH:
                # a stream cut short without an error (a proxy): back off before watching again
                self._stop.wait(self._backoff.next(scope))

    def _watch_ended(self, scope, started: float) -> bool:
        """Book-keeping after a watch ended (cleanly or not); whether a full re-list is due."""
        self.watch_restarts += 1
        if self.clock() - started >= HEALTHY_WATCH:
            self._backoff.forget(scope)
            if self._forbidden.get(scope, ("",))[0] == "watch":
                self._allowed_again(scope)
        return self.clock() >= self._relist_due.get(scope, 0.0)

    def cycle(self, scope) -> float | None:
        """One list + watch; the delay before the next (None: at once)."""
        self._step[scope] = "list"
        try:
            self.run_scope_once(scope)
            return None  # a re-list was due
        except _Relist as err:
            self._after_watch_failed(scope)
            if err.code == 410:  # the resourceVersion expired; list again at once
                return None
            return self._backoff.next(scope)
        except ApiException as err:
            self._after_watch_failed(scope)
            return self._failed(scope, err)
        except Exception as err:  # connection refused/reset, timeouts: the API server restarting
            if self._step[scope] == "list":
                self.list_error = f"{type(err).__name__}: {str(err)[:200]}"
                self._not_found_since.pop(scope, None)  # no answer: a 404 after it starts a new streak
            self._after_watch_failed(scope)
            delay = self._backoff.next(scope)
            log.warning("%s %s interrupted (%s: %s); re-listing in %.1fs", self.what, self._step[scope],
                        type(err).__name__, str(err)[:200], delay)
            return delay

    def _after_watch_failed(self, scope) -> None:
        if self._step.get(scope) == "watch":
            self._watch_ended(scope, self._watch_began.get(scope, self.clock()))

    def _run(self, scope) -> None:
        while not self._stop.is_set():
            delay = self.cycle(scope)
            if delay:
                self._stop.wait(delay)

    def _failed(self, scope, err: ApiException) -> float | None:
        if err.status == 410:
            return None
        delay = self._backoff.next(scope)
        if err.status == 404:
            first = self._not_found_since.setdefault(scope, self.clock())
            if self.served is None or (self.served is True and self.clock() - first >= NOT_SERVED_AFTER):
                log.warning("the %s kind is not served (its CRD is missing); re-listing with backoff", self.what)
                self.served = False
                # Deleting a CRD deletes its objects: nothing of this kind exists any more.
                for key in [k for k in self.keys() if scope is None or k[0] == scope]:
                    gone = self._pop(key)
                    if gone is not None:
                        self.on_change("DELETED", gone)
            elif self.served is True:
                log.info("%s: HTTP 404 (not served yet?); keeping the store, re-listing in %.1fs", self.what, delay)
            self._mark_listed(scope)
        elif err.status == 403:
            if scope not in self._forbidden:
                step = self._step.get(scope, "list")
                self._forbidden[scope] = (step, f"{err.reason}: {(err.body or '')[:300]}")
                log.error("the operator may not %s %s%s: %s; fix its RBAC (re-listing with backoff)", step,
                          self.what, f" in {scope}" if scope else "", self._forbidden[scope][1])
                self.on_change("FORBIDDEN", {})
            self._mark_listed(scope)
        else:
            if self._step.get(scope, "list") == "list":
                self.list_error = f"HTTP {err.status} {err.reason}"
            log.warning("%s %s: HTTP %s %s; re-listing in %.1fs", self.what, self._step.get(scope, "list"),
                        err.status, err.reason, delay)
        return delay

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)


class _Relist(Exception):
    def __init__(self, code) -> None:
        super().__init__(f"watch error {code}")
        self.code = code
