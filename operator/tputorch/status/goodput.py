"""The goodput ledger (status.goodput): where a TPUTorchJob's wall-clock went, per attempt and for
the job. Pure functions; the controller calls ``apply`` once the progress read is in the status.

An attempt's time runs from its start (the TPUTorchJob's creation for the first, the previous
attempt's end for the next) to its end through a chain of moments, each an observed timestamp:
its RayJob's creation, Kueue's admission, the last pod scheduled, the last pod Ready (Ray up), the
first progress report, the last report read. The time between two consecutive moments is the part
that step of the chain names; the moments are kept in the status (``marks``) as they are first
seen, since a level-based reconcile sees only the present. Where a moment was never observed, the
time between the moments observed around it is ``unaccounted``: no part is what is left of another,
and the parts and ``unaccounted`` sum to the wall-clock exactly (in milliseconds). Inside the
chain's last two steps the script's own clock (train.StepClock) splits the time: the first step's
restore, then the steps, the checkpoint saves and, for a failed attempt, the lost work (the steps
after its last checkpoint, costed by its step time).

The figures run to the last moment observed, never to the reconcile's clock: a status that changed
at every reconcile would be written at every reconcile.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .. import timestamps
from ..api.status_schema import GOODPUT_MOMENTS, GOODPUT_PARTS, MAX_HISTORY
from .attempts import APPLICATION, FINAL, HANG, INFRASTRUCTURE, SUCCEEDED
from .job import attempt_of_child
from .kueue import Admission
# The chain of moments; the part named for the step from each moment to the next (the last two
# steps are split by the script's clock, the tail by how the attempt ended).
PARTS = tuple(GOODPUT_PARTS)
CHAIN = (*GOODPUT_MOMENTS, "firstReport", "lastReport", "end")  # the first ones kept in status.goodput.marks
STEP_PARTS = {"start": "teardown", "created": "queued", "admitted": "provisioning", "scheduled": "start"}
# An attempt's tail, from its last report to its end, by how it ended: hanging (the sentinel ended
# it: status/attempts.py HANG, status/hang.py); a succeeded run's end (the script's last lines, Ray
# Train's and the driver's shutdown, KubeRay's notice), counted with the slice time between runs; a
# failed attempt's work in flight, lost with it (the next attempt redoes it from the checkpoint). A
# running attempt (no result) has no tail: it runs to its last moment observed.
TAIL_PARTS = {HANG: "hang", SUCCEEDED: "teardown", INFRASTRUCTURE: "lostWork", APPLICATION: "lostWork",
              FINAL: "lostWork"}


def _ms(value: object) -> int | None:
    """An RFC 3339 timestamp as UNIX milliseconds (None: absent or not a time)."""
    seconds = timestamps.seconds(value)
    return None if seconds is None else int(round(seconds * 1000))


def _stamp(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Ledger:
    """One attempt's (or the job's) wall-clock and its parts, in milliseconds."""

    wall_ms: int
    parts: dict = field(default_factory=dict)  # PARTS -> ms; they sum to wall_ms

    def seconds(self) -> dict:
        return {p: round(self.parts.get(p, 0) / 1000, 3) for p in PARTS}

    def __add__(self, other: "Ledger") -> "Ledger":
        return Ledger(self.wall_ms + other.wall_ms, {p: self.parts.get(p, 0) + other.parts.get(p, 0) for p in PARTS})


def attempt_ledger(marks: Mapping, timing: Mapping | None = None, step: int | None = None,
                   end: str | None = None, result: str | None = None, hung_since: str | None = None) -> Ledger:
    """One attempt's ledger. ``marks``: its moments as first observed (RFC 3339; ``start`` always),
    ``restoreSeconds`` the restore its first report counted; ``timing``: status.progress.timing of
    its latest report read (None: no report of this attempt), ``step`` that report's step; ``end``:
    when it ended (None: it runs, and the ledger runs to its last moment observed); ``result``: how
    it ended (attemptHistory), ``hung_since`` when a hang began by the sentinel (its record's
    hungSince: the last report's read, or the slice's readiness before any)."""
    when = {name: _ms(marks.get(name)) for name in GOODPUT_MOMENTS}
    if timing:
        # the earliest process's: a process Ray Train restarted within the attempt begins its own clock
        when["firstReport"] = min(int(round(timing["firstReportTime"] * 1000)), _ms(marks.get("firstReport")) or 2**63)
        when["lastReport"] = int(round(timing["time"] * 1000))
    elif result == HANG:  # hung before its first report (the compile, say): from the sentinel's start
        when["lastReport"] = _ms(hung_since)
    when["end"] = _ms(end)
    observed = [n for n in CHAIN if when.get(n) is not None]
    if when["end"] is None:  # running: up to its latest moment
        when["end"] = max(when[n] for n in observed)
        observed.append("end")
    # Clocks differ (the API server's, the script's host's): a moment before the one it follows is
    # taken at that one, so the steps are never negative and still sum to end - start.
    times, last = {}, when["start"]
    for n in observed:
        last = min(max(last, when[n]), when["end"])
        times[n] = last
    parts = dict.fromkeys(PARTS, 0)
    for a, b in zip(observed, observed[1:]):
        span = times[b] - times[a]
        if CHAIN.index(b) != CHAIN.index(a) + 1:
            parts["unaccounted"] += span  # a moment between them was not observed
        elif a in STEP_PARTS:
            parts[STEP_PARTS[a]] += span
        elif a == "rayUp":  # Ray up -> first report: the driver's start, the restore, the compile
            restore = min(span, _ms_of(marks.get("restoreSeconds")))
            parts["restore"] += restore
            parts["firstStep"] += span - restore
        elif a == "firstReport":  # the script's clock: steps and checkpoint saves, all of it counted
            save = min(span, _ms_of(timing.get("checkpointSaveSeconds")))
            productive = min(span - save, _ms_of(timing.get("stepSeconds")))
            parts["checkpointSave"] += save
            parts["productive"] += productive
            parts["unaccounted"] += span - save - productive  # another process's time (a worker restart)
        else:  # the last report -> the end: the attempt's tail, both ends observed
            parts[TAIL_PARTS.get(result, "unaccounted")] += span
    if result not in (None, SUCCEEDED) and timing:
        lost = parts["productive"]  # without a checkpoint of its own, the next attempt redoes every step
        if timing.get("checkpointStep") is not None and step is not None and timing.get("secondsPerStep") is not None:
            lost = min(lost, _ms_of(max(0, step - timing["checkpointStep"]) * timing["secondsPerStep"]))
        parts["productive"] -= lost
        parts["lostWork"] += lost
    return Ledger(times["end"] - times["start"], parts)


def _ms_of(seconds: object) -> int:
    return int(round(seconds * 1000)) if isinstance(seconds, (int, float)) and seconds > 0 else 0


# --- what is observed of the current attempt ------------------------------------------------------


def _condition_time(pod: Mapping, ctype: str) -> int | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return _ms(cond.get("lastTransitionTime"))
    return None


def observe(marks: Mapping, rayjob: Mapping | None, pods: Iterable[Mapping], queue: Admission | None,
            slice_up: bool) -> dict:
    """``marks`` with the moments seen now added (a moment seen before stays): the RayJob's
    creation, Kueue's admission (the creation without a queue: nothing queued it), and once the
    slice is up (``slice_up``: every TPU host Ready) the last pod scheduled and the last one Ready."""
    out = dict(marks)
    if rayjob is None or attempt_of_child(rayjob) != marks.get("attempt"):
        return out  # an earlier attempt's RayJob, or none yet: nothing of this attempt to see
    created = (rayjob.get("metadata") or {}).get("creationTimestamp")
    if created and "created" not in out:
        out["created"] = created
    if "admitted" not in out:
        admitted = created if queue is None else (queue.admitted_at if queue.admitted else None)
        if admitted:
            out["admitted"] = admitted
    pods = list(pods)
    if slice_up and pods and "rayUp" not in out:
        scheduled = [_condition_time(p, "PodScheduled") for p in pods]
        ready = [_condition_time(p, "Ready") for p in pods]
        if None not in scheduled and None not in ready:
            out["scheduled"], out["rayUp"] = _stamp(max(scheduled)), _stamp(max(ready))
    return out


def _timing_of(status: Mapping, number: int) -> tuple[dict | None, int | None]:
    """The progress read's timing and step, when that report is attempt ``number``'s."""
    progress = status.get("progress") or {}
    timing = progress.get("timing")
    if isinstance(timing, Mapping) and timing.get("attempt") == number:
        return dict(timing), progress.get("step")
    return None, None


# --- the status -----------------------------------------------------------------------------------


def by_queue(jobs: Iterable[Mapping], wall_key: str) -> dict[tuple[str, str], dict[str, float]]:
    """status.goodput's seconds summed per (namespace, spec.queueName or ""), every part (and the
    wall-clock, under ``wall_key``) present, 0 included: the series of a metric never come and go."""
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for job in jobs:
        book = (job.get("status") or {}).get("goodput")
        if not isinstance(book, Mapping):
            continue
        where = ((job.get("metadata") or {}).get("namespace") or "", (job.get("spec") or {}).get("queueName") or "")
        total = sums.setdefault(where, dict.fromkeys((*PARTS, wall_key), 0.0))
        for part in PARTS:
            total[part] += _ms_of((book.get("seconds") or {}).get(part)) / 1000
        total[wall_key] += _ms_of(book.get("wallClockSeconds")) / 1000
    return sums


def _first_marks(current: Mapping, job_created: str) -> tuple[dict, dict]:
    """The ledger's start: the first attempt from the job's creation, or, for a job further on when
    its ledger begins (an operator upgrade), the current attempt from the previous one's end, the
    time before it ``unaccounted`` among the ended attempts' (nothing observed of it is kept)."""
    number = current.get("attempts") if isinstance(current.get("attempts"), int) and current["attempts"] > 1 else 1
    before = next((a.get("endTime") for a in current.get("attemptHistory") or [] if a.get("attempt") == number - 1), None)
    start, created = _ms(before), _ms(job_created)
    if start is None or created is None or start <= created:
        return {"attempt": number, "start": job_created}, {}
    earlier = Ledger(start - created, {"unaccounted": start - created})
    return {"attempt": number, "start": before}, {"ended": {"wallClockSeconds": earlier.wall_ms / 1000,
                                                            "seconds": earlier.seconds()}}


def _as_of(marks: Mapping, running: Ledger | None, ended_at: str | None, before: str | None) -> str | None:
    """The last moment the figures reach: the running attempt's latest, else the end just closed."""
    if running is not None and _ms(marks.get("start")) is not None:
        return _stamp(_ms(marks["start"]) + running.wall_ms)
    return _stamp(_ms(ended_at)) if _ms(ended_at) is not None else before


def _ledger_of(book: Mapping, key: str) -> Ledger:
    saved = book.get(key) or {}
    return Ledger(_ms_of(saved.get("wallClockSeconds")), {p: _ms_of((saved.get("seconds") or {}).get(p)) for p in PARTS})


def _record(number: int, ledger: Ledger, start: str, result: str | None = None) -> dict:
    out = {"attempt": number, "startTime": start, "wallClockSeconds": round(ledger.wall_ms / 1000, 3),
           "seconds": ledger.seconds()}
    if result:
        out["result"] = result
    return out


def apply(current: dict, previous: Mapping, job_created: str | None, rayjob: Mapping | None,
          pods: Iterable[Mapping], queue: Admission | None) -> dict:
    """``current`` (the status derived now, the progress read in it) with status.goodput: the
    current attempt's moments brought up to date, an attempt that has ended (attemptHistory) closed
    into the ended attempts' sums, and the figures per attempt (the first and the latest
    MAX_HISTORY) and for the job."""
    book = dict(previous.get("goodput") or {})
    marks = dict(book.get("marks") or {})
    if not marks.get("start"):
        if not job_created:
            return current
        marks, book = _first_marks(current, job_created)
    ended = _ledger_of(book, "ended")
    # The current attempt's figures are made again below; a job that has ended keeps them all as they are.
    kept = [dict(a) for a in book.get("attempts") or [] if marks.get("ended") or a.get("attempt") != marks["attempt"]]
    slice_up = current.get("readyHosts", 0) >= current.get("hosts", 1) > 0
    marks = observe(marks, rayjob, pods, queue, slice_up)
    timing, step = _timing_of(current, marks["attempt"])
    if timing is not None and "restoreSeconds" not in marks:
        marks["restoreSeconds"] = timing.get("restoreSeconds", 0)  # the first process's restore
        marks["firstReport"] = _stamp(int(round(timing["firstReportTime"] * 1000)))
    record = next((a for a in current.get("attemptHistory") or [] if a.get("attempt") == marks["attempt"]), None)
    closed_at = None
    if record is not None and not marks.get("ended"):
        closed_at = record.get("endTime")
        closed = attempt_ledger(marks, timing, step, record.get("endTime"), record.get("result"), record.get("hungSince"))
        ended = ended + closed
        kept.append(_record(marks["attempt"], closed, marks["start"], record.get("result")))
        if current.get("attempts", 1) > marks["attempt"]:
            marks = {"attempt": current["attempts"], "start": record.get("endTime")}
            timing, step = _timing_of(current, marks["attempt"])  # the report read was the ended attempt's
        else:  # the job has ended: its figures stay as they are
            marks = {**marks, "ended": True}
    running = None if marks.get("ended") else attempt_ledger(marks, timing, step)
    if running is not None:
        kept.append(_record(marks["attempt"], running, marks["start"]))
    total = ended + running if running is not None else ended
    if len(kept) > MAX_HISTORY:
        kept = kept[:1] + kept[-(MAX_HISTORY - 1):]
    out = dict(current)
    out["goodput"] = {
        "productiveFraction": round(total.parts["productive"] / total.wall_ms, 4) if total.wall_ms > 0 else 0.0,
        "wallClockSeconds": round(total.wall_ms / 1000, 3),
        "asOf": _as_of(marks, running, closed_at, book.get("asOf")),
        "seconds": total.seconds(),
        "attempts": kept,
        "ended": {"wallClockSeconds": round(ended.wall_ms / 1000, 3), "seconds": ended.seconds()},
        "marks": marks,
    }
    return out
