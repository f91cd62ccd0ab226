"""Step: the status write, within its budget (a progress-only write at most once per interval; a
phase change at once; an object's first status after the creates of a burst), and sticky terminal
phases (a finished object's status never goes back). Its state: the status written but not yet
seen back, when each object was last written, since when its first status has waited, and the
terminal status each object reached."""

from __future__ import annotations

import logging
import time
from typing import Callable

from kubernetes.client.rest import ApiException

from .. import status as statuses
from ..api.phases import TERMINAL_PHASES
from .events import EventRecorder
from .kind import Kind, gone_or_replaced
from .metrics import METRICS

log = logging.getLogger("tputorch")

# The status write budget: at most one progress-only status write per object per this many seconds
# (`tputorch run --status-interval`); a phase change is written at once.
STATUS_INTERVAL = 2.0

# In a burst an object's first status waits while other objects wait for their reconcile, at most
# this long: their creates (the RayJob a slice starts from) go to the API server first (issue 40).
FIRST_STATUS_HOLD = 2.0


def progress_only(previous: dict, current: dict) -> bool:
    """The change says how far the object got (host counts, messages, KubeRay's fields, a condition
    on the way), not where it is: same phase, same observed generation, same attempt."""
    return (previous.get("phase"), previous.get("observedGeneration"), previous.get("attempts")) == \
        (current.get("phase"), current.get("observedGeneration"), current.get("attempts"))


def write_delay(previous: dict, current: dict, last_write: float | None, now: float, interval: float) -> float:
    """Seconds to put a status write off (0: write now). A phase change, a new generation, or the
    first write this process makes for the object goes at once; progress waits until ``interval``
    has passed since the object's last write, and is then written as it is by then."""
    if last_write is None or interval <= 0 or not progress_only(previous, current):
        return 0.0
    return max(0.0, last_write + interval - now)


def first_status_waits(previous: dict, others_waiting: bool, held_for: float, hold: float) -> bool:
    """An object's first status (it has none yet) waits while other objects wait for their
    reconcile, for at most ``hold`` seconds in all."""
    return not previous and others_waiting and held_for < hold


class StatusWrites:
    def __init__(self, kube, recorder: EventRecorder, requeue: Callable[[tuple, float], None],
                 interval: float = STATUS_INTERVAL, monotonic: Callable[[], float] = time.monotonic,
                 others_waiting: Callable[[], bool] = lambda: False,
                 park: Callable[[tuple, float], None] | None = None, hold: float = FIRST_STATUS_HOLD) -> None:
        self.kube, self.recorder, self.requeue = kube, recorder, requeue  # requeue(key, after seconds)
        self.interval, self.monotonic = interval, monotonic
        # park(key, at most seconds): the key comes back once no other key waits (workqueue.py)
        self.others_waiting, self.park, self.hold = others_waiting, park, hold
        self.written: dict[str, tuple[str, dict]] = {}  # uid -> (resourceVersion it was derived from, status)
        self.last_write: dict[str, float] = {}  # uid -> when its status was last written (monotonic)
        self.held_since: dict[str, float] = {}  # uid -> since when its first status has waited (monotonic)
        self.terminal: dict[str, dict] = {}  # uid -> the terminal status it reached (never goes back)

    def keys(self) -> set:
        return set()  # kept by uid: dropped through forget

    def forget(self, key, uid: str | None) -> None:
        for state in (self.written, self.last_write, self.held_since, self.terminal):
            state.pop(uid, None)

    def previous(self, parent: dict) -> dict:
        """The status as it is now: the object's own, or the one this operator wrote from this very
        version of the object when its echo has not arrived yet. A status edited or wiped by
        someone else is a newer version, so it is what gets compared (and put right)."""
        meta = parent["metadata"]
        written = self.written.get(meta.get("uid"))
        if written is not None:
            if written[0] == meta.get("resourceVersion"):
                return written[1]
            del self.written[meta["uid"]]
        return dict(parent.get("status") or {})

    def terminal_of(self, kind: Kind, parent: dict) -> dict | None:
        """The terminal status this very object (uid) reached, as its status says or as this
        operator read or wrote it: kept in memory too, so that a status wiped or rolled back meanwhile does
        not make a finished job run again."""
        uid = parent["metadata"].get("uid")
        previous = self.previous(parent)
        if kind.finished(previous):
            self.terminal[uid] = previous
            return previous
        return self.terminal.get(uid)

    def never_back_from_terminal(self, kind: Kind, parent: dict, current: dict) -> dict:
        """A finished object's status never goes back to a running phase: a child seen late (a new
        leader whose child watch lags, a stale version) must not turn Succeeded into Running."""
        terminal = self.terminal_of(kind, parent)
        if terminal is None or current.get("phase") in TERMINAL_PHASES:
            return current
        if current.get("phase") != terminal.get("phase"):
            log.info("%s %s/%s: %s derived from a stale %s; keeping %s", kind.resource.kind,
                     parent["metadata"].get("namespace"), parent["metadata"].get("name"), current.get("phase"),
                     kind.child.kind, terminal.get("phase"))
        return terminal

    async def write(self, kind: Kind, parent: dict, previous: dict, current: dict, at_once: bool = False,
                    first_may_wait: bool = False) -> bool:
        meta = parent["metadata"]
        patch = statuses.patch_for(previous, current)
        if patch is None:
            return False
        namespace, name = meta["namespace"], meta["name"]
        if first_may_wait and self._hold_first(kind, meta, previous):
            return False
        if not at_once and self._put_off(kind, meta, previous, current):
            return False
        try:
            await self.kube.patch_status(kind.resource, namespace, name, patch, uid=meta.get("uid"))
        except ApiException as err:
            if gone_or_replaced(err):
                return False  # deleted meanwhile, or deleted and made again (its uid differs)
            raise
        self.written[meta["uid"]] = (meta.get("resourceVersion"), current)
        self.last_write[meta["uid"]] = self.monotonic()
        self.held_since.pop(meta["uid"], None)
        if kind.finished(current):  # not only from statuses read: the written cache is dropped by any rv bump
            self.terminal[meta["uid"]] = current
        METRICS.status_patched(kind.resource.kind)
        regarding = {"apiVersion": kind.resource.api_version, "kind": kind.resource.kind, "name": name,
                     "namespace": namespace, "uid": meta.get("uid")}
        self.recorder.record(regarding, statuses.events(previous, current))
        if previous.get("phase") != current.get("phase"):
            log.info("%s %s/%s: phase %s (%s)", kind.resource.kind, namespace, name, current.get("phase"),
                     (current.get("message") or "")[:200])
        return True

    def _put_off(self, kind: Kind, meta: dict, previous: dict, current: dict) -> bool:
        """The status write budget: a progress-only write within ``interval`` of the object's last
        one waits; its key comes back when the interval is over and writes what holds then
        (level-based: the newest counts, never a lost update)."""
        delay = write_delay(previous, current, self.last_write.get(meta.get("uid")), self.monotonic(), self.interval)
        if delay <= 0:
            return False
        self.requeue((kind.resource.kind, meta["namespace"], meta["name"]), delay)
        METRICS.status_put_off(kind.resource.kind)
        return True

    def _hold_first(self, kind: Kind, meta: dict, previous: dict) -> bool:
        """A burst: this object's first status waits until no other object waits for its reconcile
        (the key is parked in the queue), at most ``hold`` seconds from its first wait."""
        if self.park is None:
            return False
        now, uid = self.monotonic(), meta.get("uid")
        held_for = now - self.held_since.get(uid, now)
        if not first_status_waits(previous, self.others_waiting(), held_for, self.hold):
            return False
        self.held_since.setdefault(uid, now)
        self.park((kind.resource.kind, meta["namespace"], meta["name"]), self.hold - held_for)
        METRICS.status_put_off(kind.resource.kind)
        return True
