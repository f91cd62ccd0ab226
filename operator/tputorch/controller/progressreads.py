"""Step: training progress, read from the Ray dashboard (dashboard.py) off the reconcile workers:
the newest report read goes into the status, and while the job runs its driver log is read again
once per interval. The same tail tells a Cloud Storage 403 (status/storage_access.py), kept for the
attempt it was read in, and feeds the hang sentinel (status/hang.py: the workers' watchdog dumps,
when the log was last read, when a report last came). Its state: when each object's log was last
read, the newest report read, the last 403 read, what the sentinel saw, the read in flight and the
last failure logged, per uid."""

from __future__ import annotations

import logging
from typing import Callable

from ..status import hang, progress as training, storage_access
from .dashboardreads import FAILED, DashboardReads
from .kind import Key, describe
from .raytoken import RayTokens

log = logging.getLogger("tputorch")


class ProgressReads(DashboardReads):
    what = "progress"

    def __init__(self, dashboard, interval: float, ray_tokens: RayTokens, clock: Callable[[], str],
                 monotonic: Callable[[], float], requeue: Callable[[Key, float], None],
                 enqueue: Callable[[Key], None], uid_of: Callable[[Key], str | None]) -> None:
        super().__init__(dashboard, interval, ray_tokens, monotonic, requeue, enqueue, uid_of)
        self.clock = clock
        self.reports: dict[str, training.Report] = {}  # uid -> the newest report read, until it is written
        self.denials: dict[str, tuple[object, storage_access.Denial]] = {}  # uid -> (attempt, the last 403 read)
        self.sentinel: dict[str, hang.Seen] = {}  # uid -> what the reads of its current driver log saw

    def state(self) -> tuple[dict, ...]:
        return (*super().state(), self.reports, self.denials, self.sentinel)

    def denial(self, uid: str | None, attempt: object) -> storage_access.Denial | None:
        """The last Cloud Storage 403 the driver's log showed in this attempt (a later one starts clean)."""
        seen = self.denials.get(uid)
        return seen[1] if seen is not None and seen[0] == attempt else None

    def seen(self, uid: str | None, status: dict) -> hang.Seen | None:
        """What the reads of the driver log ``status`` names saw (None: none of that attempt's yet)."""
        found = self.sentinel.get(uid) if uid else None
        return found if found is not None and found.source == training.source(status) else None

    def apply(self, key: Key, uid: str, current: dict, secret_name: str | None) -> dict:
        """The status with the newest report read in it; and, while the job runs, its driver log
        read again once per interval (on a task of its own: a slow dashboard never holds a
        reconcile worker). The read's result brings the key back."""
        if self.dashboard is None:
            return current
        current = training.apply(current, self.reports.get(uid), self.clock())
        where = training.source(current)
        if where is None:
            return current
        self.schedule(key, uid, lambda: self._read(key, uid, *where, secret_name, current.get("attempts")))
        return current

    async def _driver_log(self, namespace: str, cluster: str, submission_id: str, secret_name: str | None) -> str:
        """The driver's log tail, with the cluster's token: the current key's, then, where the cluster
        refuses it (made before a key rotation), the previous key's. Each request is bounded by the
        dashboard's own timeout (the wait for a slot is not)."""
        return await self.with_token(namespace, secret_name, lambda token: self.dashboard.driver_log(
            namespace, cluster, submission_id, token))

    async def _read(self, key: Key, uid: str, cluster: str, submission_id: str, secret_name: str | None,
                    attempt: object = None) -> None:
        log_tail = await self.fetch(key, uid, cluster, lambda: self._driver_log(key[1], cluster, submission_id,
                                                                                secret_name))
        if log_tail is FAILED:
            return
        try:
            report, denial, dumps = training.parse(log_tail), storage_access.find(log_tail), hang.parse(log_tail)
        except Exception as err:  # a bug here must not end the read task unlogged
            log.error("%s %s/%s: the progress read from RayCluster %s could not be parsed: %s", key[0], key[1],
                      key[2], cluster, describe(err))
            return
        if self.uid_of(key) != uid:
            return
        now, before = self.clock(), self.sentinel.get(uid)
        before = before if before is not None and before.source == (cluster, submission_id) else None
        news = reported = report is not None and report != self.reports.get(uid)
        if reported:
            self.reports[uid] = report
        if denial is not None and (attempt, denial) != self.denials.get(uid):
            self.denials[uid], news = (attempt, denial), True
        progressed = now if reported else (before.progressed_at if before else None)
        self.sentinel[uid] = hang.Seen((cluster, submission_id), now, progressed, dumps)
        if news or (dumps and (before is None or before.dumps != dumps)):
            self.enqueue(key)
