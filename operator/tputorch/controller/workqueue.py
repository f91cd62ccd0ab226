"""A rate-limited work queue of object keys, after client-go's workqueue, on asyncio.

- A key is queued at most once (the dirty set): a burst of events for one object coalesces into
  one reconcile.
- A key is handed to one worker at a time (the processing set): a key added while it is being
  reconciled is queued again when that reconcile is done, never run twice at once.
- ``retry(key)`` re-adds the key after a per-key exponential backoff, capped; ``forget(key)``
  resets it after a success. Only the earliest pending delayed add of a key is kept.
- A key made ready wakes one waiting worker, not all of them (as a condition variable's signal).
- ``add_when_idle(key, max_wait)`` parks a key until no key waits in the queue (or ``max_wait``
  has passed): work that can follow the others' (a job's first status write in a burst) does not
  compete with them. An add of a parked key changes nothing: it is reconciled when let out.
- Retries of all keys together also draw on one token bucket (client-go's default controller rate
  limiter is the larger of the two delays): when many objects fail at once, as in an API-server
  outage, their retries are spread out instead of all landing on the recovering server together.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from typing import Hashable


class Backoff:
    """Per-key exponential backoff: base * 2**failures, at most cap (client-go's per-item limiter),
    times 1 + jitter * a random fraction (so that many keys or replicas do not retry in step)."""

    def __init__(self, base: float = 1.0, cap: float = 300.0, jitter: float = 0.0) -> None:
        self.base, self.cap, self.jitter = base, cap, jitter
        self.failures: dict[Hashable, int] = {}

    def next(self, key: Hashable) -> float:
        n = self.failures.get(key, 0)
        self.failures[key] = n + 1
        delay = min(self.base * (2 ** min(n, 32)), self.cap)
        return delay * (1 + self.jitter * random.random()) if self.jitter else delay

    def forget(self, key: Hashable) -> None:
        self.failures.pop(key, None)


class Bucket:
    """A token bucket for every key's retries together: ``burst`` at once, then ``rate`` per second.
    ``reserve()`` takes a token, possibly one not there yet, and says how long until it is."""

    def __init__(self, rate: float = 10.0, burst: int = 100, clock=time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.stamp = float(burst), clock()

    def reserve(self) -> float:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate) - 1
        self.stamp = now
        return max(0.0, -self.tokens / self.rate)


class WorkQueue:
    def __init__(self, backoff: Backoff | None = None, metrics=None, bucket: Bucket | None = None) -> None:
        self.backoff = backoff or Backoff()
        self.bucket = bucket or Bucket()
        self.metrics = metrics  # metrics.Metrics, or None
        self._added_at: dict[Hashable, float] = {}
        self._queue: deque = deque()
        self._dirty: set = set()
        self._processing: set = set()
        self._timers: dict[Hashable, tuple[float, asyncio.TimerHandle]] = {}
        self._waiters: deque[asyncio.Future] = deque()  # idle workers in get(), oldest first
        self._parked: dict[Hashable, asyncio.TimerHandle] = {}  # key -> its max_wait timer
        self._released: set = set()  # keys let out of parking, until a worker takes them

    def __len__(self) -> int:
        return len(self._queue)

    def busy(self) -> bool:
        """Keys wait for a worker, besides those just let out of parking (which must not park
        each other again)."""
        return len(self._queue) > len(self._released)

    def add(self, key: Hashable) -> None:
        if key in self._dirty or key in self._parked:
            return  # a parked key comes when the queue runs dry: it is reconciled from what holds then
        self._dirty.add(key)
        if self.metrics is not None:
            self.metrics.queue_adds.inc()
            self._added_at[key] = time.monotonic()
        if key not in self._processing:
            self._queue.append(key)
            self._wake_one()

    def add_after(self, key: Hashable, delay: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= when:
                return  # an earlier add is already due
            pending[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

    def add_when_idle(self, key: Hashable, max_wait: float) -> None:
        """Add ``key`` once no key waits in the queue, or after ``max_wait`` seconds at the latest."""
        if key not in self._parked:
            self._parked[key] = asyncio.get_running_loop().call_later(max_wait, self._unpark, key)
        if not self._queue:
            self._unpark_all()

    def _unpark(self, key: Hashable) -> None:
        timer = self._parked.pop(key, None)
        if timer is not None:
            timer.cancel()
            self._released.add(key)
            self.add(key)

    def _unpark_all(self) -> None:
        for key in list(self._parked):
            self._unpark(key)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: Hashable) -> float:
        """Re-add ``key`` after its backoff, or later if the retries of all keys are over budget;
        returns the delay."""
        delay = max(self.backoff.next(key), self.bucket.reserve())
        self.add_after(key, delay)
        if self.metrics is not None:
            self.metrics.queue_retries.inc()
        return delay

    def forget(self, key: Hashable) -> None:
        """The key's last reconcile succeeded: its next failure starts from the base delay."""
        self.backoff.forget(key)

    def drop(self, key: Hashable) -> None:
        """The object is gone: no backoff state and no pending delayed add is kept for it."""
        self.backoff.forget(key)
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        parked = self._parked.pop(key, None)
        if parked is not None:
            parked.cancel()
        self._released.discard(key)

    def known(self) -> set:
        """Keys the queue holds any state for (for the sweep after a re-list)."""
        return set(self.backoff.failures) | set(self._timers) | set(self._parked)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> Hashable:
        while not self._queue:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled before it ran: the key is someone else's
                raise
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        self._released.discard(key)
        if not self._queue:
            self._unpark_all()  # no key waits any more: what was parked behind them goes now
        added = self._added_at.pop(key, None)
        if added is not None and self.metrics is not None:
            self.metrics.queue_wait.observe(time.monotonic() - added)
        return key

    def done(self, key: Hashable) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._wake_one()
