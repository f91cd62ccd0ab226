"""The hang sentinel (spec.hangDetection): whether the running attempt hangs, where its workers are,
and the HangSentinel condition. Pure functions.

Two signs, both read from the Ray job driver's log at the progress read (every ~30 s, status/
progress.py READ_INTERVAL, which bounds how soon the operator can tell):
- a worker's watchdog printed its stacks (watchdog.py: HANG_MARKER lines): no step ended within its
  limit. The attempt ends at once, the workers' innermost frames in the status and an Event;
- no new progress for the ceiling (firstStepTimeoutSeconds) plus two reads since the attempt's last
  step (or, before its first, since it began running), while the log was read after that: the
  workers printed nothing (a process that holds the GIL, or one frozen), so the attempt ends
  without frames. A log that cannot be read decides nothing.

A script that never reported progress (tputorch.train.report()) arms nothing: the condition says so.
The attempt's start is when the slice became ready (SliceReady's lastTransitionTime): a report
read before it was an earlier attempt's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from .. import timestamps
from ..api.job import HangDetection, JobSpec
from ..api.phases import HANG_SENTINEL, SLICE_READY
from ..watchdog import HANG_MARKER, MAX_FRAME_TEXT, MAX_HANG_FRAMES
from . import attempts as tries
from .conditions import ARMED, NO_PROGRESS_REPORTED, WAITING_FOR_FIRST_REPORT, condition
from .progress import MAX_LOG_BYTES, READ_INTERVAL

MAX_DUMPS = 8  # workers whose frames the status names (the lowest ranks)
FRAMES_SHOWN = 3  # innermost frames per worker in the message
MAX_LINE = 4096


@dataclass(frozen=True)
class Dump:
    """One worker's watchdog line: where its training thread was when no step ended in time."""

    rank: int | None
    step: int | None
    waited_s: int
    limit_s: int
    frames: tuple[str, ...]  # innermost first


@dataclass(frozen=True)
class Seen:
    """What the progress reads of the current attempt's driver log saw (controller/progressreads.py)."""

    source: tuple[str, str]  # (RayCluster, submission id): the attempt whose log it is
    read_at: str  # the last successful read, RFC 3339
    progressed_at: str | None = None  # the read that last brought a new report
    dumps: tuple[Dump, ...] = field(default=())


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53 else None


def parse_line(line: str) -> Dump | None:
    """The dump of one log line (Ray prefixes a worker's lines with its actor), or None."""
    at = line.find(HANG_MARKER)
    if at < 0 or len(line) - at > MAX_LINE:
        return None
    try:
        record, _ = json.JSONDecoder().raw_decode(line[at + len(HANG_MARKER):].lstrip())
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    frames = record.get("frames")
    if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
        return None
    waited, limit = _count(record.get("waitedS")), _count(record.get("limitS"))
    if waited is None or limit is None:
        return None
    clean = tuple("".join(c if c.isprintable() else "?" for c in f[:MAX_FRAME_TEXT]) for f in frames[:MAX_HANG_FRAMES])
    return Dump(_count(record.get("rank")), _count(record.get("step")), waited, limit, clean)


def parse(log: str) -> tuple[Dump, ...]:
    """Every worker's latest dump in the tail of a driver log, by rank."""
    by_rank: dict[int | None, Dump] = {}
    for line in log[-MAX_LOG_BYTES:].splitlines():
        dump = parse_line(line)
        if dump is not None:
            by_rank[dump.rank] = dump
    return tuple(sorted(by_rank.values(), key=lambda d: (d.rank is None, d.rank or 0)))


def where(dumps: tuple[Dump, ...]) -> str:
    """Where the workers are, for the status and the Event."""
    shown = []
    for d in dumps[:MAX_DUMPS]:
        rank = f"rank {d.rank}" if d.rank is not None else "a worker"
        shown.append(f"{rank} (after step {d.step}, {d.waited_s}s, limit {d.limit_s}s) at "
                     + (" <- ".join(d.frames[:FRAMES_SHOWN]) or "no Python frame"))
    more = f"; {len(dumps) - MAX_DUMPS} more" if len(dumps) > MAX_DUMPS else ""
    return "; ".join(shown) + more


def running_since(status: Mapping) -> str | None:
    """When the current attempt began running: its slice became ready (None: it is not running)."""
    if status.get("phase") != "Running":
        return None
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == SLICE_READY and c.get("status") == "True":
            return c.get("lastTransitionTime")
    return None


def last_step(status: Mapping, seen: Seen | None, since: str) -> str | None:
    """When this attempt's last step was reported (read): None before its first."""
    start = timestamps.parse(since)
    found = [t for t in ((status.get("progress") or {}).get("reportedAt"), seen.progressed_at if seen else None)
             if timestamps.parse(t) is not None]
    latest = max(found, key=timestamps.parse, default=None)
    return latest if latest is not None and start is not None and timestamps.parse(latest) >= start else None


def ending(h: HangDetection, status: Mapping, seen: Seen | None, now: str) -> tries.Ending | None:
    """The running attempt's end as a hang, or None. ``status``: the job's status as last written
    (the attempt Running in it); ``seen``: the reads of this attempt's driver log (None: none yet)."""
    since = running_since(status)
    if since is None or seen is None:
        return None
    last = last_step(status, seen, since)
    if last is None and not status.get("progress"):
        return None  # a script that never reported: not armed (the condition says so)
    hung_since = last or since
    if seen.dumps:
        return tries.Ending(tries.HANG, tries.HUNG, f"no training step ended in time: {where(seen.dumps)}", hung_since)
    start, read = timestamps.parse(hung_since), timestamps.parse(seen.read_at)
    waited = (read - start).total_seconds() if start is not None and read is not None else None
    bound = h.first_step_timeout_s + 2 * READ_INTERVAL
    if waited is None or waited < bound:
        return None
    what = "the attempt's first step" if last is None else "a step"
    return tries.Ending(tries.HANG, tries.HUNG,
                        f"no progress for {int(waited)}s: {what} did not end within {h.first_step_timeout_s}s "
                        f"(spec.hangDetection.firstStepTimeoutSeconds) and no worker printed its stacks (a process "
                        f"that holds the GIL, or is frozen)", hung_since)


def hang_condition(job: JobSpec, phase: str, history: list[dict], number: int, status: Mapping, now: str,
                   generation: int) -> dict | None:
    """HangSentinel, for a job with spec.hangDetection: Armed while the running attempt's steps are
    watched; WaitingForFirstReport until the script first reported progress, NoProgressReported
    once it has run past the first step's floor without any (nothing can be watched); Hung once an
    attempt ended as a hang, until the next one runs. ``status``: as last written."""
    h = job.hang_detection
    if h is None:
        return None
    last = history[-1] if history else None
    if last is not None and last.get("result") == tries.HANG and (phase != "Running" or last.get("attempt") == number):
        return condition(HANG_SENTINEL, False, tries.HUNG, f"attempt {last.get('attempt')} hung: {last.get('message')}",
                         generation)
    if phase != "Running":
        return None
    if not status.get("progress"):
        start, clock = timestamps.parse(running_since(status)), timestamps.parse(now)
        if start is not None and clock is not None and (clock - start).total_seconds() >= h.first_step_timeout_s:
            return condition(HANG_SENTINEL, False, NO_PROGRESS_REPORTED,
                             f"the script has reported no progress through tputorch.train.report() in "
                             f"{h.first_step_timeout_s}s of running: without steps the hang sentinel cannot tell a hang "
                             f"from a long step, so it is not armed", generation)
        return condition(HANG_SENTINEL, False, WAITING_FOR_FIRST_REPORT,
                         "armed by the script's first tputorch.train.report(); a script that never reports is not watched",
                         generation)
    return condition(HANG_SENTINEL, True, ARMED,
                     f"attempt {number}: a step that does not end within {h.timeout_s}s (or {h.step_time_multiple} x "
                     f"the median step time, at most {h.first_step_timeout_s}s, the first step's floor) ends the attempt "
                     f"as a hang; the operator reads progress every ~{int(READ_INTERVAL)}s", generation)
