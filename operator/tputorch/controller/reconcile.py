"""The reconciles of this operator's two kinds, each its own list of steps over shared step
modules (as KubeRay's controllers read: one Reconcile per kind, a short list of reconcileX steps):
``Controller.reconcile_job`` (TPUTorchJob -> RayJob, run in attempts) and
``Controller.reconcile_service`` (TPUTorchService -> RayService, served until deleted). ``Kind``
(kind.py) holds only what the steps need of both alike.

Every source of work (the object's events, its child's, its pods', retries, a child kind becoming
served) adds the object's key to one work queue; one worker handles a key at a time and every
decision is made there, from what the stores hold now (level-based). Each step is a module of
its own with its inputs and the in-memory state it keeps:

  specs.py         the spec, parsed once per version
  kueuecap.py      the installed Kueue's cap on pod sets per Workload (a queued job's groups)
  child.py         the child, made and owned (uid), with its expectations; the pods of its clusters;
                   a job's next attempt held until the earlier attempt's pods are gone
  extras.py        its NetworkPolicy and its child's Ray token Secret
  clusters.py      the worker bounds of a service's running RayClusters
  admission.py     Kueue admission, a service's initializing timeout, spec.suspend carried to the Workload
  attempts.py      a job's hosts lost, its RayJob read again, the child of an ended attempt
  progressreads.py a job's training progress read from the Ray dashboard
  writes.py        the status write budget, with sticky terminal phases
  sweeps.py        what is kept for an object dropped when it is gone

Everything kept in memory is a cache that the API rebuilds after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from functools import partial
from typing import Callable

from .. import render, status as statuses
from ..render.names import RAYSERVICE_ANNOTATIONS, SPEC_HASH_ANNOTATION
from ..render.env import started_of
from ..render.raytoken import ray_token_secret_name, with_ray_token_secret
from ..api.spec import InvalidSpec
from ..render import stamp as stamps
from ..status import applied as service_status, goodput, kueue, progress as training, rendering
from ..status.job import attempt_of_child
from .admission import KueueAdmission
from .attempts import Attempts
from .child import ChildStep
from .clusters import ClusterBounds
from .events import EventRecorder
from .extras import ExtraChildren, RayTokenSecrets
from .informer import Informer, key_of
from .kind import Extra, Key, Kind, describe, now, ownership
from .kind import TPUTORCHJOB, TPUTORCHSERVICE
from .kube import CALLS, Calls
from .kueuecap import KueueCap
from .metrics import METRICS, WALL_CLOCK
from .progressreads import ProgressReads
from .slicereads import SliceReads
from .raytoken import RayTokens
from .specs import Specs, version
from .stores import Stores
from .sweeps import Sweeps
from .workqueue import Backoff, WorkQueue
from .writes import STATUS_INTERVAL, StatusWrites

log = logging.getLogger("tputorch")

# A reconcile that takes longer is abandoned and retried with backoff: one object's stuck call must
# not keep it from ever being reconciled again (a key is never handed to a second worker).
RECONCILE_TIMEOUT = 120


def _store(name: str) -> property:
    """An informer the steps read, kept in ``Controller.stores`` (the handlers set them after)."""
    return property(lambda self: getattr(self.stores, name), lambda self, value: setattr(self.stores, name, value))


class Controller:
    parents, children, pods = _store("parents"), _store("children"), _store("pods")
    workloads, priority_classes, extra_stores = _store("workloads"), _store("priority_classes"), _store("extras")
    workload_crd = _store("workload_crd")

    def __init__(self, kinds: list[Kind], kube, parents: dict[str, Informer], children: dict[str, Informer],
                 pods: Informer, clock: Callable[[], str] = now, status_interval: float = STATUS_INTERVAL,
                 monotonic: Callable[[], float] = time.monotonic, workloads: Informer | None = None,
                 priority_classes: Informer | None = None, extras: list[Extra] = (), dashboard=None,
                 progress_interval: float = training.READ_INTERVAL, ray_tokens: RayTokens | None = None) -> None:
        self.kinds = {k.resource.kind: k for k in kinds}
        self.reconcilers = {TPUTORCHJOB.kind: self.reconcile_job, TPUTORCHSERVICE.kind: self.reconcile_service}
        self.kube, self.clock = kube, clock
        self.stores = Stores(parents, children, pods, workloads, priority_classes)
        # jitter: objects that failed together (an outage) do not all retry in the same second
        self.queue = WorkQueue(Backoff(jitter=0.1), metrics=METRICS)
        # Events wait while any object waits for a reconcile (events.py).
        self.recorder = EventRecorder(kube.post_event, busy=lambda: len(self.queue) > 0, monotonic=monotonic)
        self.active = True  # False on a standby until it leads: nothing is queued
        requeue = lambda key, delay: self.queue.add_after(key, delay)  # noqa: E731 (late bound: tests replace it)
        ray_tokens = ray_tokens or RayTokens.from_file(None)
        # the steps, in the order the reconcile takes them
        self.specs = Specs()
        self.kueue_cap = KueueCap(self.stores)
        self.writes = StatusWrites(kube, self.recorder, requeue, status_interval, monotonic,
                                   others_waiting=lambda: self.queue.busy(),
                                   park=lambda key, most: self.queue.add_when_idle(key, most))
        self.kueue = KueueAdmission(kube, self.stores)
        self.tokens = RayTokenSecrets(kube, ray_tokens)
        self.child = ChildStep(kube, self.stores, self.tokens, self.writes, self.kueue.manages,
                               clock=lambda: self.clock(), requeue=requeue)
        self.extras = ExtraChildren(kube, self.stores, list(extras), requeue)
        self.clusters = ClusterBounds(kube)
        self.attempts = Attempts(kube, self.stores, self.child, self.writes)
        self.progress = ProgressReads(dashboard, progress_interval, ray_tokens, clock, monotonic, requeue,
                                      self.enqueue, lambda key: self.sweeps.uids.get(key))
        self.slices = SliceReads(dashboard, progress_interval, ray_tokens, monotonic, requeue, self.enqueue,
                                 lambda key: self.sweeps.uids.get(key))
        self.sweeps = Sweeps(self.stores, [self.specs, self.writes, self.child, self.tokens, self.extras,
                                           self.clusters, self.attempts, self.progress, self.slices], self.queue,
                             self.recorder)

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
            self.sweeps.sweep()
        elif event == "DELETED" and obj:
            self.attempts.forget((kind, *key_of(obj)))  # at once: a standby reconciles nothing
            self.enqueue((kind, *key_of(obj)))
        elif obj:
            self.enqueue((kind, *key_of(obj)))

    def child_changed(self, kind: str, event: str, obj: dict) -> None:
        if event in ("SERVED", "FORBIDDEN", "ALLOWED"):  # every object of the kind may now read differently
            for key in self.parents[kind].keys():
                self.enqueue((kind, *key))
        elif obj:  # the child's name is the object's
            key = (kind, *key_of(obj))
            self.child.seen(key, event, obj)
            self.enqueue(key)

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
                if event == "DELETED":
                    self.attempts.pod_deleted(key, obj)
                self.enqueue(key)

    def workload_changed(self, event: str, obj: dict) -> None:
        if event in ("SERVED", "FORBIDDEN", "ALLOWED"):  # Kueue installed, refused or granted: every queued object reads anew
            self._queued_objects(lambda spec: True)
            return
        owner = kueue.owner_of(obj) if obj else None
        for kind in self.kinds.values():
            if owner is not None and owner[0] == kind.child.kind:
                self.enqueue((kind.resource.kind, key_of(obj)[0], owner[1]))

    def workload_crd_changed(self, event: str, obj: dict) -> None:
        """Kueue installed, upgraded or removed: its cap on pod sets may differ, so every queued
        object is looked at again (a job refused for its groups may fit now)."""
        if self.kueue_cap.changed():
            self._queued_objects(lambda spec: True)

    def priority_class_changed(self, event: str, obj: dict) -> None:
        name = key_of(obj)[1] if obj else None
        self._queued_objects(lambda spec: name is None or spec.get("priorityClassName") == name)

    def _queued_objects(self, which: Callable[[dict], bool]) -> None:
        for kind, informer in self.parents.items():
            for obj in informer.values():
                spec = obj.get("spec") or {}
                if spec.get("queueName") and which(spec):
                    self.enqueue((kind, *key_of(obj)))

    def goodput(self) -> dict[tuple[str, str], dict[str, float]]:
        """The jobs' goodput ledgers summed per namespace and queue (status/goodput.py)."""
        jobs = self.parents.get(TPUTORCHJOB.kind)
        return goodput.by_queue(jobs.values() if jobs is not None else (), WALL_CLOCK)

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
        """The object's own reconcile (reconcile_job, reconcile_service), once it is known to exist
        and not to be being deleted."""
        kind = self.kinds[key[0]]
        parent = self.parents[key[0]].get(key[1:])
        if parent is None:
            self.sweeps.forget(key)
            return "gone"
        meta = parent["metadata"]
        self.sweeps.track(key, meta.get("uid"))  # deleted and made again: nothing of the old one holds
        if meta.get("deletionTimestamp"):
            return "deleting"  # the garbage collector removes the children; create nothing now
        return await self.reconcilers[key[0]](kind, key, parent)

    async def reconcile_job(self, kind: Kind, key: Key, parent: dict) -> str:
        """A TPUTorchJob: its RayJob, one per attempt (status/job.py), and the job's status."""
        meta = parent["metadata"]
        cap = self.kueue_cap.podsets()  # what the installed Kueue admits: checked before a create
        made = await self._children(kind, key, parent, cap, partial(self._rayjob, kind, key, parent, cap=cap))
        if made is None:
            return "invalid"
        spec, result, child = made
        if result == "finished":
            self.attempts.forget(key)
            return result  # its status already tells the end; nothing observed would add to it
        ours = self._ours(kind, parent, child)
        pods, deleted = self.child.pods_of(kind, key, ours), self.attempts.deleted_of(kind, key, ours)
        admission = await self.kueue.admission(kind, spec, ours)
        previous, now = self.writes.previous(parent), self.clock()
        derive = lambda rayjob: statuses.derive(  # noqa: E731
            spec, meta.get("generation", 0), rayjob, pods, previous, now, self.child.problems.get(key),
            queue=admission, deleted=deleted, pods_problem=self._pods_problem(key[1]),
            network=self.extras.network(key, spec), log_denial=self.progress.denial(meta.get("uid"), previous.get("attempts")),
            hang=self.progress.seen(meta.get("uid"), previous))
        current = derive(ours)
        if self.attempts.must_end(current, ours):  # maybe on pod events alone: read the RayJob again
            fresh = await self.attempts.read_again(kind, key, ours)
            if fresh is not None:
                ours, current = fresh, derive(fresh)
        current = self.writes.never_back_from_terminal(kind, parent, current)
        current = self.progress.apply(key, meta.get("uid"), current,
                                      ray_token_secret_name(ours) if ours is not None else None)
        current = goodput.apply(current, previous, meta.get("creationTimestamp"), ours, pods, admission)
        current = rendering.with_condition(current, self._older_rayjob(kind, key, spec, ours, meta), previous, now)
        await self._write_status(kind, parent, spec, ours, previous, current, result, admission)
        if self.attempts.must_end(self.writes.previous(parent), ours):
            await self.attempts.end(kind, key, ours)  # the attempt it ran has ended (as now written)
            return "attempt-ended"
        return result

    async def reconcile_service(self, kind: Kind, key: Key, parent: dict) -> str:
        """A TPUTorchService: its RayService (a service never finishes: no terminal phase, no
        attempts; a vanished RayService is made again), the worker bounds of its RayClusters, and
        the service's status."""
        meta = parent["metadata"]
        made = await self._children(kind, key, parent, None, lambda spec, beside: self.child.ensure_rayservice(
            kind, key, parent, spec, self.specs.child(meta, spec, render.rayservice), beside))
        if made is None:
            return "invalid"
        spec, result, child = made
        ours = self._ours(kind, parent, child)
        pods = self.child.pods_of(kind, key, ours)
        await self.clusters.ensure(kind, key, spec, ours, version(meta))
        admission = await self.kueue.admission(kind, spec, ours)
        await self.kueue.initializing_timeout(kind, spec, ours, admission)
        previous, now = self.writes.previous(parent), self.clock()
        # What the live RayService is to run: its own rendering unless the spec changed (render/stamp.py)
        fresh = self.specs.child(meta, spec, render.rayservice)
        found = stamps.read(ours) if ours is not None else None
        own = stamps.own_rendering(parent, ours, found, fresh, RAYSERVICE_ANNOTATIONS)
        current = statuses.derive_service(
            spec, meta.get("generation", 0), ours, pods, previous, now, self.child.problems.get(key),
            queue=admission, pods_problem=self._pods_problem(key[1]), network=self.extras.network(key, spec),
            desired_hash=own["annotations"].get(SPEC_HASH_ANNOTATION),  # is the live RayService up to date?
            slice_check=self.slices.found(meta.get("uid")))
        self.slices.apply(key, meta.get("uid"), spec, current, ours)  # reads Ray's state off the workers
        if ours is not None:  # the token Secret it names is named on it, not rendered
            rendering.name_token_secret(ours, own, fresh)
        current = rendering.with_condition(current, rendering.rendering_condition(
            kind.resource.kind, kind.child.kind, key[2], key[1], found, own, stamps.rendering(fresh),
            meta.get("generation", 0)), previous, now)
        recheck = service_status.recheck_in(current, now, ours)
        if recheck is not None:  # KubeRay's Serve reload may bring no event (status/applied.py)
            self.queue.add_after(key, recheck)
        await self._write_status(kind, parent, spec, ours, previous, current, result, admission)
        return result

    @staticmethod
    def _older_rayjob(kind: Kind, key: Key, spec, rayjob: dict | None, meta: dict) -> dict | None:
        """RenderingCurrent of a job whose running attempt's RayJob another operator version
        rendered (its next attempt gets this one's): rendered again only for such a RayJob."""
        found = stamps.read(rayjob) if rayjob is not None else None
        if found is None or found.version == stamps.OPERATOR_VERSION or found.rendering is None:
            return None
        fresh = render.rayjob(spec, attempt_of_child(rayjob), started_of(found.rendering))  # the attempt it runs
        if ray_token_secret_name(rayjob):  # named at its creation, not rendered
            with_ray_token_secret(fresh, ray_token_secret_name(rayjob))
        return rendering.rendering_condition(kind.resource.kind, kind.child.kind, key[2], key[1], found,
                                             found.rendering, stamps.rendering(fresh), meta.get("generation", 0))

    # --- the steps both kinds take ---------------------------------------------------------------

    async def _children(self, kind: Kind, key: Key, parent: dict, cap, ensure_child):
        """(spec, result, child): the spec parsed, then the child (``ensure_child(spec, beside)``,
        child.py) and the extras (extras.py). The extras go out beside the child's create request,
        not after its answer: one object's creates are not serial (issue 40); they say their own
        failures (extras.problems), never the reconcile's. None: the spec, the child it renders
        (too large) or what Kueue would not admit (``cap``) was refused, as the status now says."""
        beside: list[asyncio.Task] = []
        try:
            spec = self.specs.parse(kind, parent, key[1], cap)
            result, child = await ensure_child(spec, beside=lambda: beside.append(
                asyncio.ensure_future(self.extras.ensure(kind, key, parent, spec))))
            if result != "finished" and not beside:  # a finished object's extras go with it
                await self.extras.ensure(kind, key, parent, spec)
        except InvalidSpec as err:
            await self._invalid(kind, parent, err, cap)
            return None
        finally:
            for task in beside:
                await task
        return spec, result, child

    async def _rayjob(self, kind: Kind, key: Key, parent: dict, spec, cap, beside) -> tuple[str, dict | None]:
        result, child = await self.child.ensure_rayjob(kind, key, parent, spec, cap, beside)
        if result == "ending":  # the child of an ended attempt: looked at again when it is gone
            await self.attempts.end(kind, key, child)
            return "retry", None
        return result, child

    @staticmethod
    def _ours(kind: Kind, parent: dict, child: dict | None) -> dict | None:
        return child if child is not None and ownership(kind, parent, child) == "ours" else None

    async def _write_status(self, kind: Kind, parent: dict, spec, child: dict | None, previous: dict, current: dict,
                            result: str, admission: kueue.Admission | None) -> None:
        # The write right after our own create is not put off by the budget; in a burst, the
        # object's first status waits for the other objects' creates (writes.py).
        await self.writes.write(kind, parent, previous, current, at_once=result == "created", first_may_wait=True)
        if admission is not None:  # after the status: a failing Workload patch must not freeze it
            await self.kueue.carry_suspend(kind, spec, child)

    def _pods_problem(self, namespace: str):
        refused = self.pods.forbidden_in(namespace) if self.pods is not None else None
        return statuses.pods_forbidden(namespace, refused) if refused else None

    async def _invalid(self, kind: Kind, parent: dict, err: InvalidSpec, cap=None) -> str:
        meta = parent["metadata"]
        self.specs.refused(meta, err, cap)
        previous = self.writes.previous(parent)
        key = (kind.resource.kind, meta.get("namespace"), meta.get("name"))
        child = self._ours(kind, parent, self.child.of(key, parent))
        found = stamps.read(child) if child is not None else None
        if child is not None and rendering.keeps_running(parent, found):
            # a refusal this operator adds applies to new generations only: the child keeps running
            current = rendering.refused_but_running(kind.resource.kind, kind.child.kind, key[2], key[1], err.errors,
                                                    found, meta.get("generation", 0), previous, self.clock())
            if await self.writes.write(kind, parent, previous, current):
                log.warning("%s %s/%s is refused by this operator; its %s, made for this generation, keeps running: %s",
                            kind.resource.kind, key[1], key[2], kind.child.kind, err)
            return "invalid"
        current = statuses.invalid(err.errors, meta.get("generation", 0), previous, self.clock())
        if await self.writes.write(kind, parent, previous, current):
            METRICS.validation_failed(kind.resource.kind)
            log.warning("%s %s/%s is invalid: %s", kind.resource.kind, meta.get("namespace"), meta.get("name"), err)
        return "invalid"
