"""watchdog.py's hang watchdog, on a fake clock and in a real thread: each step's limit (timeoutSeconds,
then a multiple of the median step time, never past the first-step ceiling), one dump per wait,
and the marker line that names the training thread's innermost frames."""

import io
import json
import threading
import time

from tputorch import watchdog

SETTINGS = watchdog.HangSettings(timeout_s=60, first_step_timeout_s=600, step_time_multiple=10)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_limit_is_the_timeout_until_three_steps_were_timed_then_the_median_multiple():
    assert SETTINGS.step_limit([]) == 60
    assert SETTINGS.step_limit([1.0, 1.0]) == 60  # too few steps to trust a median
    assert SETTINGS.step_limit([1.0, 2.0, 3.0]) == 60  # 10 x 2 s is below the timeout
    assert SETTINGS.step_limit([20.0, 30.0, 1000.0]) == 300  # 10 x the median, not the mean
    assert SETTINGS.step_limit([100.0, 100.0, 100.0]) == 600  # never past the first-step ceiling
    assert watchdog.HangSettings(60, 600, 0).step_limit([100.0] * 5) == 60  # multiple 0: the timeout alone


def test_disarmed_until_the_first_step_ends_then_due_after_the_limit():
    clock = Clock()
    dog = watchdog.HangWatchdog(SETTINGS, clock=clock, out=io.StringIO(), err=io.StringIO())
    assert dog.due() is None
    dog.thread = object()  # no thread: due() is read directly
    dog.step_ended(0, 1)
    clock.now += 59
    assert dog.due() == 1
    for _ in range(3):  # a 64 s step, two 5 s ones: still the timeout (10 x the median 5 s < 60 s)
        clock.now += 5
        dog.step_ended(0, 2)
    assert dog.step_times == [64, 5, 5] and dog.limit == 60
    dog.reporting()  # inside ray.watchdog.report(): the ceiling from now
    clock.now += 100
    assert dog.due() == 500
    dog.pause()
    assert dog.due() is None


def test_the_dump_names_the_training_threads_blocking_frame_once():
    out, err = io.StringIO(), io.StringIO()
    dog = watchdog.HangWatchdog(watchdog.HangSettings(0.2, 5, 10), out=out, err=err)
    blocked = threading.Event()
    release = threading.Event()

    def blocking_collective():  # stands for a rank waiting in all_reduce for a peer that never comes
        blocked.set()
        release.wait(10)

    def training():
        dog.step_ended(1, 7)
        blocking_collective()

    worker = threading.Thread(target=training, name="train")
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while watchdog.HANG_MARKER not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a second dump would come by now
    finally:
        release.set()
        worker.join()
    lines = [line for line in out.getvalue().splitlines() if line.startswith(watchdog.HANG_MARKER)]
    assert len(lines) == 1, out.getvalue()
    record = json.loads(lines[0][len(watchdog.HANG_MARKER):])
    assert record["rank"] == 1 and record["step"] == 7 and record["limitS"] == 0
    assert record["frames"][0].endswith(" in wait")  # innermost first: where it blocks
    assert [f for f in record["frames"] if f.startswith(f"{__file__}:") and f.endswith(" in blocking_collective")]
    assert "Thread train (training):" in err.getvalue() and "blocking_collective" in err.getvalue()


def test_the_marker_line_keeps_the_innermost_frames_only():
    frames = [f"f.py:{i} in f{i}" for i in range(20)]
    line = watchdog.hang_line(0, None, 61.4, 60, frames)
    assert json.loads(line[len(watchdog.HANG_MARKER):]) == {"rank": 0, "step": None, "waitedS": 61, "limitS": 60,
                                                         "frames": frames[:watchdog.MAX_HANG_FRAMES]}


def test_nothing_is_printed_once_the_training_thread_ended():
    """Ray Train runs the training function in a thread of its own: after its last report the
    function returns, and a worker still alive then (shutting down) awaits no step."""
    out, err = io.StringIO(), io.StringIO()
    dog = watchdog.HangWatchdog(watchdog.HangSettings(0.2, 5, 10), out=out, err=err)
    last = threading.Thread(target=lambda: dog.step_ended(0, 3), name="train")
    last.start()
    last.join()
    deadline = time.monotonic() + 5
    while dog.due() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dog.due() is None and out.getvalue() == "" and err.getvalue() == ""
