"""What every read of a Ray head's dashboard off the reconcile workers shares (a job's driver log:
progressreads.py; a multi-host service's placement groups: slicereads.py): at most one read per
interval per object, the first at once, one in flight, on a task of its own (a slow dashboard never
holds a reconcile worker); the cluster's token, the previous key's where the cluster refuses the
current one's; a failure logged once, and again only when it changes. Its state is kept per uid and
dropped through forget."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Awaitable, Callable, TypeVar

from ..status.progress import read_delay
from .dashboard import DashboardError
from .kind import Key
from .raytoken import RayTokens

log = logging.getLogger("tputorch")

T = TypeVar("T")
FAILED = object()  # what a read that failed returns (its failure is logged)


class DashboardReads:
    # What is read, in log lines: "<kind> <ns>/<name>: <what> not read from RayCluster <c>'s dashboard".
    what = "state"

    def __init__(self, dashboard, interval: float, ray_tokens: RayTokens, monotonic: Callable[[], float],
                 requeue: Callable[[Key, float], None], enqueue: Callable[[Key], None],
                 uid_of: Callable[[Key], str | None]) -> None:
        # None (or an interval <= 0) reads nothing.
        self.dashboard = dashboard if interval > 0 else None
        self.interval, self.ray_tokens, self.monotonic = interval, ray_tokens, monotonic
        # requeue(key, after seconds); enqueue(key): a read with news; uid_of(key): the object's uid now
        self.requeue, self.enqueue, self.uid_of = requeue, enqueue, uid_of
        self.read_at: dict[str, float] = {}  # uid -> when it was last read (monotonic)
        self.reading: dict[str, asyncio.Task] = {}  # uid -> its read in flight (one per object)
        self.failures: dict[str, str] = {}  # uid -> the last failure logged (logged again when it changes)

    def state(self) -> tuple[dict, ...]:
        """Every per-uid record of what was read (a subclass adds its own)."""
        return self.read_at, self.failures

    def keys(self) -> set[Key]:
        return set()  # kept by uid: dropped through forget

    def forget(self, key: Key, uid: str | None) -> None:
        for state in self.state():
            state.pop(uid, None)
        reading = self.reading.pop(uid, None)
        if reading is not None:
            reading.cancel()

    def schedule(self, key: Key, uid: str, read: Callable[[], Awaitable[None]]) -> None:
        """``read()`` started now on a task of its own when the interval since the last one is over
        and none is in flight; the key brought back for the next one (level-based: it needs no event)."""
        delay = read_delay(self.read_at.get(uid), self.monotonic(), self.interval)
        if uid in self.reading:
            delay = self.interval  # the read in flight brings the key back if it has news
        elif delay <= 0:
            self.read_at[uid] = self.monotonic()
            # A fresh context: the read is no call of this reconcile (reconcile_fenced's CALLS).
            self.reading[uid] = asyncio.get_running_loop().create_task(read(), context=contextvars.Context())
            delay = self.interval
        self.requeue(key, delay)

    async def with_token(self, namespace: str, secret_name: str | None,
                         call: Callable[[str | None], Awaitable[T]]) -> T:
        """``call(token)`` with the cluster's token: the current key's, then, where the cluster
        refuses it (made before a key rotation), the previous key's; no token without a Secret name."""
        *first, last = self.ray_tokens.candidates(namespace, secret_name) if secret_name else [None]
        for token in first:
            try:
                return await call(token)
            except DashboardError as err:
                if not err.token_refused:
                    raise
        return await call(last)

    def failed(self, key: Key, uid: str, cluster: str, failure: str, level: int = logging.WARNING) -> None:
        """A read that could not be made or answered: logged once (a warning unless said otherwise),
        then at debug while it stays the same failure."""
        level = logging.DEBUG if self.failures.get(uid) == failure else level
        self.failures[uid] = failure
        log.log(level, "%s %s/%s: %s not read from RayCluster %s's dashboard: %s", key[0], key[1], key[2],
                self.what, cluster, failure)

    async def fetch(self, key: Key, uid: str, cluster: str, call: Callable[[], Awaitable[T]]) -> T | object:
        """What ``call()`` answers, or FAILED (logged: unreachable, refused, 5xx, a timeout; the next
        interval tries again). The read is no longer in flight once it returns."""
        try:
            answer = await call()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failed(key, uid, cluster, f"{type(err).__name__}: {str(err)[:200]}")
            return FAILED
        finally:
            if self.reading.get(uid) is asyncio.current_task():
                del self.reading[uid]
        self.failures.pop(uid, None)
        return answer
