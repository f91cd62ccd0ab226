"""One reconcile machinery for every kind of this operator (TPUTorchJob -> RayJob,
TPUTorchService -> RayService): a kind brings only its parse, render, status derivation and the
patch a live child takes (``Kind``).

Every source of work (the object's events, its child's, its pods', retries, a child kind becoming
served) adds the object's key to one work queue; one worker handles a key at a time and every
decision is made there, from what the stores hold now (level-based). In memory: parsed specs and
the status written but not yet seen back, both rebuilt from the API after a restart and dropped
when the object is gone (and swept after every re-list).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from kubernetes.client.rest import ApiException

from .. import render, status as statuses
from ..status import kueue, progress as training
from .dashboard import DashboardError
from .raytoken import RayTokens
from .events import EventRecorder
from .informer import Informer, key_of
from .kube import CALLS, Calls
from ..render import MANAGED_BY_LABEL
from .metrics import METRICS
from ..api.spec import InvalidSpec
from .kind import (  # noqa: F401 (what kinds.py and the tests import from here)
    RAYCLUSTER, REFUSED, WORKLOAD, WORKLOAD_PRIORITY_CLASS, Extra, Key, Kind, api_message, controller_of, create_problem,
    describe, now, owner_reference, ownership, waiting_problem)
from .specs import Specs, version
from .stores import Stores
from .writes import STATUS_INTERVAL, StatusWrites  # noqa: F401 (handlers import it from here)
from ..status.job import ATTEMPT_LABEL
from .workqueue import Backoff, WorkQueue

log = logging.getLogger("tputorch")

# A reconcile that takes longer is abandoned and retried with backoff: one object's stuck call must
# not keep it from ever being reconciled again (a key is never handed to a second worker).
RECONCILE_TIMEOUT = 120
MAX_DELETED_PODS = 64  # per object: the pods of its current attempt's slice seen deleted
# A child this operator created (or found to be its own after a 409) counts as existing until its
# watch event arrives, at most this long (client-go's expectations); the store itself is written by
# the informer alone, so a watch that never brings the child (it lost our label) cannot freeze it.
EXPECT_FOR = 120.0
TOMBSTONES_KEPT = 1000  # uids of children whose deletion was seen, so that no expectation revives one


def _store(name: str) -> property:
    """An informer the steps read, kept in ``Controller.stores`` (the handlers set them after)."""
    return property(lambda self: getattr(self.stores, name), lambda self, value: setattr(self.stores, name, value))


class Controller:
    parents, children, pods = _store("parents"), _store("children"), _store("pods")
    workloads, priority_classes, extra_stores = _store("workloads"), _store("priority_classes"), _store("extras")

    def __init__(self, kinds: list[Kind], kube, parents: dict[str, Informer], children: dict[str, Informer],
                 pods: Informer, clock: Callable[[], str] = now, status_interval: float = STATUS_INTERVAL,
                 monotonic: Callable[[], float] = time.monotonic, workloads: Informer | None = None,
                 priority_classes: Informer | None = None, extras: list[Extra] = (), dashboard=None,
                 progress_interval: float = training.READ_INTERVAL, ray_tokens: RayTokens | None = None) -> None:
        self.kinds = {k.resource.kind: k for k in kinds}
        self.kube = kube
        self.stores = Stores(parents, children, pods, workloads, priority_classes)
        self.extras = list(extras)
        # (plural, namespace, name) -> when this process created it: not again before its watch event
        self.extras_made: dict[tuple[str, str, str], float] = {}
        self.clock = clock
        self.monotonic = monotonic
        # jitter: objects that failed together (an outage) do not all retry in the same second
        self.queue = WorkQueue(Backoff(jitter=0.1), metrics=METRICS)
        # Events wait while any object waits for a reconcile (events.py).
        self.recorder = EventRecorder(kube.post_event, busy=lambda: len(self.queue) > 0, monotonic=monotonic)
        self.specs = Specs()
        self.writes = StatusWrites(kube, self.recorder, lambda key, delay: self.queue.add_after(key, delay),
                                   status_interval, monotonic)
        self.problems: dict[Key, tuple[str, str]] = {}  # why a child could not be created
        self.extra_problems: dict[Key, tuple[str, str]] = {}  # why an extra child could not be written
        self.deleted_pods: dict[Key, list[dict]] = {}  # pods seen deleted (status/attempts.py reads them)
        self.uids: dict[Key, str] = {}  # key -> uid, to drop its state when the object is gone
        self.expected: dict[Key, tuple[dict, float]] = {}  # key -> (child just created, monotonic time)
        self.tombstones: dict[str, None] = {}  # uids of deleted children, oldest first
        self.active = True  # False on a standby until it leads: nothing is queued
        # Training progress, read from the Ray dashboard (dashboard.py) off the reconcile workers:
        # None (or an interval <= 0) reads nothing.
        self.dashboard = dashboard if progress_interval > 0 else None
        self.progress_interval = progress_interval
        self.ray_tokens = ray_tokens or RayTokens.from_file(None)
        # key -> uid of the child whose token Secret this process made or found there (409)
        self.tokens_made: dict[Key, str] = {}
        self.progress_read: dict[str, float] = {}  # uid -> when its driver log was last read (monotonic)
        self.reports: dict[str, training.Report] = {}  # uid -> the newest report read, until it is written
        self.reading: dict[str, asyncio.Task] = {}  # uid -> its read in flight (one per object)
        self.read_failures: dict[str, str] = {}  # uid -> the last failure logged (logged again when it changes)
        # key -> {RayCluster name: the spec version it was read or patched to hold}
        self.cluster_bounds: dict[Key, dict[str, tuple]] = {}

    # --- sources of work (called on the event loop) ----------------------------------------------

    def enqueue(self, key: Key) -> None:
        """A key to reconcile; a standby queues nothing (its queue would keep every key it ever
        saw): it queues every object once, when it starts to lead (``activate``)."""
        if self.active:
            self.queue.add(key)

    def activate(self) -> None:
        """Start queueing: every object is reconciled once, then on its changes."""
        self.active = True
        for kind, informer in self.parents.items():
            for key in informer.keys():
                self.queue.add((kind, *key))

    def parent_changed(self, kind: str, event: str, obj: dict) -> None:
        if event == "LISTED":
            self.sweep()
        elif event == "DELETED" and obj:
            self.deleted_pods.pop((kind, *key_of(obj)), None)  # at once: a standby reconciles nothing
            self.enqueue((kind, *key_of(obj)))
        elif obj:
            self.enqueue((kind, *key_of(obj)))

    def child_changed(self, kind: str, event: str, obj: dict) -> None:
        if event in ("SERVED", "FORBIDDEN", "ALLOWED"):  # every object of the kind may now read differently
            for key in self.parents[kind].keys():
                self.enqueue((kind, *key))
        elif obj:  # the child's name is the object's
            key = (kind, *key_of(obj))
            self.child_seen(key, event, obj)
            self.enqueue(key)

    def child_seen(self, key: Key, event: str, obj: dict) -> None:
        """The watch brought this child: what was expected of it is known now (or is gone)."""
        uid = (obj.get("metadata") or {}).get("uid")
        expected = self.expected.get(key)
        if expected is not None and (expected[0].get("metadata") or {}).get("uid") == uid:
            del self.expected[key]
        if event == "DELETED" and uid:
            self.tombstones[uid] = None
            while len(self.tombstones) > TOMBSTONES_KEPT:
                del self.tombstones[next(iter(self.tombstones))]

    def expect(self, key: Key, child: dict) -> None:
        uid = (child.get("metadata") or {}).get("uid")
        if uid and uid not in self.tombstones:  # its deletion may have been seen before its creation returned
            self.expected[key] = (self.children[key[0]].slim(child), time.monotonic())

    def child_of(self, key: Key, parent: dict) -> dict | None:
        """The child as the store holds it, else the one just created for this very object while
        its watch event has not arrived."""
        child = self.children[key[0]].get(key[1:])
        if child is not None:
            return child
        expected = self.expected.get(key)
        if expected is None:
            return None
        owner = controller_of(expected[0]) or {}
        if time.monotonic() - expected[1] > EXPECT_FOR or owner.get("uid") != parent["metadata"].get("uid"):
            del self.expected[key]
            return None
        return expected[0]

    def pod_changed(self, event: str, obj: dict) -> None:
        if event in ("FORBIDDEN", "ALLOWED"):  # the pods of a namespace cannot / can be read again
            for kind in self.kinds.values():
                parents = self.parents.get(kind.resource.kind)
                for key in parents.keys() if parents is not None else ():
                    self.enqueue((kind.resource.kind, *key))
            return
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for kind in self.kinds.values():
            if kind.label in labels:
                key = (kind.resource.kind, key_of(obj)[0], labels[kind.label])
                if event == "DELETED" and kind.attempt is not None and self._may_lose_hosts(key):
                    # A pod that vanished is no longer in any store: what the reconcile needs to
                    # tell a lost host from a healthy slice is kept here until it has looked.
                    gone = self.deleted_pods.setdefault(key, [])
                    gone[:] = gone[-(MAX_DELETED_PODS - 1):] + [obj]
                self.enqueue(key)

    def _may_lose_hosts(self, key: Key) -> bool:
        """Whether a deleted pod can still matter to this object: it exists and has not finished
        (a finished or deleted job's pods all go; keeping them cost 62 MB per 1,000 jobs)."""
        parent = self.parents[key[0]].get(key[1:])
        return parent is not None and not self.kinds[key[0]].finished(parent.get("status") or {}) \
            and parent["metadata"].get("uid") not in self.writes.terminal

    def workload_changed(self, event: str, obj: dict) -> None:
        if event in ("SERVED", "FORBIDDEN", "ALLOWED"):  # Kueue installed, refused or granted: every queued object reads anew
            self._queued_objects(lambda spec: True)
            return
        owner = kueue.owner_of(obj) if obj else None
        for kind in self.kinds.values():
            if owner is not None and owner[0] == kind.child.kind:
                self.enqueue((kind.resource.kind, key_of(obj)[0], owner[1]))

    def priority_class_changed(self, event: str, obj: dict) -> None:
        name = key_of(obj)[1] if obj else None
        self._queued_objects(lambda spec: name is None or spec.get("priorityClassName") == name)

    def _queued_objects(self, which: Callable[[dict], bool]) -> None:
        for kind, informer in self.parents.items():
            for obj in informer.values():
                spec = obj.get("spec") or {}
                if spec.get("queueName") and which(spec):
                    self.enqueue((kind, *key_of(obj)))

    def sweep(self) -> None:
        """Drop what is kept for objects that no longer exist (a deletion missed while not watching)."""
        existing = {(kind, *k) for kind, informer in self.parents.items() for k in informer.keys()}
        for key in (set(self.uids) | set(self.problems) | set(self.deleted_pods) | self.queue.known()) - existing:
            self.forget(key)

    def forget(self, key: Key) -> None:
        uid = self.uids.pop(key, None)
        if uid is not None:
            self.specs.forget(key, uid)
            self.writes.forget(key, uid)
            self.recorder.forget(uid)
            self.progress_read.pop(uid, None)
            self.reports.pop(uid, None)
            self.read_failures.pop(uid, None)
            reading = self.reading.pop(uid, None)
            if reading is not None:
                reading.cancel()
        self.problems.pop(key, None)
        self.extra_problems.pop(key, None)
        self.expected.pop(key, None)
        self.deleted_pods.pop(key, None)
        self.tokens_made.pop(key, None)
        self.cluster_bounds.pop(key, None)
        self.queue.drop(key)

    def phases(self) -> dict[str, dict[str, int]]:
        """Objects by phase per kind, every phase of the kind included (0 too)."""
        result = {}
        for name, kind in self.kinds.items():
            counts = Counter((o.get("status") or {}).get("phase") or "Unknown" for o in self.parents[name].values())
            result[kind.phase_metric] = {**dict.fromkeys(kind.phases, 0), **counts}
        return result

    # --- workers ---------------------------------------------------------------------------------

    async def work(self) -> None:
        while True:
            key = await self.queue.get()
            started = time.perf_counter()
            try:
                result = await self.reconcile_fenced(key)
            except Exception as err:  # every failure: API errors, refused/reset connections, timeouts
                delay = self.queue.retry(key)
                log.warning("%s %s/%s: reconcile failed (%s); retrying in %.0fs", key[0], key[1], key[2],
                            describe(err), delay)
                result = "error"
            else:
                if result == "retry":
                    self.queue.retry(key)
                elif result != "gone":
                    self.queue.forget(key)
            finally:
                self.queue.done(key)
            METRICS.reconciled(result, time.perf_counter() - started, key[0])

    async def reconcile_fenced(self, key: Key) -> str:
        """``reconcile(key)`` within RECONCILE_TIMEOUT. Cancelling it does not stop a call already
        on a thread: an abandoned reconcile sends none of its calls still queued, and returns only
        once those in flight ended, so that the key's next reconcile never races its writes."""
        calls = Calls()
        token = CALLS.set(calls)  # the reconcile's task copies this context
        try:
            return await asyncio.wait_for(self.reconcile(key), RECONCILE_TIMEOUT)
        except asyncio.TimeoutError:
            calls.abandoned = True
            await calls.settled()
            raise
        finally:
            CALLS.reset(token)

    # --- the reconcile ---------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> str:
        kind = self.kinds[key[0]]
        namespace, name = key[1], key[2]
        parent = self.parents[key[0]].get((namespace, name))
        if parent is None:
            self.forget(key)
            return "gone"
        meta = parent["metadata"]
        if self.uids.get(key) not in (None, meta.get("uid")):
            self.forget(key)  # deleted and made again under the same name: nothing of the old one holds
        self.uids[key] = meta.get("uid")
        if meta.get("deletionTimestamp"):
            return "deleting"  # the garbage collector removes the children; create nothing now
        try:
            spec = self.specs.parse(kind, parent, namespace)
            result, child = await self._ensure_child(kind, key, parent, spec)
            if result != "finished":
                await self._ensure_extras(kind, key, parent, spec)
        except InvalidSpec as err:  # the spec, or the child it renders (too large to be created)
            self.specs.refused(meta, err)
            previous = self.writes.previous(parent)
            current = statuses.invalid(err.errors, meta.get("generation", 0), previous, self.clock())
            if await self.writes.write(kind, parent, previous, current):
                METRICS.validation_failed()
                log.warning("%s %s/%s is invalid: %s", kind.resource.kind, namespace, name, err)
            return "invalid"

        if result == "finished":
            self.deleted_pods.pop(key, None)
            return result  # its status already tells the end; nothing observed would add to it
        ours = child if child is not None and ownership(kind, parent, child) == "ours" else None
        pods, deleted = [], []
        if ours is not None:
            clusters = kind.cluster_names(ours)
            in_cluster = lambda p: ((p.get("metadata") or {}).get("labels") or {}).get(statuses.CLUSTER_LABEL) in clusters  # noqa: E731
            pods = [p for p in self.pods.indexed((kind.label, namespace, name)) if in_cluster(p)]
            deleted = [p for p in self.deleted_pods.get(key, ()) if in_cluster(p)]
        if ours is not None and kind.cluster_patch is not None:
            await self._ensure_clusters(kind, key, spec, ours, version(meta))
        queue = await self._admission(kind, spec, ours) if ours is not None else None
        previous = self.writes.previous(parent)
        refused = self.pods.forbidden_in(namespace) if self.pods is not None else None
        pods_problem = statuses.pods_forbidden(namespace, refused) if refused else None
        network = next((e.status(spec, self.extra_problems.get(key)) for e in self.extras if e.status), None)
        current = kind.derive(spec, meta.get("generation", 0), ours, pods, previous, self.clock(),
                              self.problems.get(key), queue=queue, deleted=deleted, pods_problem=pods_problem,
                              network=network)
        if ours is not None and kind.child_must_go is not None and kind.child_must_go(current, ours):
            # About to end the attempt, maybe on pod events alone: the pod and RayJob watches are
            # not ordered, and a job that just succeeded also loses its pods (KubeRay deletes its
            # cluster). Read the RayJob itself before ending its attempt.
            fresh = await self.kube.get(kind.child, namespace, name)
            if (fresh.get("metadata") or {}).get("resourceVersion") != (ours.get("metadata") or {}).get("resourceVersion"):
                self.children[key[0]].remember(fresh)
                ours = self.children[key[0]].slim(fresh)
                current = kind.derive(spec, meta.get("generation", 0), ours, pods, previous, self.clock(),
                                      self.problems.get(key), queue=queue, deleted=deleted, pods_problem=pods_problem,
                                      network=network)
        current = self.writes.never_back_from_terminal(kind, parent, current)
        if kind.reads_progress and self.dashboard is not None:
            current = self._progress(key, meta.get("uid"), current,
                                     render.ray_token_secret_name(ours) if ours is not None else None)
        # The write right after our own create is on the job's critical path: never put off.
        await self.writes.write(kind, parent, previous, current, at_once=result == "created")
        if queue is not None:  # after the status: a failing Workload patch must not freeze it
            await self._carry_suspend(kind, spec, ours)
        if ours is not None and kind.child_must_go is not None and kind.child_must_go(self.writes.previous(parent), ours):
            await self._remove_child(kind, key, ours)  # the attempt it ran has ended (as now written)
            return "attempt-ended"
        return result

    # --- training progress ---------------------------------------------------------------------

    def _progress(self, key: Key, uid: str, current: dict, secret_name: str | None) -> dict:
        """The status with the newest report read in it; and, while the job runs, its driver log
        read again once per progress_interval (on a task of its own: a slow dashboard never holds a
        reconcile worker). The read's result brings the key back."""
        current = training.apply(current, self.reports.get(uid), self.clock())
        where = training.source(current)
        if where is None:
            return current
        delay = training.read_delay(self.progress_read.get(uid), self.monotonic(), self.progress_interval)
        if uid in self.reading:
            delay = self.progress_interval  # the read in flight brings the key back if it has news
        elif delay <= 0:
            self.progress_read[uid] = self.monotonic()
            # A fresh context: the read is no call of this reconcile (reconcile_fenced's CALLS).
            self.reading[uid] = asyncio.get_running_loop().create_task(
                self._read_progress(key, uid, *where, secret_name), context=contextvars.Context())
            delay = self.progress_interval
        self.queue.add_after(key, delay)  # level-based: the next read needs no event
        return current

    async def _driver_log(self, namespace: str, cluster: str, submission_id: str, secret_name: str | None) -> str:
        """The driver's log tail, with the cluster's token: the current key's, then, where the cluster
        refuses it (made before a key rotation), the previous key's. Each request is bounded by the
        dashboard's own timeout (the wait for a slot is not)."""
        *first, last = self.ray_tokens.candidates(namespace, secret_name) if secret_name else [None]
        for token in first:
            try:
                return await self.dashboard.driver_log(namespace, cluster, submission_id, token)
            except DashboardError as err:
                if not err.token_refused:
                    raise
        return await self.dashboard.driver_log(namespace, cluster, submission_id, last)

    async def _read_progress(self, key: Key, uid: str, cluster: str, submission_id: str, secret_name: str | None) -> None:
        try:
            log_tail = await self._driver_log(key[1], cluster, submission_id, secret_name)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # unreachable, refused, 5xx, a timeout: the next interval tries again
            failure = f"{type(err).__name__}: {str(err)[:200]}"
            level = logging.DEBUG if self.read_failures.get(uid) == failure else logging.WARNING
            self.read_failures[uid] = failure
            log.log(level, "%s %s/%s: progress not read from RayCluster %s's dashboard: %s", key[0], key[1],
                    key[2], cluster, failure)
            return
        finally:
            if self.reading.get(uid) is asyncio.current_task():
                del self.reading[uid]
        self.read_failures.pop(uid, None)
        try:
            report = training.parse(log_tail)
        except Exception as err:  # a bug here must not end the read task unlogged
            log.error("%s %s/%s: the progress read from RayCluster %s could not be parsed: %s", key[0], key[1],
                      key[2], cluster, describe(err))
            return
        if report is not None and report != self.reports.get(uid) and self.uids.get(key) == uid:
            self.reports[uid] = report
            self.enqueue(key)

    async def _remove_child(self, kind: Kind, key: Key, child: dict) -> None:
        """Delete a child of an ended attempt (once; its deletion event brings the key back)."""
        meta = child.get("metadata") or {}
        self.deleted_pods.pop(key, None)  # they were that attempt's
        self.expected.pop(key, None)  # the child just created, if it was this one, is not awaited any more
        if meta.get("deletionTimestamp"):
            return
        try:
            await self.kube.delete(kind.child, key[1], key[2], meta.get("uid"))
        except ApiException as err:
            if err.status not in (404, 409):  # gone already, or another object by that name now
                raise
        log.info("%s %s/%s of an ended attempt deleted", kind.child.kind, key[1], key[2])

    async def _ensure_child(self, kind: Kind, key: Key, parent: dict, spec) -> tuple[str, dict | None]:
        namespace, name = key[1], key[2]
        children = self.children[key[0]]
        child = self.child_of(key, parent)
        if child is None:
            if self.writes.terminal_of(kind, parent) is not None:
                return "finished", None  # it ran and its child is gone: making one would run it again
            refused = children.forbidden_in(namespace)  # this namespace's, not another's
            if refused is not None:
                self.problems[key] = ("Forbidden", f"the operator may not {refused[0]} {kind.child.kind}s: "
                                      f"{refused[1]}")
                return "retry", None
            return await self._create(kind, key, parent, spec)
        owned = ownership(kind, parent, child)
        if owned != "ours":
            self.problems[key] = waiting_problem(kind, namespace, name, owned)
            # 'previous': its deletion event brings the key back; 'foreign' may carry no label of
            # ours (invisible to the watch): look again with backoff either way.
            return "retry", child
        self.problems.pop(key, None)
        if not await self._ensure_ray_token(kind, key, child):
            return "retry", child
        if kind.child_must_go is not None and kind.child_must_go(self.writes.previous(parent), child):
            await self._remove_child(kind, key, child)
            # Looked at again when it is gone (its deletion event), or with backoff.
            return "retry", None
        if not kind.patch_when_queued and self._kueue_manages(child):
            return "unchanged", child
        patch = kind.child_patch(spec, child)
        if patch is None:
            return "unchanged", child
        await self.kube.patch(kind.child, namespace, name, patch)
        log.info("%s %s/%s patched: %s", kind.child.kind, namespace, name, sorted(patch.get("spec") or patch))
        return "child-patched", child

    async def _ensure_clusters(self, kind: Kind, key: Key, spec, child: dict, version: tuple) -> None:
        """Each running RayCluster of the child (owned by it) gets what kind.cluster_patch says. Read
        once per spec version and cluster: nothing else writes a cluster's bounds."""
        namespace = key[1]
        child_uid = (child.get("metadata") or {}).get("uid")
        names = kind.cluster_names(child)
        done = {n: v for n, v in self.cluster_bounds.get(key, {}).items() if n in names}
        self.cluster_bounds[key] = done
        for name in sorted(names):
            if done.get(name) == version:
                continue
            try:
                cluster = await self.kube.get(RAYCLUSTER, namespace, name)
            except ApiException as err:
                if err.status == 403:  # a chart older than this grant: the service runs on, unresized
                    log.warning("RayCluster %s/%s: may not read it (%s): a replicas edit will not reach it",
                                namespace, name, api_message(err))
                    continue
                if err.status == 404:
                    continue  # not made yet, or already deleted by KubeRay: looked at on the next event
                raise
            patch = kind.cluster_patch(spec, cluster)
            # never one another object controls (its name in our status is no proof it is ours)
            if patch is not None and (controller_of(cluster) or {}).get("uid") == child_uid:
                await self.kube.patch(RAYCLUSTER, namespace, name, patch)
                log.info("RayCluster %s/%s of %s %s/%s: worker bounds patched", namespace, name, kind.child.kind,
                         namespace, key[2])
            done[name] = version

    async def _ensure_ray_token(self, kind: Kind, key: Key, child: dict) -> bool:
        """The Secret with the token of a child's cluster (named on it by _create, owned by it),
        made once per process per child: level-based, so a child whose Secret an earlier process
        never made (it died or was refused in between) gets it. Created only, as the operator may
        not read Secrets: a 409 is this child's own (the name is the child's alone, the token is
        derived, never random). False when refused: said in the status and tried again."""
        name, uid = render.ray_token_secret_name(child), child["metadata"].get("uid")
        if (not kind.own_ray_token or not render.is_ray_token_secret_of(child, name)
                or self.tokens_made.get(key) == uid or child["metadata"].get("deletionTimestamp")):
            return True
        namespace = key[1]
        try:
            await self.kube.create_secret(namespace, render.ray_token_secret(child, self.ray_tokens.token(namespace, name)))
            log.info("Secret %s/%s (the Ray token of %s %s) created", namespace, name, kind.child.kind, key[2])
        except ApiException as err:
            if err.status != 409:
                detail = api_message(err) or f"HTTP {err.status} {err.reason}"
                self.problems[key] = ("RayTokenSecretNotCreated", f"the Secret {name} with the Ray cluster's auth "
                                      f"token could not be created (its pods wait for it): {detail}")
                log.warning("%s %s/%s: %s", kind.resource.kind, namespace, key[2], self.problems[key][1])
                return False
        self.tokens_made[key] = uid  # replaces the entry of an earlier child of this key
        self.problems.pop(key, None)
        return True

    async def _create(self, kind: Kind, key: Key, parent: dict, spec) -> tuple[str, dict | None]:
        namespace, name = key[1], key[2]
        desired = kind.render(spec)
        if kind.own_ray_token:  # a name of this child's alone: never one a deleted child still holds
            render.with_ray_token_secret(desired, render.new_ray_token_secret_name(name, secrets.token_hex(3)))
        desired["metadata"]["namespace"] = namespace  # the object's own, whatever its body says
        desired["metadata"]["ownerReferences"] = [owner_reference(kind, parent)]
        if kind.attempt is not None:
            desired["metadata"].setdefault("labels", {})[ATTEMPT_LABEL] = str(kind.attempt(self.writes.previous(parent)))
        try:
            created = await self.kube.create(kind.child, namespace, desired)
        except ApiException as err:
            if err.status != 409:
                self.problems[key] = create_problem(kind, err)
                log.warning("%s %s/%s not created: %s", kind.child.kind, namespace, name, self.problems[key][1])
                return "retry", None
            # There already: ours with a late watch event, an earlier object's, or someone else's
            # (which may carry no label of ours, so never reach the store: look again with backoff).
            existing = await self.kube.get(kind.child, namespace, name)
            owned = ownership(kind, parent, existing)
            if owned != "ours":
                self.problems[key] = waiting_problem(kind, namespace, name, owned)
                return "retry", existing
            self.problems.pop(key, None)
            await self._relabel(kind, key, desired, existing)
            self.expect(key, existing)
            if not await self._ensure_ray_token(kind, key, existing):
                return "retry", existing
            return "exists", existing
        except Exception as err:
            self.problems[key] = create_problem(kind, err)
            raise
        self.problems.pop(key, None)
        self.expect(key, created)
        log.info("%s %s/%s created (%s %s slice, %d hosts)", kind.child.kind, namespace, name,
                 spec.slice.generation.name, spec.slice.topology, spec.slice.hosts)
        if not await self._ensure_ray_token(kind, key, created):
            return "retry", created
        return "created", created

    # --- Kueue ------------------------------------------------------------------------------------

    def _kueue_manages(self, child: dict) -> bool:
        """Kueue holds this child's suspend: it carries a queue name and Kueue's Workload kind is
        served (without Kueue nobody else would ever start or stop it)."""
        labels = (child.get("metadata") or {}).get("labels") or {}
        return bool(labels.get(render.QUEUE_LABEL)) and self.workloads is not None and self.workloads.served is not False

    async def _admission(self, kind: Kind, spec, child: dict) -> kueue.Admission | None:
        """Where Kueue has the child, from its Workload."""
        if not spec.queue_name or not self._kueue_manages(child):
            return None
        namespace, name = key_of(child)
        refused = self.workloads.forbidden_in(namespace)
        if refused is not None:  # RBAC without workloads: say so, keep KubeRay's phase
            return kueue.Admission(False, "Forbidden", f"the operator may not read Kueue's Workloads: "
                                   f"{refused[1]}", None)
        if not self.workloads.synced.is_set():  # a list that keeps failing: never guess "no Workload"
            return kueue.Admission(False, "WorkloadsNotListed", "the operator could not list Kueue's Workloads yet"
                                   f" ({self.workloads.list_error or 'no answer'}): admission unknown", None)
        workload = self._workload_of(kind, child)
        pcs, exists = self.priority_classes, True
        if spec.priority_class_name and pcs is not None and pcs.served and pcs.forbidden is None:
            exists = pcs.get(("", spec.priority_class_name)) is not None
        return kueue.admission(spec.queue_name, kind.child.kind, name, workload, spec.priority_class_name, exists)

    def _workload_of(self, kind: Kind, child: dict) -> dict | None:
        namespace, name = key_of(child)
        return kueue.workload_for(self.workloads.indexed((namespace, kind.child.kind, name)), child)

    async def _carry_suspend(self, kind: Kind, spec, child: dict) -> None:
        """The user's spec.suspend carried to the child's Workload (spec.active), the one place
        Kueue takes it from without a fight. A failure raises (the reconcile retries with backoff)
        once the status is written."""
        workload, active = self._workload_of(kind, child), not getattr(spec, "suspend", False)
        if workload is None or (workload.get("spec") or {}).get("active", True) == active:
            return
        namespace, name = key_of(child)
        await self.kube.patch(WORKLOAD, namespace, key_of(workload)[1], {"spec": {"active": active}})
        log.info("%s %s/%s: Workload %s %s", kind.resource.kind, namespace, name, key_of(workload)[1],
                 "activated" if active else "deactivated (suspended)")

    async def _relabel(self, kind: Kind, key: Key, desired: dict, child: dict) -> None:
        """Our own child without the labels our watch selects on (someone removed them): put them
        back, or the operator would never see it change again."""
        wanted = {k: v for k, v in (desired["metadata"].get("labels") or {}).items()
                  if k in (MANAGED_BY_LABEL, kind.label)}
        labels = (child.get("metadata") or {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in wanted.items()):
            return
        await self.kube.patch(kind.child, key[1], key[2], {"metadata": {"labels": wanted}})
        log.info("%s %s/%s: its labels %s put back", kind.child.kind, key[1], key[2], sorted(wanted))

    async def _ensure_extras(self, kind: Kind, key: Key, parent: dict, spec) -> None:
        """Each Extra exists, is ours and says what the spec renders. A failure is said in the status
        (extra_problems) and left to the next reconcile: the main child never waits for an extra."""
        namespace = key[1]
        for extra in self.extras:
            store = self.extra_stores[extra.resource.plural]
            refused = store.forbidden_in(namespace)
            if refused is not None:
                self.extra_problems[key] = ("Forbidden", f"the operator may not {refused[0]} "
                                            f"{extra.resource.kind}s: {refused[1]}")
                continue
            if store.served is False:
                continue  # the informer reports it (the kind not served)
            desired = extra.render(spec)
            name = desired["metadata"]["name"]
            existing = store.get((namespace, name))
            made = (extra.resource.plural, namespace, name)
            if existing is not None:
                self.extras_made.pop(made, None)  # the watch has it
            elif len(self.extras_made) > 1000:  # bounded: forget what should have arrived long ago
                now_ = time.monotonic()
                self.extras_made = {k: t for k, t in self.extras_made.items() if now_ - t < EXPECT_FOR}
            try:
                if existing is None:
                    if time.monotonic() - self.extras_made.get(made, -EXPECT_FOR) < EXPECT_FOR:
                        continue  # created just now; its watch event is on the way
                    desired["metadata"]["namespace"] = namespace
                    desired["metadata"]["ownerReferences"] = [owner_reference(kind, parent)]
                    await self.kube.create(extra.resource, namespace, desired)
                    self.extras_made[made] = time.monotonic()
                    log.info("%s %s/%s created", extra.resource.kind, namespace, name)
                elif ownership(kind, parent, existing) != "ours":
                    self._extra_taken(kind, extra, key, name)
                    continue
                elif existing.get("spec") != desired["spec"]:
                    await self.kube.patch(extra.resource, namespace, name, {"spec": desired["spec"]})
                    log.info("%s %s/%s patched", extra.resource.kind, namespace, name)
                self.extra_problems.pop(key, None)
            except ApiException as err:
                if err.status == 409:
                    # There already: ours arrives through the watch; someone else's (maybe without
                    # our labels, so never in the store) is read to be told apart.
                    found = await self.kube.get(extra.resource, namespace, name)
                    if ownership(kind, parent, found) != "ours":
                        self._extra_taken(kind, extra, key, name)
                    else:
                        self.extras_made[made] = time.monotonic()
                    continue
                log.warning("%s %s/%s not written: %s", extra.resource.kind, namespace, name, describe(err))
                self.extra_problems[key] = (f"{extra.resource.kind}NotWritten",
                                            f"the {extra.resource.kind} {name} could not be written: "
                                            f"{api_message(err) or describe(err)}")

    def _extra_taken(self, kind: Kind, extra: Extra, key: Key, name: str) -> None:
        self.extra_problems[key] = (
            f"{extra.resource.kind}NameTaken",
            f"a {extra.resource.kind} named {name} already exists in {key[1]} and does not belong to this "
            f"{kind.resource.kind}: it is left alone and the operator's is not made; delete that {extra.resource.kind}")
        log.warning("%s %s/%s exists and is not %s's: left alone", extra.resource.kind, key[1], name, key[2])
