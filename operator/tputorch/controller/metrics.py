"""Prometheus metrics in the text exposition format, served by aiohttp (already a kopf dependency).

Small on purpose: counters, one histogram and a gauge computed at scrape time.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Callable

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reconciles: Counter[str] = Counter()  # by result
        self.validation_failures = 0
        self.status_patches = 0
        self.status_deferred = 0  # progress-only writes put off by the status write budget
        self.events_posted = 0
        self.events_dropped: Counter[str] = Counter()  # by why: spam, full, error
        self._bucket_counts = [0] * (len(DURATION_BUCKETS) + 1)
        self._duration_sum = 0.0
        self._duration_count = 0
        # gauge name -> phase -> objects, e.g. {"tputorch_jobs": {"Running": 3}}; counted from the
        # stores at scrape time, so only objects that exist are counted
        self.phases: Callable[[], dict[str, dict[str, int]]] = dict
        # name -> (help, value) of plain gauges read at scrape time
        self.gauges: Callable[[], dict[str, tuple[str, float]]] = dict

    def reconciled(self, result: str, seconds: float) -> None:
        with self._lock:
            self.reconciles[result] += 1
            self._bucket_counts[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
            self._duration_sum += seconds
            self._duration_count += 1

    def validation_failed(self) -> None:
        with self._lock:
            self.validation_failures += 1

    def status_patched(self) -> None:
        with self._lock:
            self.status_patches += 1

    def status_put_off(self) -> None:
        with self._lock:
            self.status_deferred += 1

    def event_posted(self) -> None:
        with self._lock:
            self.events_posted += 1

    def event_dropped(self, why: str) -> None:
        with self._lock:
            self.events_dropped[why] += 1

    def exposition(self) -> str:
        with self._lock:
            lines = [
                "# HELP tputorch_reconciles_total Reconciles by result.",
                "# TYPE tputorch_reconciles_total counter",
            ]
            for result in sorted(self.reconciles):
                lines.append(f'tputorch_reconciles_total{{result="{result}"}} {self.reconciles[result]}')
            lines += [
                "# HELP tputorch_reconcile_duration_seconds Time to reconcile one object.",
                "# TYPE tputorch_reconcile_duration_seconds histogram",
            ]
            cumulative = 0
            for bound, count in zip(DURATION_BUCKETS + (float("inf"),), self._bucket_counts):
                cumulative += count
                le = "+Inf" if bound == float("inf") else repr(bound)
                lines.append(f'tputorch_reconcile_duration_seconds_bucket{{le="{le}"}} {cumulative}')
            lines += [
                f"tputorch_reconcile_duration_seconds_sum {self._duration_sum}",
                f"tputorch_reconcile_duration_seconds_count {self._duration_count}",
                "# HELP tputorch_validation_failures_total TPUTorchJobs rejected by validation.",
                "# TYPE tputorch_validation_failures_total counter",
                f"tputorch_validation_failures_total {self.validation_failures}",
                "# HELP tputorch_status_patches_total Status patches written to TPUTorchJobs.",
                "# TYPE tputorch_status_patches_total counter",
                f"tputorch_status_patches_total {self.status_patches}",
                "# HELP tputorch_status_patches_deferred_total Progress-only status writes put off (coalesced).",
                "# TYPE tputorch_status_patches_deferred_total counter",
                f"tputorch_status_patches_deferred_total {self.status_deferred}",
                "# HELP tputorch_events_posted_total Events posted.",
                "# TYPE tputorch_events_posted_total counter",
                f"tputorch_events_posted_total {self.events_posted}",
                "# HELP tputorch_events_dropped_total Events not posted, by why (spam filter, queue full, error).",
                "# TYPE tputorch_events_dropped_total counter",
            ]
            for why in sorted(self.events_dropped):
                lines.append(f'tputorch_events_dropped_total{{why="{why}"}} {self.events_dropped[why]}')
        for gauge, counts in sorted(self.phases().items()):
            what = gauge.removeprefix("tputorch_")
            lines += [f"# HELP {gauge} Objects ({what}) by phase.", f"# TYPE {gauge} gauge"]
            for phase, count in sorted(counts.items()):
                lines.append(f'{gauge}{{phase="{phase}"}} {count}')
        for gauge, (text, value) in sorted(self.gauges().items()):
            lines += [f"# HELP {gauge} {text}", f"# TYPE {gauge} gauge", f"{gauge} {value}"]
        return "\n".join(lines) + "\n"


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
