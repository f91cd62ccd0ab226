"""Prometheus metrics through prometheus_client, served by aiohttp (already a kopf dependency).

Counters and histograms are updated where things happen; what the stores, the queue, the informers
and the election hold is read at scrape time (``Metrics.sources``), so a gauge never drifts from
what exists. Every phase of a kind is emitted, 0 included (a dashboard's series do not vanish).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no *_created series: nobody reads them, and they double the lines

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
WAIT_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
WALL_CLOCK = "wallClock"  # Sources.goodput's key for the wall-clock beside the parts


@dataclass
class Sources:
    """What is read at scrape time; the handlers fill it in once the controller exists."""
    # gauge name -> phase -> objects, every phase of the kind included
    phases: Callable[[], dict[str, dict[str, int]]] = dict
    tracked: Callable[[], int] = lambda: 0
    queue_depth: Callable[[], int] = lambda: 0
    leader: Callable[[], bool] = lambda: True
    leader_transitions: Callable[[], int] = lambda: 0
    # informer (resource plural) -> (lists made, watches ended)
    informers: Callable[[], dict[str, tuple[int, int]]] = dict
    # informer -> whether its store was ever listed (a store that cannot list shows as 0)
    listed: Callable[[], dict[str, bool]] = dict
    # (namespace, queue) -> the goodput ledger's seconds by part, and "wallClock", summed over its jobs
    goodput: Callable[[], dict[tuple[str, str], dict[str, float]]] = dict
    extra: dict = field(default_factory=dict)


class _ScrapeTime:
    """A collector of the values read at scrape time."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self):
        s = self.sources
        for gauge, counts in sorted(s.phases().items()):
            family = GaugeMetricFamily(gauge, f"Objects ({gauge.removeprefix('tputorch_')}) by phase.",
                                       labels=["phase"])
            for phase, count in sorted(counts.items()):
                family.add_metric([phase], count)
            yield family
        yield GaugeMetricFamily("tputorch_tracked_objects",
                                "Objects the operator keeps state for (swept against what exists).", value=s.tracked())
        yield GaugeMetricFamily("tputorch_queue_depth", "Object keys waiting for a reconcile worker.",
                                value=s.queue_depth())
        yield GaugeMetricFamily("tputorch_leader",
                                "1 while this replica may write (it leads, or runs without leader election).",
                                value=int(s.leader()))
        yield CounterMetricFamily("tputorch_leader_transitions", "Times this replica became the leader.",
                                  value=s.leader_transitions())
        relists = CounterMetricFamily("tputorch_informer_relists", "Full lists made by an informer.",
                                      labels=["resource"])
        restarts = CounterMetricFamily("tputorch_informer_watch_restarts",
                                       "Watches that ended (server timeout, error, cut stream).", labels=["resource"])
        for resource, (lists, watches) in sorted(s.informers().items()):
            relists.add_metric([resource], lists)
            restarts.add_metric([resource], watches)
        yield relists
        yield restarts
        listed = GaugeMetricFamily("tputorch_informer_listed",
                                   "1 once an informer's store was listed; 0 while it cannot be (see the log).",
                                   labels=["resource"])
        for resource, ok in sorted(s.listed().items()):
            listed.add_metric([resource], int(ok))
        yield listed
        yield from _goodput(s.goodput())


def _goodput(sums: dict[tuple[str, str], dict[str, float]]):
    """The goodput ledger summed per namespace and Kueue queue (never one series per job); the label
    is job_namespace, since Prometheus keeps ``namespace`` for the operator's own target."""
    labels = ["job_namespace", "queue"]
    parts = GaugeMetricFamily("tputorch_goodput_seconds",
                              "The TPUTorchJobs' wall-clock by goodput ledger part (docs/tasks/goodput.md), summed over the "
                              "jobs that exist, per namespace and queue (\"\" without one).", labels=labels + ["part"])
    wall = GaugeMetricFamily("tputorch_goodput_wall_clock_seconds",
                             "The TPUTorchJobs' wall-clock the ledger covers (the sum of every part), per namespace "
                             "and queue.", labels=labels)
    for (namespace, queue), seconds in sorted(sums.items()):
        for part, value in seconds.items():
            if part == WALL_CLOCK:
                wall.add_metric([namespace, queue], value)
            else:
                parts.add_metric([namespace, queue, part], value)
    yield parts
    yield wall


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.reconciles = Counter("tputorch_reconciles", "Reconciles by kind and result.", ["kind", "result"],
                                  registry=r)
        self.reconcile_duration = Histogram("tputorch_reconcile_duration_seconds", "Time to reconcile one object.",
                                            ["kind"], buckets=DURATION_BUCKETS, registry=r)
        self.validation_failures = Counter("tputorch_validation_failures", "Objects rejected by validation, by kind.",
                                           ["kind"], registry=r)
        self.status_patches = Counter("tputorch_status_patches", "Status patches written, by kind.", ["kind"],
                                      registry=r)
        self.status_deferred = Counter("tputorch_status_patches_deferred",
                                       "Status writes put off, by kind: progress within the write budget "
                                       "(coalesced), or a first status while other objects wait (a burst).",
                                       ["kind"], registry=r)
        self.events_posted = Counter("tputorch_events_posted", "Events posted.", registry=r)
        self.events_dropped = Counter("tputorch_events_dropped",
                                      "Events not posted, by why (spam filter, queue full, error).", ["why"],
                                      registry=r)
        self.queue_adds = Counter("tputorch_workqueue_adds", "Keys added to the work queue (coalesced adds "
                                  "not counted).", registry=r)
        self.queue_retries = Counter("tputorch_workqueue_retries", "Keys re-queued with backoff.", registry=r)
        self.queue_wait = Histogram("tputorch_workqueue_queue_duration_seconds",
                                    "Seconds a key waited in the queue before a worker took it.",
                                    buckets=WAIT_BUCKETS, registry=r)
        self.api_requests = Counter("tputorch_api_requests", "API calls of the reconcile by verb and HTTP code "
                                    "(or the error's name when there was no answer).", ["verb", "code"], registry=r)
        self.api_duration = Histogram("tputorch_api_request_duration_seconds",
                                      "Seconds an API call of the reconcile took, answered or not, by verb and "
                                      "resource.", ["verb", "resource"], buckets=DURATION_BUCKETS, registry=r)
        self.sources = Sources()
        r.register(_ScrapeTime(self.sources))

    # --- what the code reports --------------------------------------------------------------------

    def reconciled(self, result: str, seconds: float, kind: str = "") -> None:
        self.reconciles.labels(kind, result).inc()
        self.reconcile_duration.labels(kind).observe(seconds)

    def validation_failed(self, kind: str) -> None:
        self.validation_failures.labels(kind).inc()

    def status_patched(self, kind: str) -> None:
        self.status_patches.labels(kind).inc()

    def status_put_off(self, kind: str) -> None:
        self.status_deferred.labels(kind).inc()

    def event_posted(self) -> None:
        self.events_posted.inc()

    def event_dropped(self, why: str) -> None:
        self.events_dropped.labels(why).inc()

    def api_call(self, verb: str, code: str, resource: str = "", seconds: float | None = None) -> None:
        self.api_requests.labels(verb, code).inc()
        if seconds is not None:
            self.api_duration.labels(verb, resource).observe(seconds)

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


METRICS = Metrics()


async def serve(host: str, port: int, metrics: Metrics = METRICS):
    """Start the /metrics endpoint; returns the aiohttp runner (call ``cleanup()`` to stop)."""
    from aiohttp import web

    async def handle(_request):
        return web.Response(text=metrics.exposition(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
