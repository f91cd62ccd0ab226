"""Events off the critical path: recorded by the reconcile without waiting, posted by one
low-priority worker of their own.

- One event per transition: a status write that moves several conditions at once (hosts ready and
  the job running, written together by the coalescing in reconcile.py) is one change of the object
  and gets one event (``one_per_transition``).
- A budget per object and reason, as client-go's event broadcaster's spam filter: a token bucket
  (25 at once, one more every 5 minutes) per (object uid, reason); an event over it is dropped.
- Low priority: the worker posts only while no object waits for a reconcile (or once an event has
  waited ``max_hold`` seconds), on a thread of its own, so that a create or a status patch never
  queues behind an event. Pending events are bounded; the oldest goes first when full.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Awaitable, Callable

from .metrics import METRICS

log = logging.getLogger("tputorch")

# client-go's EventSourceObjectSpamFilter defaults (tools/record: defaultSpamBurst, defaultSpamQPS).
SPAM_BURST = 25
SPAM_REFILL_S = 300.0
MAX_PENDING = 10_000
MAX_HOLD_S = 10.0


def one_per_transition(events: list) -> object | None:
    """The one event a status write posts: the first Warning, else the last of the list (the phase's
    own, or the terminal condition's: ``Running`` rather than ``AllHostsReady``, ``JobSucceeded``
    rather than ``JobFinished``; status.events lists conditions in order and the phase last)."""
    if not events:
        return None
    return next((e for e in events if e.type == "Warning"), events[-1])


class SpamFilter:
    """A token bucket per key: ``burst`` at once, one more every ``refill_s`` seconds."""

    def __init__(self, burst: int = SPAM_BURST, refill_s: float = SPAM_REFILL_S) -> None:
        self.burst, self.refill_s = burst, refill_s
        self.buckets: dict[str, dict[str, tuple[float, float]]] = {}  # uid -> reason -> (tokens, at)

    def allow(self, uid: str, reason: str, now: float) -> bool:
        reasons = self.buckets.setdefault(uid, {})
        tokens, at = reasons.get(reason, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) / self.refill_s)
        if tokens < 1.0:
            reasons[reason] = (tokens, now)
            return False
        reasons[reason] = (tokens - 1.0, now)
        return True

    def forget(self, uid: str) -> None:
        self.buckets.pop(uid, None)


class EventRecorder:
    def __init__(self, post: Callable[[dict, object], Awaitable[None]], busy: Callable[[], bool] = lambda: False,
                 spam: SpamFilter | None = None, max_pending: int = MAX_PENDING, max_hold: float = MAX_HOLD_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.post = post
        self.busy = busy  # True while objects wait for a reconcile: events wait then
        self.spam = spam or SpamFilter()
        self.max_hold = max_hold
        self.monotonic = monotonic
        self.pending: deque[tuple[float, dict, object]] = deque(maxlen=max_pending)
        self._ready = asyncio.Event()

    def record(self, regarding: dict, events: list) -> None:
        """Called by the reconcile after a status write; never waits."""
        event = one_per_transition(events)
        if event is None:
            return
        now = self.monotonic()
        if not self.spam.allow(regarding.get("uid") or "", event.reason, now):
            METRICS.event_dropped("spam")
            return
        if len(self.pending) == self.pending.maxlen:
            METRICS.event_dropped("full")
        self.pending.append((now, regarding, event))
        self._ready.set()

    def forget(self, uid: str | None) -> None:
        if uid:
            self.spam.forget(uid)

    async def post_one(self) -> bool:
        """Post the oldest pending event; False when none is pending."""
        if not self.pending:
            return False
        _, regarding, event = self.pending.popleft()
        try:
            await self.post(regarding, event)
            METRICS.event_posted()
        except Exception as err:  # an event is a courtesy: never retried, never fails anything
            METRICS.event_dropped("error")
            log.warning("%s %s/%s: event %s not posted: %s", regarding.get("kind"), regarding.get("namespace"),
                        regarding.get("name"), event.reason, err)
        return True

    async def drain(self) -> None:
        while await self.post_one():
            pass

    async def run(self, poll: float = 0.1) -> None:
        """The worker: one event at a time, while the reconcile queue is idle or the oldest event has
        waited ``max_hold`` seconds."""
        while True:
            if not self.pending:
                self._ready.clear()
                await self._ready.wait()
                continue
            if self.busy() and self.monotonic() - self.pending[0][0] < self.max_hold:
                await asyncio.sleep(poll)
                continue
            await self.post_one()

