"""kopf registrations: the operator's start and stop. The work is in reconcile.py.

kopf runs the process (its loop, signals, the liveness endpoint); the operator reads the API through
informers of its own (informer.py says why) and reconciles from one rate-limited work queue. With
leader election on, the stores fill on every replica but only the leader's workers run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

import kopf

from ..render.names import MANAGED_BY, MANAGED_BY_LABEL
from ..render.network import NetworkPolicyConfig
from ..status import kueue
from . import crdcheck, health, kinds as kinds_, stores
from .informer import Informer, scopes_for
from .rest import RestSource, pods_path
from .dashboard import Dashboard
from .raytoken import RayTokens
from .kube import Kube, load_config
from .leader import Election, KubeLeaseApi
from .metrics import METRICS, serve
from ..status.progress import READ_INTERVAL
from ..api.common import MAX_PODS_DEFAULT
from .kind import CRD, WORKLOAD, WORKLOAD_PRIORITY_CLASS
from .reconcile import Controller
from .writes import STATUS_INTERVAL

log = logging.getLogger("tputorch")

SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
SYNC_TIMEOUT = 60  # seconds between the log lines that name the stores still not listed
SYNC_DEADLINE = 300  # the required stores are waited for this long; then the operator runs with what it has
OPTIONAL_SYNC_WAIT = 30  # the optional ones (Kueue's, NetworkPolicies) this long


@dataclass
class Config:
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    # Threads for the (blocking) kubernetes client: child calls, and status patches + events on
    # their own few threads so that in a burst they never queue ahead of creates (bench/RESULTS.md).
    api_workers: int = 8
    report_workers: int = 4
    reconcile_workers: int = 16  # keys reconciled at once (each key by one worker at a time)
    status_interval: float = STATUS_INTERVAL  # seconds between progress-only status writes of one object
    progress_interval: float = READ_INTERVAL  # seconds between reads of a running job's driver log (0: none)
    namespaces: list[str] | None = None  # None: all namespaces
    max_pods_per_job: int = MAX_PODS_DEFAULT  # the most pods one object may make (api/common.check_pods)
    # A NetworkPolicy per Ray cluster (its own pods, the dashboard, the peers); None: none.
    network_policy: NetworkPolicyConfig | None = NetworkPolicyConfig()
    ray_token_key_file: str | None = None  # the key Ray tokens are derived from (controller/raytoken.py)
    ray_token_previous_key_file: str | None = None  # the key before a rotation, still tried on a refusal
    leader_election: bool = False
    lease_name: str = "tputorch-operator"
    lease_namespace: str | None = None  # default: the pod's namespace
    readiness: tuple[str, int, str] | None = None  # (host, port, path) of the readiness endpoint


CONFIG = Config()


class Runtime:
    """What the running operator holds; rebuilt from the API on every start."""

    def __init__(self) -> None:
        self.controller: Controller | None = None
        self.informers: list[Informer] = []
        self.workers: list[asyncio.Task] = []
        self.election: Election | None = None
        self.syncing: asyncio.Task | None = None  # waits for the stores, then leads or runs
        self.required: list[Informer] = []  # the stores every decision reads
        self.optional: list[Informer] = []  # the stores only some decisions read
        self.metrics = None  # the /metrics server's runner, once it serves
        self.readiness = None  # the readiness server's runner, once it serves
        self.crd_check: asyncio.Task | None = None  # whether the cluster's CRDs are this release's (once)


RUNTIME = Runtime()


def build(kube, source_for, loop: asyncio.AbstractEventLoop, namespaces: list[str] | None,
          status_interval: float = STATUS_INTERVAL, extras: list | None = None, dashboard=None,
          progress_interval: float = READ_INTERVAL, ray_tokens: RayTokens | None = None,
          max_pods: int = MAX_PODS_DEFAULT) -> Controller:
    """The controller and its informers, wired: each informer's changes reach the controller on
    the event loop. ``source_for(path, label_selector[, field_selector])`` makes an informer's Source."""
    def on_loop(fn, *head):
        return lambda event, obj: loop.call_soon_threadsafe(fn, *head, event, obj)

    kinds = kinds_.bounded(kinds_.KINDS, max_pods)
    controller = Controller(kinds, kube, {}, {}, None, status_interval=status_interval, extras=extras or [],
                            dashboard=dashboard, progress_interval=progress_interval, ray_tokens=ray_tokens)
    for extra in controller.extras.extras:  # its owner's key is in its labels, as a pod's
        controller.extra_stores[extra.resource.plural] = Informer(
            extra.resource.plural, source_for(extra.resource.path, SELECTOR), namespaces,
            on_loop(controller.pod_changed), stores.slim_extra, keep=stores.keep_extra)
    for kind in kinds:
        name = kind.resource.kind
        controller.parents[name] = Informer(kind.resource.plural, source_for(kind.resource.path, None), namespaces,
                                            on_loop(controller.parent_changed, name), stores.parent_slimmer(kind))
        controller.children[name] = Informer(kind.child.plural, source_for(kind.child.path, SELECTOR), namespaces,
                                             on_loop(controller.child_changed, name), kind.slim_child)
    controller.pods = Informer("pods", source_for(pods_path, SELECTOR), namespaces, on_loop(controller.pod_changed),
                               stores.slim_pod, index=stores.pod_index, keep=stores.keep_pod)
    # Kueue's: Workloads carry none of our labels (watched whole, kept slim); priority classes are
    # cluster-scoped. Both are "not served" until Kueue is installed, which is fine.
    controller.workloads = Informer("Kueue Workloads", source_for(WORKLOAD.path, None), namespaces,
                                    on_loop(controller.workload_changed), stores.slim_workload,
                                    index=stores.workload_index)
    controller.priority_classes = Informer("Kueue WorkloadPriorityClasses", source_for(WORKLOAD_PRIORITY_CLASS.path, None),
                                           None, on_loop(controller.priority_class_changed), stores.slim_name)
    # Kueue's Workload CRD, by name: its schema's cap on pod sets per Workload bounds a queued job's groups.
    controller.workload_crd = Informer("Kueue's Workload CRD", source_for(CRD.path, None, f"metadata.name={kueue.WORKLOAD_CRD}"),
                                       None, on_loop(controller.workload_crd_changed), stores.slim_workload_crd)
    return controller


def _lease_namespace() -> str:
    if CONFIG.lease_namespace:
        return CONFIG.lease_namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return "default"


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, **_) -> None:
    """Idempotent: kopf runs a failed startup again (every 60 s), so each step is done once per
    process; a failure after the informers started (the metrics port taken) only retries what
    failed, never builds a second controller with a second set of stores."""
    # kopf's own per-handler events would double ours; keep them for problems only.
    settings.posting.level = logging.WARNING
    # kopf would otherwise list and watch every CRD of the cluster (and, namespaced, every
    # namespace) to serve handlers this operator does not have: the informers read what it needs
    # (kopf starts these observers only after the startup handlers, so this takes effect).
    settings.scanning.disabled = True
    loop = asyncio.get_running_loop()
    if RUNTIME.controller is None:
        start_controller(loop)
    if CONFIG.metrics_port is not None and RUNTIME.metrics is None:
        RUNTIME.metrics = await serve(CONFIG.metrics_host, CONFIG.metrics_port)
        log.info("metrics on %s:%s/metrics", CONFIG.metrics_host, CONFIG.metrics_port)
    if CONFIG.readiness is not None and RUNTIME.readiness is None:
        host, port, path = CONFIG.readiness
        RUNTIME.readiness = await health.serve(host, port, path, ready)
        log.info("readiness on %s:%s%s", host, port, path)


def start_controller(loop: asyncio.AbstractEventLoop) -> None:
    configuration = load_config()
    # each kind, its child, pods, Kueue's Workloads, priority classes and Workload CRD
    watches = (2 * len(kinds_.KINDS) + 4) * len(scopes_for(CONFIG.namespaces))
    kube = Kube(configuration, CONFIG.api_workers, CONFIG.report_workers, watches=watches)
    controller = build(
        kube, lambda path, *selectors: RestSource(kube.api_client, path, *selectors), loop, CONFIG.namespaces,
        CONFIG.status_interval, kinds_.extras(CONFIG.network_policy), Dashboard(), CONFIG.progress_interval,
        RayTokens.from_file(CONFIG.ray_token_key_file, CONFIG.ray_token_previous_key_file), CONFIG.max_pods_per_job)
    RUNTIME.required, RUNTIME.optional = required_stores(controller), optional_stores(controller)
    RUNTIME.informers = [*RUNTIME.required, *RUNTIME.optional]
    RUNTIME.controller = controller  # from here on, a startup run again builds nothing
    sources = METRICS.sources
    sources.phases, sources.tracked = controller.phases, lambda: len(controller.sweeps.uids)
    sources.goodput = controller.goodput
    sources.queue_depth, sources.leader = lambda: len(controller.queue), may_write
    sources.leader_transitions = lambda: RUNTIME.election.transitions if RUNTIME.election else 0
    sources.informers = lambda: {i.what: (i.relists, i.watch_restarts) for i in RUNTIME.informers}
    sources.listed = lambda: {i.what: i.synced.is_set() for i in RUNTIME.informers}
    for informer in RUNTIME.informers:
        informer.start()
    # Helm never upgrades a chart's crds/: say at once when the cluster's are an earlier release's
    # (the Event is posted once this replica leads and its event worker runs).
    RUNTIME.crd_check = loop.create_task(crdcheck.check(kube.read_crd, controller.recorder.record, crdcheck.own_pod()),
                                         name="crd-check")

    def start_workers() -> None:
        controller.activate()
        RUNTIME.workers = [loop.create_task(controller.work(), name=f"reconcile-{i}")
                           for i in range(CONFIG.reconcile_workers)]
        RUNTIME.workers.append(loop.create_task(controller.recorder.run(), name="events"))
        log.info("reconciling with %d workers", CONFIG.reconcile_workers)

    if CONFIG.leader_election:
        controller.active = False  # a standby queues nothing
        RUNTIME.election = Election(
            CONFIG.lease_name, _lease_namespace(), KubeLeaseApi(configuration),
            on_leading=lambda: loop.call_soon_threadsafe(start_workers), drain=kube.drain)
        kube.fence = RUNTIME.election.write_timeout  # no write once the last good renewal is too old
    # Outside kopf's startup, so that /healthz answers while the stores fill.
    RUNTIME.syncing = loop.create_task(sync_then_run(RUNTIME.required, start_workers, RUNTIME.optional), name="sync")


def required_stores(controller: Controller) -> list[Informer]:
    """What every decision reads: the kinds, their children, the Ray pods."""
    return [*controller.parents.values(), *controller.children.values(), controller.pods]


def optional_stores(controller: Controller) -> list[Informer]:
    """What only some decisions read, each of which goes on without it (Kueue's Workloads, priority
    classes and Workload CRD, the NetworkPolicies): never a gate for the required ones."""
    return [controller.workloads, controller.priority_classes, controller.workload_crd, *controller.extra_stores.values()]


async def wait_synced(informers: list[Informer], timeout: float) -> list[str]:
    """Wait for every store's first list, all at once, within one deadline; the stores that were
    not listed by then."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end and not all(i.synced.is_set() for i in informers):
        await asyncio.sleep(0.05)
    return [i.what for i in informers if not i.synced.is_set()]


async def sync_then_run(required: list[Informer], start_workers, optional: list[Informer] = (),
                        deadline: float | None = None, optional_wait: float | None = None) -> None:
    """Decide nothing before the stores hold what exists: a restarted operator would otherwise
    create children that exist, or write statuses from half the pods. The optional stores are
    waited for ``optional_wait`` at most, the required ones ``deadline``; then the operator runs
    with what it has and says what it lacks (readiness keeps naming it). Then lead (or run)."""
    deadline = SYNC_DEADLINE if deadline is None else deadline
    optional_wait = OPTIONAL_SYNC_WAIT if optional_wait is None else optional_wait
    loop = asyncio.get_running_loop()
    started, next_report = loop.time(), SYNC_TIMEOUT
    while True:
        elapsed = loop.time() - started
        waiting = health.not_listed(required) + (health.not_listed(optional) if elapsed < optional_wait else [])
        if not waiting or elapsed >= deadline:
            break
        if elapsed >= next_report:
            log.error("not listed within %.0fs: %s; still waiting (at most %.0fs)", elapsed,
                      ", ".join(map(health.describe, waiting)), deadline)
            next_report += SYNC_TIMEOUT
        await asyncio.sleep(0.05)
    elapsed = loop.time() - started
    lacking, degraded = health.not_listed(required), health.not_listed(optional)
    if lacking:
        log.error("running after %.0fs without a full list of: %s (readiness fails until they list)", elapsed,
                  ", ".join(map(health.describe, lacking)))
    if degraded:
        log.warning("running without %s (not listed after %.0fs; what needs it waits until it lists)",
                    ", ".join(map(health.describe, degraded)), elapsed)
    if not lacking and not degraded:
        log.info("every store listed in %.1fs", elapsed)
    if RUNTIME.election is not None:
        RUNTIME.election.start()  # a candidate only once it could lead with what exists
    else:
        start_workers()


def ready() -> tuple[bool, str]:
    return health.readiness(RUNTIME.required, RUNTIME.optional)


@kopf.on.probe(id="synced")
def synced(**_) -> bool:
    return RUNTIME.syncing is not None and RUNTIME.syncing.done()


@kopf.on.probe(id="not_listed")
def not_listed(**_) -> list[str]:
    """The stores never listed, by name (liveness only reports them; readiness fails on them)."""
    return [health.describe(s) for s in health.not_listed(RUNTIME.informers)]


def may_write() -> bool:
    return RUNTIME.election is None or RUNTIME.election.may_write()


@kopf.on.probe(id="leading")
def leading(**_) -> bool:
    return may_write()


@kopf.on.probe(id="election")
def election_health(**_) -> str:
    """/healthz fails (HTTP 500) when the Lease was lost or a leader's renewals stopped, as
    client-go's HealthzAdaptor: restarting the process is the way out."""
    election = RUNTIME.election
    if election is None:
        return "off"
    if not election.healthy():
        raise kopf.PermanentError(f"leader election of {election.identity} is stuck or lost")
    return "leading" if election.may_write() else "standby"


EVENTS_DRAIN_S = 5.0


async def drain_events(recorder, timeout: float) -> None:
    """Post the events the recorder still holds (it holds them while reconciles are queued), within
    ``timeout``: a rolling update would otherwise drop the events of the last transitions it saw."""
    try:
        await asyncio.wait_for(recorder.drain(), timeout)
    except asyncio.TimeoutError:
        log.warning("shutting down: %d events not posted within %gs", len(recorder.pending), timeout)


@kopf.on.cleanup()
async def stop(**_) -> None:
    if RUNTIME.syncing is not None:
        RUNTIME.syncing.cancel()
    for task in RUNTIME.workers:
        task.cancel()
    await asyncio.gather(*RUNTIME.workers, return_exceptions=True)
    if RUNTIME.controller is not None and may_write():  # while the Lease is still ours
        await drain_events(RUNTIME.controller.recorder, EVENTS_DRAIN_S)
    if RUNTIME.election is not None:  # only once no worker writes any more
        await asyncio.get_running_loop().run_in_executor(None, RUNTIME.election.release)
    for informer in RUNTIME.informers:
        informer.stop()
    for runner in (RUNTIME.metrics, RUNTIME.readiness):
        if runner is not None:
            await runner.cleanup()
    if RUNTIME.controller is not None and RUNTIME.controller.progress.dashboard is not None:
        for reads in (RUNTIME.controller.progress, RUNTIME.controller.slices):  # one dashboard client
            for task in list(reads.reading.values()):
                task.cancel()
        await RUNTIME.controller.progress.dashboard.close()
