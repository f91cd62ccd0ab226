"""The hang sentinel's decisions (status/hang.py) through the job's status (status/job.py): a
worker's dump ends the attempt as a Hang at once with its frames; no progress past the ceiling
ends it without; a log not read decides nothing; a script that never reported arms nothing; a
hang spends spec.retries.hang, never the infrastructure's."""

import json

from tputorch import status as statuses
from tputorch.api import spec
from tputorch.status import attempts, hang
from tputorch.status.job import ATTEMPT_LABEL, child_must_go
from tputorch.watchdog import HANG_MARKER, hang_line

from ..jobs import body

RUNNING = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "demo-abcde", "jobId": "demo-x1"}
SOURCE = ("demo-abcde", "demo-x1")
T0 = "2026-12-01T10:00:00Z"  # the slice became ready
FRAMES = ["/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py:2806 in all_reduce",
          "/home/ray/train.py:41 in train_loop", "/usr/lib/python3/site-packages/ray/train/v2/_internal/worker.py:88 in run"]


def at(minutes, seconds=0):
    return f"2026-12-01T{10 + (minutes // 60):02d}:{minutes % 60:02d}:{seconds:02d}Z"


def job(**extra):
    return spec.parse(body(hangDetection={"timeoutSeconds": 120, "firstStepTimeoutSeconds": 300}, **extra))


def pods():
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return [{"metadata": {"name": n, "labels": {"ray.io/node-type": r, "ray.io/cluster": "demo-abcde"}}, "status": ready}
            for n, r in (("demo-head", "head"), ("demo-tpu-0", "worker"), ("demo-tpu-1", "worker"),
                         ("demo-tpu-2", "worker"), ("demo-tpu-3", "worker"))]


def rayjob(attempt=1, status=RUNNING):
    return {"metadata": {"name": "demo", "labels": {ATTEMPT_LABEL: str(attempt)}}, "status": status}


def running(j, attempt=1, progress_at=None, step=5, previous=None):
    """The status as written while ``attempt`` runs, its slice ready since T0, with a report read at
    ``progress_at``."""
    st = statuses.derive(j, 1, rayjob(attempt), pods(), previous or {}, T0)
    if previous is None:
        st = statuses.derive(j, 1, rayjob(attempt), pods(), st, T0)  # Running: SliceReady True since T0
    assert st["phase"] == "Running", st["message"]
    if progress_at:  # read, then written by the next reconcile
        st = {**st, "progress": {"step": step, "metrics": {}, "reportedAt": progress_at}}
        st = statuses.derive(j, 1, rayjob(attempt), pods(), st, progress_at)
    return st


def derive(j, previous, now, seen, attempt=1):
    return statuses.derive(j, 1, rayjob(attempt), pods(), previous, now, hang=seen)


def condition(st):
    return next((c for c in st["conditions"] if c["type"] == "HangSentinel"), None)


def dump_line(rank, frames=FRAMES, waited=130):
    return f"(RayTrainWorker pid=4{rank}, ip=10.0.0.{rank}) " + hang_line(rank, 5, waited, 120, frames)


def test_the_log_lines_parse_by_rank_and_nothing_untrusted_passes():
    log = "\n".join(["noise", dump_line(1), dump_line(0), dump_line(1, FRAMES[1:], waited=160),
                     HANG_MARKER + "{not json", HANG_MARKER + json.dumps({"frames": "x", "waitedS": 1, "limitS": 1}),
                     HANG_MARKER + json.dumps({"frames": ["a\x1b[31m"], "waitedS": 1, "limitS": -1})])
    dumps = hang.parse(log)
    assert [(d.rank, d.waited_s, d.frames[0]) for d in dumps] == [(0, 130, FRAMES[0]), (1, 160, FRAMES[1])]
    assert hang.parse_line(HANG_MARKER + json.dumps({"rank": 2, "frames": ["a\x1b[31m"], "waitedS": 1, "limitS": 1})).frames == ("a?[31m",)


def test_a_workers_dump_ends_the_attempt_as_a_hang_with_where_the_workers_are():
    j = job()
    before = running(j, progress_at=at(1))
    assert (condition(before)["status"], condition(before)["reason"]) == ("True", "Armed")
    seen = hang.Seen(SOURCE, at(3, 30), at(1), hang.parse("\n".join([dump_line(0), dump_line(1, ["/x.py:1 in sleep", *FRAMES[1:]])])))
    st = derive(j, before, at(3, 31), seen)
    assert (st["phase"], st["attempts"]) == ("Retrying", 2)
    (record,) = st["attemptHistory"]
    assert (record["result"], record["reason"], record["hungSince"], record["endTime"]) == ("Hang", "Hung", at(1), at(3, 31))
    assert "rank 0 (after step 5, 130s, limit 120s) at " + " <- ".join(FRAMES) in record["message"]
    assert "rank 1 (after step 5, 130s, limit 120s) at /x.py:1 in sleep <- " + FRAMES[1] in record["message"]
    cond = condition(st)
    assert (cond["status"], cond["reason"]) == ("False", "Hung") and "in all_reduce" in cond["message"]
    (event,) = [e for e in statuses.events(before, st) if e.reason == "Hung"]
    assert event.type == "Warning" and "/home/ray/train.py:41 in train_loop" in event.message
    assert child_must_go(st, rayjob(1))  # the attempt ends: the next resumes from the last checkpoint
    assert "1 hang retries left" not in st["message"] and "0 hang retries left after it" in st["message"]


def test_a_hang_spends_its_own_budget_not_the_infrastructures():
    j = job(retries={"hang": 0})
    seen = hang.Seen(SOURCE, at(3, 30), None, hang.parse(dump_line(0)))
    st = derive(j, running(j, progress_at=at(1)), at(3, 31), seen)
    assert (st["phase"], st["attempts"]) == ("Failed", 1)
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Hung" and "in all_reduce" in failed["message"]
    assert attempts.retries_left("Infrastructure", st["attemptHistory"], j.retries) == 10
    assert condition(st)["reason"] == "Hung"


def test_no_progress_past_the_ceiling_ends_it_without_frames_but_only_on_a_fresh_read():
    j = job()  # ceiling 300 s, plus two reads of 30 s
    before = running(j, progress_at=at(1))
    assert derive(j, before, at(7), hang.Seen(SOURCE, at(6, 59), at(1)))["phase"] == "Running"  # 359 s
    assert derive(j, before, at(30), hang.Seen(SOURCE, at(2), at(1)))["phase"] == "Running"  # the log is not read
    st = derive(j, before, at(7, 1), hang.Seen(SOURCE, at(7), at(1)))
    (record,) = st["attemptHistory"]
    assert (st["phase"], record["result"], record["hungSince"]) == ("Retrying", "Hang", at(1))
    assert "no progress for 360s" in record["message"] and "no worker printed its stacks" in record["message"]


def test_a_newer_report_read_counts_before_it_is_written():
    j = job()
    before = running(j, progress_at=at(1))
    assert derive(j, before, at(7, 1), hang.Seen(SOURCE, at(7), at(6)))["phase"] == "Running"


def test_the_first_step_of_a_later_attempt_has_the_floor_from_when_it_runs():
    j = job()
    earlier = running(j, progress_at="2026-12-01T09:00:00Z")  # attempt 1's last report, before T0
    assert hang.last_step(earlier, None, T0) is None
    assert derive(j, earlier, at(6), hang.Seen(SOURCE, at(5, 59)))["phase"] == "Running"
    st = derive(j, earlier, at(6, 1), hang.Seen(SOURCE, at(6)))
    assert st["attemptHistory"][0]["hungSince"] == T0 and "the attempt's first step did not end" in st["message"]


def test_a_script_that_never_reported_arms_nothing_and_the_status_says_so():
    j = job()
    silent = running(j)
    assert derive(j, silent, at(50), hang.Seen(SOURCE, at(50)))["phase"] == "Running"
    assert (condition(silent)["status"], condition(silent)["reason"]) == ("False", "WaitingForFirstReport")
    late = derive(j, silent, at(5), hang.Seen(SOURCE, at(5)))
    cond = condition(late)
    assert (cond["status"], cond["reason"]) == ("False", "NoProgressReported") and "not armed" in cond["message"]
    assert [e.type for e in statuses.events(silent, late) if e.reason == "NoProgressReported"] == ["Warning"]


def test_another_attempts_log_or_a_job_without_the_field_decides_nothing():
    j = job()
    before = running(j, progress_at=at(1))
    other = hang.Seen(("demo-older", "demo-x0"), at(9), at(1), hang.parse(dump_line(0)))
    from tputorch.controller.progressreads import ProgressReads
    reads = ProgressReads(None, 30, None, lambda: at(9), lambda: 0.0, None, None, None)
    reads.sentinel["uid"] = other
    assert reads.seen("uid", before) is None
    reads.sentinel["uid"] = hang.Seen(SOURCE, at(9), at(1))
    assert reads.seen("uid", before) == reads.sentinel["uid"]
    plain = spec.parse(body())
    st = statuses.derive(plain, 1, rayjob(), pods(), before, at(9), hang=hang.Seen(SOURCE, at(9), at(1), hang.parse(dump_line(0))))
    assert st["phase"] == "Running" and condition(st) is None


def test_hung_stays_in_the_status_until_the_next_attempt_runs():
    j = job()
    seen = hang.Seen(SOURCE, at(3, 30), at(1), hang.parse(dump_line(0)))
    hung = derive(j, running(j, progress_at=at(1)), at(3, 31), seen)
    starting = statuses.derive(j, 1, rayjob(2, {"jobDeploymentStatus": "Initializing"}), [], hung, at(4))
    assert (starting["phase"], condition(starting)["reason"]) == ("Retrying", "Hung")
    again = statuses.derive(j, 1, rayjob(2), pods(), starting, at(6))
    assert again["phase"] == "Running" and condition(again)["reason"] == "Armed"  # the job reported before
