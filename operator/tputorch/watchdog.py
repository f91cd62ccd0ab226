"""The hang sentinel's watchdog in each Ray Train worker (spec.hangDetection), armed by
tputorch.train.report() at each step's end.

A hung collective never raises: the job stays Running while the slice does nothing. With
ENV_HANG_DETECTION set, tputorch.train.report() arms a watchdog in each worker: a thread that, when no step ends
in time, prints every thread's Python stack, from inside the process (no ptrace, no pods/exec:
GKE's pods drop every capability). Worker output reaches the Ray job driver's log, where the
operator reads it (status/hang.py): HANG_MARKER + one JSON line (the rank, the step, the
training thread's innermost frames), after the full stacks for the user. A step's time limit is
timeoutSeconds until MEDIAN_AFTER steps were timed, then stepTimeMultiple x their median when that
is longer, never more than firstStepTimeoutSeconds. Should the stuck code hold the GIL (the
thread cannot run), faulthandler's own C watchdog prints the stacks FAULTHANDLER_GRACE_S later;
the operator then ends the attempt on its own clock (no progress), without the frames. Once the
training thread has ended (the training function returned after its last report) nothing is due.
"""

from __future__ import annotations

import faulthandler
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping

# spec.hangDetection, as JSON with its three fields; set only when the job has the block (render/env.py).
ENV_HANG_DETECTION = "TPUTORCH_HANG_DETECTION"
HANG_MARKER = "tputorch.hang "
MEDIAN_AFTER = 3  # step times measured before their median may lengthen the limit
MAX_STEP_TIMES = 32  # the median is of the latest steps
MAX_HANG_FRAMES = 8  # innermost frames of the training thread in the marker line
MAX_FRAME_TEXT = 200
FAULTHANDLER_GRACE_S = 5.0


@dataclass(frozen=True)
class HangSettings:
    timeout_s: float
    first_step_timeout_s: float
    step_time_multiple: float

    def step_limit(self, step_times: list[float]) -> float:
        """Seconds a step may take, given the latest steps' times (the first step has the
        operator's first-step floor: the watchdog is armed by the first report)."""
        if len(step_times) < MEDIAN_AFTER or self.step_time_multiple <= 0:
            return self.timeout_s
        return min(self.first_step_timeout_s, max(self.timeout_s, self.step_time_multiple * statistics.median(step_times)))


def hang_settings(environ: Mapping[str, str] | None = None) -> HangSettings | None:
    """spec.hangDetection as the operator rendered it; None when the job has none (or it is malformed)."""
    env = os.environ if environ is None else environ
    try:
        raw = json.loads(env.get(ENV_HANG_DETECTION) or "null")
        if raw is None:
            return None
        return HangSettings(float(raw["timeoutSeconds"]), float(raw["firstStepTimeoutSeconds"]),
                            float(raw["stepTimeMultiple"]))
    except (ValueError, TypeError, KeyError):
        return None


def frame_text(filename: str, line: int | None, function: str) -> str:
    """One frame as the marker line and the operator show it: file:line in function."""
    return f"{filename}:{line} in {function}"[:MAX_FRAME_TEXT]


def stack_of(frame) -> list[str]:
    """A thread's frames, innermost first (faulthandler's order)."""
    frames = []
    while frame is not None:
        frames.append(frame_text(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames


def hang_line(rank: int | None, step: int | None, waited_s: float, limit_s: float, frames: list[str]) -> str:
    """The line the watchdog prints for the operator (status/hang.py parses it)."""
    record = {"rank": rank, "step": step, "waitedS": round(waited_s), "limitS": round(limit_s),
              "frames": frames[:MAX_HANG_FRAMES]}
    return HANG_MARKER + json.dumps(record, separators=(",", ":"), sort_keys=True)


class HangWatchdog:
    """One per worker process: armed by each step's end (report()), it prints the stacks once when
    the next step does not end within its limit, then waits for a step again."""

    def __init__(self, settings: HangSettings, clock=time.monotonic, out=None, err=None) -> None:
        self.settings, self.clock = settings, clock
        self.out, self.err = out, err  # None: sys.stdout / sys.stderr when printing
        self.step_times: list[float] = []
        self.lock = threading.Condition()
        self.ended_at: float | None = None  # the last step's end (None: not armed)
        self.limit = settings.timeout_s
        self.rank: int | None = None
        self.step: int | None = None
        self.thread_id: int | None = None  # the training thread: the one that reports
        self.fired = False  # the stacks of this wait were printed
        self.thread: threading.Thread | None = None

    def step_ended(self, rank: int | None, step: int | None) -> None:
        now = self.clock()
        with self.lock:
            if self.ended_at is not None and not self.fired:
                self.step_times = (self.step_times + [now - self.ended_at])[-MAX_STEP_TIMES:]
            self.ended_at, self.rank, self.step, self.fired = now, rank, step, False
            self.thread_id = threading.get_ident()
            self.limit = self.settings.step_limit(self.step_times)
            self._arm_faulthandler(self.limit)
            if self.thread is None:
                self.thread = threading.Thread(target=self._watch, name="tputorch-hang-watchdog", daemon=True)
                self.thread.start()
            self.lock.notify_all()

    def reporting(self) -> None:
        """Inside ray.train.report(): a barrier with every worker and the checkpoint's upload. Only
        the ceiling (firstStepTimeoutSeconds) applies; the step's time is counted on its end."""
        with self.lock:
            if self.ended_at is not None and not self.fired:
                elapsed = self.clock() - self.ended_at
                self.limit = max(self.limit, elapsed + self.settings.first_step_timeout_s)
                self._arm_faulthandler(self.limit - elapsed)
                self.lock.notify_all()

    def pause(self) -> None:
        """Disarm until the next report() (e.g. a long evaluation or a final save after the last step)."""
        with self.lock:
            self.ended_at = None
            faulthandler.cancel_dump_traceback_later()
            self.lock.notify_all()

    def _arm_faulthandler(self, seconds: float) -> None:
        try:
            faulthandler.dump_traceback_later(max(1.0, seconds + FAULTHANDLER_GRACE_S), repeat=False,
                                              file=self.err or sys.stderr)
        except (ValueError, OSError, AttributeError):  # stderr without a file descriptor (a test's capture)
            pass

    def due(self) -> float | None:
        """Seconds until the stacks are due (<= 0: now); None while disarmed or already printed."""
        if self.ended_at is None or self.fired:
            return None
        return self.ended_at + self.limit - self.clock()

    def _watch(self) -> None:
        while True:
            with self.lock:
                left = self.due()
                if left is None or left > 0:
                    self.lock.wait(timeout=left)
                    continue
                if self.thread_id not in sys._current_frames():
                    # the training thread ended (Ray Train runs the training function in a thread of its
                    # own): the function returned after its last report, no step is awaited
                    self.ended_at = None
                    faulthandler.cancel_dump_traceback_later()
                    continue
                self.fired = True
                waited, limit, rank, step, ident = self.clock() - self.ended_at, self.limit, self.rank, self.step, self.thread_id
            self.dump(rank, step, waited, limit, ident)

    def dump(self, rank: int | None, step: int | None, waited: float, limit: float, ident: int | None) -> str:
        """Print every thread's stack (for the user), then the marker line (for the operator)."""
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        out, err = self.out or sys.stdout, self.err or sys.stderr
        faulthandler.cancel_dump_traceback_later()  # printed here: faulthandler's copy is not needed
        lines = [f"tputorch hang watchdog: rank {rank}: no step ended {waited:.0f}s after step {step} "
                 f"(limit {limit:.0f}s); every thread's stack, most recent call first:"]
        for thread_id, frame in frames.items():
            lines.append(f"Thread {names.get(thread_id, thread_id)}{' (training)' if thread_id == ident else ''}:")
            lines.extend(f"  {text}" for text in stack_of(frame))
        print("\n".join(lines), file=err, flush=True)
        line = hang_line(rank, step, waited, limit, stack_of(frames.get(ident)) if ident in frames else [])
        print(line, file=out, flush=True)
        return line


_WATCHDOG: HangWatchdog | None = None
_WATCHDOG_LOCK = threading.Lock()


def of_this_process() -> HangWatchdog | None:
    """This process's watchdog, made on the first report() of a job with spec.hangDetection."""
    global _WATCHDOG
    with _WATCHDOG_LOCK:
        if _WATCHDOG is None:
            settings = hang_settings()
            if settings is not None:
                _WATCHDOG = HangWatchdog(settings)
        return _WATCHDOG


def pause() -> None:
    """Disarm this process's watchdog until its next step (none made yet: nothing to do)."""
    if _WATCHDOG is not None:
        _WATCHDOG.pause()
