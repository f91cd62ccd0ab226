"""The hang sentinel through the reconcile (fake adapter, fake dashboard, fake clock): a worker's
watchdog dump read from the driver log ends the attempt as a Hang, names where the workers are in
the status and a Warning Event, and deletes the attempt's RayJob so that the next one starts (and
resumes from the checkpoint); a job without spec.hangDetection ignores the same log."""

from __future__ import annotations

import datetime

from tputorch.watchdog import hang_line

from ..fakekube import controller
from .test_progress_reads import FakeDashboard, ProgressLife
from .test_write_budget import KEY, KIND, lives_of, start_slice

EPOCH = datetime.datetime(2026, 11, 30, tzinfo=datetime.timezone.utc)
FRAMES = ["/venv/torch/distributed/distributed_c10d.py:2806 in all_reduce", "/home/ray/train.py:41 in train_loop"]


class HangLife(ProgressLife):
    """ProgressLife whose wall clock (status times) follows its fake monotonic one."""

    def __init__(self, **spec) -> None:
        super().__init__(**spec)
        job = self.ctl.parents[KIND].get(("ml", "demo"))
        self.ctl = controller(self.kube, status_interval=2.0, monotonic=lambda: self.t, dashboard=self.dashboard,
                              progress_interval=30.0, clock=self.now)
        self.ctl.queue.add_after = lambda key, delay: self.due.append((self.t + delay, key))
        self.ctl.parents[KIND]._put(job)

    def now(self) -> str:
        return (EPOCH + datetime.timedelta(seconds=self.t)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def status(self) -> dict:
        return self.ctl.parents[KIND].get(("ml", "demo"))["status"]


life = lives_of(HangLife)


def hang_dump(dashboard: FakeDashboard, rank: int) -> None:
    dashboard.log += f"(RayTrainWorker pid=8, ip=10.0.0.3) {hang_line(rank, 2, 125, 120, FRAMES)}\n"


def test_a_watchdog_dump_ends_the_attempt_as_a_hang_with_an_event_and_the_next_starts(life):
    job = life(hangDetection={"timeoutSeconds": 120, "firstStepTimeoutSeconds": 600})
    job.reconcile()
    start_slice(job, 4, host_ready_at=[0.6, 0.8, 1.0, 1.2], running_at=1.5)
    job.dashboard.report(1, 2.0)
    job.at(31.6)
    job.dashboard.report(2, 1.0)
    job.at(61.6)
    assert job.status()["phase"] == "Running"
    assert {c["type"]: c["reason"] for c in job.status()["conditions"]}["HangSentinel"] == "Armed"
    hang_dump(job.dashboard, 0)
    # the API's RayJob is the one the store holds (read again before an attempt is ended)
    job.kube.objects[("rayjobs", "ml", "demo")] = job.ctl.children[KIND].get(("ml", "demo"))
    job.at(91.6)  # the next read brings the dump
    st = job.status()
    assert (st["phase"], st["attempts"]) == ("Retrying", 2), st["message"]
    (record,) = st["attemptHistory"]
    assert (record["result"], record["reason"]) == ("Hang", "Hung")
    assert record["hungSince"] == "2026-11-30T00:01:01Z"  # the read (at 61.5 s) that brought step 2
    assert "rank 0 (after step 2, 125s, limit 120s) at " + " <- ".join(FRAMES) in record["message"]
    hung = next(c for c in st["conditions"] if c["type"] == "HangSentinel")
    assert (hung["status"], hung["reason"]) == ("False", "Hung") and "train.py:41 in train_loop" in hung["message"]
    assert "Hung" in job.events()
    # the hung attempt's RayJob goes (asked again while the fake's store, with no watch event, still holds it)
    assert {c[1:4] for c in job.kube.called("delete")} == {("rayjobs", "ml", "demo")}


def test_a_job_without_the_field_ignores_a_dump(life):
    job = life()
    job.reconcile()
    start_slice(job, 4, host_ready_at=[0.6, 0.8, 1.0, 1.2], running_at=1.5)
    job.dashboard.report(1, 2.0)
    hang_dump(job.dashboard, 0)
    job.at(91.6)
    st = job.status()
    assert st["phase"] == "Running" and "attemptHistory" not in st
    assert "HangSentinel" not in {c["type"] for c in st["conditions"]}
    assert job.kube.called("delete") == []
