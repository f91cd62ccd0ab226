"""A running job's training progress (status.progress, status.lastCheckpoint), read from the tail
of its Ray job driver's log: the lines ``tputorch.train.report`` prints (PROGRESS_MARKER + JSON).

The log is the script's output, so nothing in it is trusted: the text read is bounded, a line that
is too long, not JSON, or not the shape report() writes is ignored, and what is kept is bounded by
the same limits report() applies. When and where to read is decided here too (pure); the HTTP call
is the controller's (controller/dashboard.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..train import (
    MAX_CHECKPOINT_PATH, MAX_METRIC_NAME, MAX_PROGRESS_LINE, MAX_PROGRESS_METRICS, PROGRESS_MARKER, TIMING_KEYS,
)

READ_INTERVAL = 30.0  # seconds between two reads of one job's driver log (`tputorch run --progress-interval`)
LOG_LINES = 200  # the tail asked for: report() lines are rare beside Ray Train's own output
MAX_LOG_BYTES = 256 * 1024  # of the tail, the last this many bytes are parsed
MAX_COUNT = 2**53  # step and epoch: JSON's exact integers
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_SUBMISSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Report:
    step: int | None
    epoch: int | None
    metrics: tuple[tuple[str, float | int], ...]  # in the order reported
    checkpoint: str | None
    timing: tuple[tuple[str, float | int], ...] = ()  # the line's "timing" (train.StepClock); () on an older line

    def progress(self) -> dict:
        """status.progress without reportedAt."""
        out: dict[str, Any] = {"metrics": dict(self.metrics)}
        if self.step is not None:
            out["step"] = self.step
        if self.epoch is not None:
            out["epoch"] = self.epoch
        if self.timing:
            out["timing"] = {STATUS_TIMING[k]: v for k, v in self.timing}
        return out


# The line's timing keys -> status.progress.timing's (api/status_schema.py).
STATUS_TIMING = {"attempt": "attempt", "at": "time", "first": "firstReportTime", "compute_s": "stepSeconds",
                 "checkpoint_s": "checkpointSaveSeconds", "restore_s": "restoreSeconds", "step_s": "secondsPerStep",
                 "checkpoint_step": "checkpointStep"}
_TIMING_COUNTS = {"attempt", "checkpoint_step"}
_TIMING_REQUIRED = {"attempt", "at", "first", "compute_s", "checkpoint_s", "restore_s"}


def _count(value: Any) -> tuple[bool, int | None]:
    if value is None:
        return True, None
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT
    return ok, value if ok else None


def _number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and (isinstance(value, float) or abs(value) < MAX_COUNT)


def parse_line(line: str) -> Report | None:
    """The report of one log line, or None if it holds none (or a malformed one)."""
    at = line.find(PROGRESS_MARKER)
    if at < 0:
        return None
    rest = line[at + len(PROGRESS_MARKER):]
    if len(rest) > MAX_PROGRESS_LINE + 64:  # the JSON, and an ANSI reset or a \r after it
        return None
    try:
        record, _ = json.JSONDecoder().raw_decode(rest.lstrip())
    except (ValueError, RecursionError):  # deeper than Python's decoder goes (a line of "[[[..."): no report
        return None
    if not isinstance(record, dict) or set(record) - {"step", "epoch", "metrics", "checkpoint", "timing"}:
        return None
    (step_ok, step), (epoch_ok, epoch) = _count(record.get("step")), _count(record.get("epoch"))
    metrics = record.get("metrics", {})
    checkpoint = record.get("checkpoint")
    if not (step_ok and epoch_ok and isinstance(metrics, dict) and len(metrics) <= MAX_PROGRESS_METRICS):
        return None
    if not all(isinstance(k, str) and 0 < len(k) <= MAX_METRIC_NAME and not _CONTROL.search(k) and _number(v)
               for k, v in metrics.items()):
        return None
    if checkpoint is not None and not (isinstance(checkpoint, str) and 0 < len(checkpoint) <= MAX_CHECKPOINT_PATH
                                       and not _CONTROL.search(checkpoint)):
        return None
    timing = _timing(record.get("timing"))
    if timing is None:
        return None
    return Report(step, epoch, tuple(metrics.items()), checkpoint, timing)


def _timing(value: Any) -> tuple[tuple[str, float | int], ...] | None:
    """A line's "timing" in TIMING_KEYS' order (() when the line has none), or None when it is malformed:
    the times and durations finite and not negative, the attempt and the checkpoint's step counts."""
    if value is None:
        return ()
    if not isinstance(value, dict) or set(value) - set(TIMING_KEYS) or _TIMING_REQUIRED - set(value):
        return None
    for key, v in value.items():
        ok = _count(v)[0] and v is not None if key in _TIMING_COUNTS else _number(v) and v >= 0
        if not ok:
            return None
    return tuple((k, value[k]) for k in TIMING_KEYS if k in value)


def parse(log: str) -> Report | None:
    """The last report in the tail of a driver log, with the last checkpoint reported in that
    tail (a report without one, after one with, keeps it)."""
    text = log[-MAX_LOG_BYTES:]
    latest, checkpoint = None, None
    for line in reversed(text.splitlines()):
        report = parse_line(line)
        if report is None:
            continue
        latest = latest or report
        checkpoint = report.checkpoint
        if checkpoint is not None:
            break
    if latest is None:
        return None
    return Report(latest.step, latest.epoch, latest.metrics, checkpoint, latest.timing)


def source(status: Mapping) -> tuple[str, str] | None:
    """(RayCluster, submission id) whose driver log tells this job's progress, when it is worth
    reading: the job is Running and KubeRay has named both (checked, as they make a URL)."""
    cluster, submission = status.get("rayClusterName"), status.get("jobId")
    if status.get("phase") != "Running" or not isinstance(cluster, str) or not isinstance(submission, str):
        return None
    if len(cluster) > 54 or not _DNS_LABEL.match(cluster) or not _SUBMISSION_ID.match(submission):
        return None  # a Service name <cluster>-head-svc must stay a DNS label
    return cluster, submission


def read_delay(last_read: float | None, now: float, interval: float) -> float:
    """Seconds until the job's driver log may be read again (0: now): at most one read per
    ``interval`` per job; the first at once."""
    if last_read is None:
        return 0.0
    return max(0.0, last_read + interval - now)


def apply(status: dict, report: Report | None, now: str) -> dict:
    """``status`` with the report in it: status.progress (reportedAt: when the operator first saw
    this very report, so that reading it again writes nothing) and status.lastCheckpoint."""
    if report is None:
        return status
    out = dict(status)
    fresh = report.progress()
    previous = status.get("progress") or {}
    same = {k: v for k, v in previous.items() if k != "reportedAt"} == fresh
    out["progress"] = {**fresh, "reportedAt": previous.get("reportedAt") if same and previous.get("reportedAt") else now}
    if report.checkpoint:
        out["lastCheckpoint"] = report.checkpoint
    return out


def carried(previous: Mapping) -> dict:
    """What a status derived anew keeps of the last one: the progress read, until the next read."""
    return {k: previous[k] for k in ("progress", "lastCheckpoint") if previous.get(k)}
