"""kopf registrations. Each handler is a few lines; decisions are in spec/render/status.

One level-based reconcile, run on every event of a TPUTorchJob and of its RayJob: make the RayJob
exist, then derive status from what the watches hold. Status follows the RayJob (our own watch,
rayjobs.py) and its pods (a kopf index), so a child's change reaches the parent without a GET.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from . import crd, render, spec as specs, status as statuses
from .rayjobs import RayJobWatch
from .metrics import METRICS, serve

log = logging.getLogger("tputorch")

RAYJOB = ("ray.io", "v1", "rayjobs")
JOB = (crd.GROUP, crd.VERSION, crd.PLURAL)
OURS = {render.MANAGED_BY_LABEL: render.MANAGED_BY}
RETRY_SECONDS = 30  # after a failed RayJob create (besides the retry when KubeRay's kind appears)
EVENT_SOURCE = "tputorch.io/operator"  # reportingController of our Events


@dataclass
class Config:
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    # Threads for the (blocking) kubernetes client: RayJob calls, and status patches + events on
    # their own few threads so that in a burst they never queue ahead of RayJob creates. Measured
    # (bench/RESULTS.md, run 5): 8 + 4 creates 30-40 % more RayJobs per second than 16 shared,
    # at the same or lower latency; 4 + 2 quadruples the p50.
    api_workers: int = 8
    report_workers: int = 4
    namespaces: list[str] | None = None  # None: all namespaces


CONFIG = Config()


class Kube:
    """The few API calls the operator makes, run in threads (the kubernetes client is blocking)."""

    def __init__(self, workers: int, report_workers: int) -> None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        cfg = client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = workers + report_workers
        api = client.ApiClient(cfg)
        self.custom = client.CustomObjectsApi(api)
        self.events = client.EventsV1Api(api)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.report_pool = ThreadPoolExecutor(max_workers=report_workers, thread_name_prefix="report")

    async def _run(self, fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(self.pool, lambda: fn(*args, **kwargs))

    async def create_rayjob(self, namespace: str, body: dict) -> dict:
        return await self._run(self.custom.create_namespaced_custom_object, *RAYJOB[:2], namespace, RAYJOB[2], body)

    async def get_rayjob(self, namespace: str, name: str) -> dict:
        return await self._run(self.custom.get_namespaced_custom_object, *RAYJOB[:2], namespace, RAYJOB[2], name)

    async def patch_rayjob(self, namespace: str, name: str, patch: dict) -> None:
        await self._run(self.custom.patch_namespaced_custom_object, *RAYJOB[:2], namespace, RAYJOB[2], name, patch)

    async def _report(self, fn, *args) -> None:
        """A status patch or an event, on the report threads. The answer is not parsed (that costs
        more CPU than the request), only drained so that the connection goes back to the pool."""
        def call():
            answer = fn(*args, _preload_content=False)
            answer.drain_conn()
            answer.release_conn()
        await asyncio.get_running_loop().run_in_executor(self.report_pool, call)

    async def patch_status(self, namespace: str, name: str, status: dict) -> None:
        await self._report(self.custom.patch_namespaced_custom_object_status, *JOB[:2], namespace, JOB[2], name,
                           {"status": status})

    async def post_event(self, namespace: str, name: str, uid: str | None, event: statuses.Event) -> None:
        """An events.k8s.io/v1 Event on the TPUTorchJob (`kubectl describe` and `kubectl get events`
        show it like a core/v1 one). Not CoreV1Api: importing it costs the operator 20 MB."""
        body = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            # A name as client-go gives it (the events API refuses generateName "<name>.").
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "regarding": {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": name, "namespace": namespace,
                          "uid": uid},
            "type": event.type, "reason": event.reason, "note": event.message[:1024], "action": "Reconcile",
            "eventTime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": EVENT_SOURCE, "reportingInstance": socket.gethostname()[:128],
        }
        await self._report(self.events.create_namespaced_event, namespace, body)


class State:
    """What the operator remembers between events (all rebuilt from the API after a restart)."""

    def __init__(self) -> None:
        self.kube: Kube | None = None
        self.locks: dict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.written: dict[str, dict] = {}  # uid -> last status we wrote (newer than the watch)
        self.parsed: dict[str, tuple] = {}  # uid -> (spec version, JobSpec or InvalidSpec), see _parse
        self.create_errors: dict[tuple[str, str], tuple[str, str]] = {}
        self.phases: dict[str, str] = {}  # uid -> phase, for the jobs-by-phase gauge
        self.rayjobs: RayJobWatch | None = None  # our RayJobs by (namespace, job), see rayjobs.py
        self.tputorchjobs = None  # kopf indexes, captured at startup for the RayJob watch's callback
        self.job_pods = None
        self.dispatcher: asyncio.Task | None = None
        self.retries: dict[tuple[str, str], asyncio.Task] = {}  # pending retries of failed creates


STATE = State()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- startup -------------------------------------------------------------------------------


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf builds a diff base (a deep copy of the object) on every event for its change handlers.
    This operator registers none (one on.event reconcile, see job_event), so it builds nothing
    (4 % of the operator's CPU in a burst's profile). Adding on.create/on.update handlers would
    need kopf's AnnotationsDiffBaseStorage back (tests/unit/test_handlers.py checks there are none)."""

    def build(self, *, body, extra_fields=None):
        return {}

    def fetch(self, *, body):
        return None

    def store(self, *, body, patch, essence) -> None:
        pass


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, tputorchjobs: kopf.Index, job_pods: kopf.Index, **_) -> None:
    # kopf's own per-handler events would double ours; keep them for problems only.
    settings.posting.level = logging.WARNING
    # Watches end server-side every few minutes and are re-established; a silent connection is
    # dropped after the inactivity timeout instead of hanging forever.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    settings.watching.inactivity_timeout = 330
    # Only event handlers and indexes are registered, so kopf keeps no handler progress or diff
    # base on the objects; progress would go to annotations, never into status (the schema would
    # prune it).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=crd.GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    STATE.kube = Kube(CONFIG.api_workers, CONFIG.report_workers)
    METRICS.phases = lambda: dict(Counter(STATE.phases.values()))
    STATE.tputorchjobs, STATE.job_pods = tputorchjobs, job_pods
    STATE.rayjobs = RayJobWatch(STATE.kube.custom, CONFIG.namespaces, _rayjob_changed, asyncio.get_running_loop())
    STATE.rayjobs.start()
    STATE.dispatcher = asyncio.create_task(STATE.rayjobs.dispatch())
    # The first reconcile of each existing job must see its RayJob: wait for the first listing
    # (or "not served"), or a restarted operator would try to create them all again.
    if not await asyncio.get_running_loop().run_in_executor(None, STATE.rayjobs.wait_listed, 60):
        log.warning("RayJobs not listed within 60s; going on")
    if CONFIG.metrics_port is not None:
        await serve(CONFIG.metrics_host, CONFIG.metrics_port)
        log.info("metrics on %s:%s/metrics", CONFIG.metrics_host, CONFIG.metrics_port)


# --- indexes: the latest TPUTorchJobs, their RayJobs and pods, keyed by (namespace, job) ----


@kopf.index(*JOB)
def tputorchjobs(namespace, name, body, **_):
    return {(namespace, name): {"apiVersion": crd.API_VERSION, "kind": crd.KIND,
                                "metadata": _slim(body.metadata), "spec": dict(body.spec),
                                "status": dict(body.status)}}


@kopf.index("", "v1", "pods", labels={render.JOB_LABEL: kopf.PRESENT})
def job_pods(namespace, name, labels, status, **_):
    # Only what status.derive reads: the pod's role and its conditions (scheduled, ready).
    role = {statuses.ROLE_LABEL: labels[statuses.ROLE_LABEL]} if statuses.ROLE_LABEL in labels else {}
    return {(namespace, labels[render.JOB_LABEL]): {
        "metadata": {"name": name, "labels": role},
        "status": {"conditions": list(status.get("conditions") or [])},
    }}


def _slim(metadata) -> dict:
    """Metadata without what the operator never reads (managedFields, kubectl's and kopf's copies
    of the whole object): a third of the memory per job at 1000 jobs."""
    return {k: v for k, v in metadata.items() if k not in ("managedFields", "annotations")}


def _one(index: kopf.Index, key):
    store = index.get(key)
    return next(iter(store), None) if store else None


# --- the reconcile -------------------------------------------------------------------------


@kopf.on.event(*JOB)
async def job_event(event, body, namespace, name, uid, job_pods: kopf.Index, **_):
    """One level-based reconcile for every change of a TPUTorchJob (and its initial listing, which
    is the resume after a restart). Not kopf's create/update/resume handlers: those write a
    diff-base annotation per job and cost an extra write and watch event each (bench/RESULTS.md)."""
    if event["type"] == "DELETED":
        _forget(uid, namespace, name)  # no finalizer: the garbage collector deletes the children
        return
    await _reconcile_logged(dict(body), namespace, name, job_pods)


async def _reconcile_logged(body: dict, namespace: str, name: str, job_pods) -> None:
    started = time.perf_counter()
    try:
        result = await _reconcile(body, namespace, name, STATE.rayjobs, job_pods)
    except ApiException as err:  # e.g. the API server restarting: try again shortly
        log.warning("TPUTorchJob %s/%s: reconcile failed (HTTP %s %s); retrying in %ss", namespace, name,
                    err.status, err.reason, RETRY_SECONDS)
        result = "retry"
    if result == "retry":
        _retry_later(namespace, name)
    METRICS.reconciled(result, time.perf_counter() - started)


def _retry_later(namespace: str, name: str) -> None:
    """Reconcile the job again after RETRY_SECONDS (one pending retry per job), from the index."""
    key = (namespace, name)
    if key in STATE.retries and not STATE.retries[key].done():
        return

    async def again() -> None:
        await asyncio.sleep(RETRY_SECONDS)
        STATE.retries.pop(key, None)
        parent = _one(STATE.tputorchjobs, key)
        if parent is not None:
            await _reconcile_logged(parent, namespace, name, STATE.job_pods)

    STATE.retries[key] = asyncio.create_task(again())


def _forget(uid: str, namespace: str, name: str) -> None:
    STATE.written.pop(uid, None)
    STATE.parsed.pop(uid, None)
    STATE.phases.pop(uid, None)
    STATE.create_errors.pop((namespace, name), None)
    STATE.locks.pop((namespace, name), None)
    retry = STATE.retries.pop((namespace, name), None)
    if retry is not None:
        retry.cancel()


async def _rayjob_changed(kind: str, obj: dict) -> None:
    """A change seen by the RayJob watch (rayjobs.py), run on the operator's event loop."""
    rayjobs, job_pods, tputorchjobs = STATE.rayjobs, STATE.job_pods, STATE.tputorchjobs
    if kind == "SERVED":
        # KubeRay's CRDs were installed: create the RayJobs that could not be created so far.
        for key in [k for k in STATE.create_errors if _one(rayjobs, k) is None]:
            parent = _one(tputorchjobs, key)
            if parent is not None:
                await _reconcile_logged(parent, key[0], key[1], job_pods)
        return
    namespace = obj["metadata"]["namespace"]
    job = (obj["metadata"].get("labels") or {}).get(render.JOB_LABEL)
    parent = _one(tputorchjobs, (namespace, job))
    if parent is None:
        return
    # Level-based: a deleted RayJob is recreated unless the job finished or is being deleted, an
    # edited suspend is put back; _reconcile decides both.
    await _reconcile_logged(parent, namespace, job, job_pods)


@kopf.on.event("", "v1", "pods", labels={render.JOB_LABEL: kopf.PRESENT})
async def pod_event(namespace, labels, job_pods: kopf.Index, tputorchjobs: kopf.Index, **_):
    job = labels[render.JOB_LABEL]
    parent = _one(tputorchjobs, (namespace, job))
    if parent is not None:
        await _refresh(parent, namespace, job, STATE.rayjobs, job_pods)


@kopf.on.cleanup()
def stop_watch(**_) -> None:
    if STATE.rayjobs is not None:
        STATE.rayjobs.stop()
    if STATE.dispatcher is not None:
        STATE.dispatcher.cancel()


def _parse(body: dict, namespace: str) -> specs.JobSpec:
    """The job's spec, parsed once per version of it: every status write and RayJob change
    reconciles again. The API server bumps metadata.generation on every spec change; labels are
    metadata, so they are part of the key."""
    meta = body["metadata"]
    version = (meta.get("generation"), tuple(sorted((meta.get("labels") or {}).items())))
    cached = STATE.parsed.get(meta.get("uid"))
    if cached is None or cached[0] != version:
        try:
            # The namespace the object lives in, whatever its body says.
            cached = (version, specs.parse({**body, "metadata": {**meta, "namespace": namespace}}))
        except specs.InvalidSpec as err:
            cached = (version, err)
        if meta.get("uid"):
            STATE.parsed[meta["uid"]] = cached
    if isinstance(cached[1], specs.InvalidSpec):
        raise cached[1]
    return cached[1]


async def _reconcile(body: dict, namespace: str, name: str, rayjobs, job_pods) -> str:
    if body["metadata"].get("deletionTimestamp"):
        return "deleting"  # the garbage collector removes the children; create nothing now
    try:
        job = _parse(body, namespace)
    except specs.InvalidSpec as err:
        await _write_invalid(body, namespace, name, err)
        return "invalid"
    observed = _one(rayjobs, (namespace, name))
    if observed is None and statuses.finished(_previous(body)):
        # The job ran and its RayJob is gone (deleted after the end): creating one would train again.
        return "finished"
    if observed is None:
        # First create, or a RayJob deleted behind our back before the job finished: (re)create.
        result = await _create(body, job, namespace, name)
    else:
        result = await _sync_suspend(job, observed, namespace, name)
    await _refresh(body, namespace, name, rayjobs, job_pods, job=job)
    return result


async def _create(body: dict, job: specs.JobSpec, namespace: str, name: str) -> str:
    desired = render.rayjob(job)
    kopf.adopt(desired, owner=body)  # ownerReference + the owner's namespace, whatever the spec says
    desired["metadata"]["namespace"] = namespace
    try:
        created = await STATE.kube.create_rayjob(namespace, desired)
    except ApiException as err:
        if err.status == 409:
            return await _adopt_existing(body, namespace, name)
        STATE.create_errors[(namespace, name)] = _create_problem(err)
        log.warning("RayJob %s/%s not created: %s", namespace, name, STATE.create_errors[(namespace, name)][1])
        return "retry"
    STATE.create_errors.pop((namespace, name), None)
    if isinstance(created, dict):
        STATE.rayjobs.remember(created)
    log.info("RayJob %s/%s created for a %s %s slice (%d hosts, %d workers)", namespace, name,
             job.slice.generation.name, job.slice.topology, job.slice.hosts, job.workers)
    return "created"


async def _adopt_existing(body: dict, namespace: str, name: str) -> str:
    """The create answered 409: ours (its watch event is late) or someone else's RayJob."""
    existing = await STATE.kube.get_rayjob(namespace, name)
    owners = (existing.get("metadata") or {}).get("ownerReferences") or []
    if any(o.get("uid") == body["metadata"].get("uid") for o in owners):
        STATE.create_errors.pop((namespace, name), None)
        STATE.rayjobs.remember(existing)
        return "exists"
    STATE.create_errors[(namespace, name)] = (
        "RayJobNameTaken",
        f"a RayJob named {name} already exists in {namespace} and does not belong to this TPUTorchJob: "
        "delete that RayJob or give the TPUTorchJob another name",
    )
    return "retry"


def _create_problem(err: ApiException) -> tuple[str, str]:
    if err.status == 404:
        return ("KubeRayNotInstalled", "the RayJob kind (ray.io/v1) is not served: install KubeRay's CRDs "
                "and operator; the RayJob will be created once they exist")
    if err.status == 403:
        return ("Forbidden", f"the operator may not create RayJobs here: {err.reason}")
    return ("RayJobCreateFailed", f"creating the RayJob failed: HTTP {err.status} {err.reason}: {(err.body or '')[:500]}")


async def _sync_suspend(job: specs.JobSpec, observed: dict, namespace: str, name: str) -> str:
    # spec.tpu is immutable (CRD rule); suspend is the one field a live RayJob takes.
    if bool((observed.get("spec") or {}).get("suspend")) == job.suspend:
        return "unchanged"
    await STATE.kube.patch_rayjob(namespace, name, {"spec": {"suspend": job.suspend}})
    log.info("RayJob %s/%s suspend set to %s", namespace, name, job.suspend)
    return "suspend-changed"


async def _write_invalid(body: dict, namespace: str, name: str, err: specs.InvalidSpec) -> None:
    async with STATE.locks[(namespace, name)]:
        previous = _previous(body)
        current = statuses.invalid(err.errors, body["metadata"].get("generation", 0), previous, _now())
        if await _patch(body, namespace, name, previous, current):
            METRICS.validation_failed()
            log.warning("TPUTorchJob %s/%s is invalid: %s", namespace, name, err)


async def _refresh(body: dict, namespace: str, name: str, rayjobs, job_pods, job: specs.JobSpec | None = None) -> None:
    """Derive the status from the indexes and patch it if it changed."""
    if job is None:
        try:
            job = _parse(body, namespace)
        except specs.InvalidSpec:
            return  # the reconcile reported it
    async with STATE.locks[(namespace, name)]:
        previous = _previous(body)
        current = statuses.derive(
            job,
            body["metadata"].get("generation", 0),
            _one(rayjobs, (namespace, name)),
            list(job_pods.get((namespace, name)) or []),
            previous,
            _now(),
            STATE.create_errors.get((namespace, name)),
        )
        await _patch(body, namespace, name, previous, current)


def _previous(body: dict) -> dict:
    return STATE.written.get(body["metadata"].get("uid")) or dict(body.get("status") or {})


async def _patch(body: dict, namespace: str, name: str, previous: dict, current: dict) -> bool:
    patch = statuses.patch_for(previous, current)
    if patch is None:
        return False
    try:
        await STATE.kube.patch_status(namespace, name, patch)
    except ApiException as err:
        if err.status == 404:
            return False  # deleted meanwhile
        raise
    uid = body["metadata"].get("uid")
    STATE.written[uid] = current
    STATE.phases[uid] = current["phase"]
    METRICS.status_patched()
    for event in statuses.events(previous, current):
        try:
            await STATE.kube.post_event(namespace, name, uid, event)
        except Exception as err:  # an event is a courtesy: never fail the reconcile for it
            log.warning("TPUTorchJob %s/%s: event %s not posted: %s", namespace, name, event.reason, err)
    log.info("TPUTorchJob %s/%s: phase %s (%s)", namespace, name, current["phase"], current["message"][:200])
    return True
