"""Training progress in the status (status/progress.py): the line tputorch.train.report() prints,
read back from a driver log the operator does not trust; when a job's log is read; what the
status keeps of it."""

import dataclasses
import json
import sys
import types

import pytest

from tputorch import status as statuses, train
from tputorch.api import spec
from tputorch.status import progress
from tputorch.train import PROGRESS_MARKER, progress_line

from ..jobs import body

NOW, LATER = "2026-12-01T10:00:00Z", "2026-12-01T10:00:30Z"
# How a Ray Train worker's print reaches the driver's log (log_to_driver), colours and all.
WORKER = "\x1b[36m(RayTrainWorker pid=4242, ip=10.0.0.7)\x1b[0m "


def line(**record) -> str:
    return WORKER + PROGRESS_MARKER + json.dumps(record)


# --- the line report() prints, read back ------------------------------------------------------------

def test_a_reported_line_reads_back_as_what_was_reported():
    text = progress_line({"loss": 0.25, "lr": 1e-4, "step": 120, "epoch": 2, "tokens": 10**6},
                         checkpoint="gs://bucket/run/checkpoint_000002")
    report = progress.parse_line(WORKER + text)
    assert report == progress.Report(120, 2, (("loss", 0.25), ("lr", 1e-4), ("tokens", 10**6)),
                                     "gs://bucket/run/checkpoint_000002")


def test_report_line_leaves_out_what_the_operator_would_refuse():
    metrics = {"name": "bert", "ok": True, "nan": float("nan"), "inf": float("inf"), "x" * 64: 1.0,
               "huge": 2**60, "loss": 0.5, **{f"m{i:02d}": i for i in range(30)}}
    text = progress_line(metrics, step=-1, epoch=True, checkpoint="p" * (train.MAX_CHECKPOINT_PATH + 1))
    record = json.loads(text[len(PROGRESS_MARKER):])
    assert record["step"] is None and record["epoch"] is None and "checkpoint" not in record
    assert record["metrics"]["huge"] == float(2**60) and record["metrics"]["loss"] == 0.5
    assert len(record["metrics"]) == train.MAX_PROGRESS_METRICS
    assert not {"name", "ok", "nan", "inf", "x" * 64} & set(record["metrics"])
    assert progress.parse_line(text) is not None, "what report() prints, the operator reads"


def test_a_tensor_like_metric_is_read_through_item():
    class Scalar:
        def item(self):
            return 1.5
    assert json.loads(progress_line({"loss": Scalar()})[len(PROGRESS_MARKER):])["metrics"] == {"loss": 1.5}


@pytest.mark.parametrize("text", [
    "plain output, no marker",
    PROGRESS_MARKER + "not json",
    PROGRESS_MARKER + "[1, 2]",
    line(step="12"),
    line(step=-3),
    line(step=2**53),
    line(epoch=1.5),
    line(step=True),
    line(metrics={"loss": "low"}),
    line(metrics={"loss": True}),
    line(metrics={"loss": None}),
    line(metrics=[1.0]),
    line(metrics={"": 1.0}),
    line(metrics={"a\nb": 1.0}),
    line(metrics={"x" * 64: 1.0}),
    line(metrics={f"m{i}": 1 for i in range(train.MAX_PROGRESS_METRICS + 1)}),
    line(metrics={"big": 2**53}),
    PROGRESS_MARKER + '{"metrics": {"loss": NaN}}',
    PROGRESS_MARKER + '{"metrics": {"loss": Infinity}}',
    line(checkpoint=7),
    line(checkpoint=""),
    line(checkpoint="/ckpt\x00/evil"),
    line(checkpoint="c" * (train.MAX_CHECKPOINT_PATH + 1)),
    line(step=1, extra="field"),
    PROGRESS_MARKER + '{"step": 1, "metrics": {"loss": ' + "1" * 5000 + "}}",
])
def test_a_malformed_line_is_ignored(text):
    assert progress.parse_line(text) is None


def test_the_last_report_of_the_tail_wins_and_keeps_the_last_checkpoint_before_it():
    log = "\n".join([
        line(step=10, metrics={"loss": 2.0}, checkpoint="/ckpt/checkpoint_1"),
        "(RayTrainWorker pid=1) some other output",
        line(step=20, metrics={"loss": 1.0}, checkpoint="/ckpt/checkpoint_2"),
        line(step=30, metrics={"loss": 0.5}),
        PROGRESS_MARKER + "{broken",
        "Training finished iteration 3",
    ])
    assert progress.parse(log) == progress.Report(30, None, (("loss", 0.5),), "/ckpt/checkpoint_2")
    assert progress.parse("no reports here\n") is None
    assert progress.parse("") is None


def test_only_the_bounded_tail_of_a_log_is_read():
    old = line(step=1, metrics={"loss": 9.0})
    assert progress.parse(old + "\n" + "x" * progress.MAX_LOG_BYTES) is None
    assert progress.parse(old + "\n" + "x" * (progress.MAX_LOG_BYTES - len(old) - 10)).step == 1


# --- when and where to read ---------------------------------------------------------------------

RUNNING = {"phase": "Running", "rayClusterName": "llama-v6e-4x4-x7k2p", "jobId": "llama-v6e-4x4-q8v2m"}


def test_a_running_job_with_its_cluster_and_submission_named_is_read():
    assert progress.source(RUNNING) == ("llama-v6e-4x4-x7k2p", "llama-v6e-4x4-q8v2m")


@pytest.mark.parametrize("change", [
    {"phase": "Pending"}, {"phase": "Retrying"}, {"phase": "Succeeded"}, {"phase": "Failed"},
    {"rayClusterName": None}, {"jobId": None}, {"rayClusterName": "Evil.example.com"},
    {"rayClusterName": "a" * 55}, {"rayClusterName": "x/../y"}, {"jobId": "id&lines=100000"},
    {"jobId": "a" * 129}, {"jobId": 7},
])
def test_no_read_when_the_job_is_not_running_or_its_names_do_not_make_a_safe_url(change):
    assert progress.source({**RUNNING, **change}) is None


@pytest.mark.parametrize("last,now,interval,delay", [
    (None, 100.0, 30.0, 0.0),   # never read: at once
    (100.0, 100.0, 30.0, 30.0),  # just read
    (100.0, 110.0, 30.0, 20.0),
    (100.0, 130.0, 30.0, 0.0),   # an interval later
    (100.0, 500.0, 30.0, 0.0),
    (100.0, 105.0, 5.0, 0.0),
])
def test_one_read_per_interval_per_job(last, now, interval, delay):
    assert progress.read_delay(last, now, interval) == delay


# --- what the status keeps ----------------------------------------------------------------------

def test_a_report_goes_into_the_status_and_reading_it_again_changes_nothing():
    report = progress.Report(20, 1, (("loss", 1.0),), "gs://b/run/checkpoint_000001")
    first = progress.apply({"phase": "Running"}, report, NOW)
    assert first["progress"] == {"step": 20, "epoch": 1, "metrics": {"loss": 1.0}, "reportedAt": NOW}
    assert first["lastCheckpoint"] == "gs://b/run/checkpoint_000001"
    assert progress.apply(first, report, LATER) == first, "the same report again: no change, no write"
    newer = progress.apply(first, progress.Report(40, 1, (("loss", 0.5),), None), LATER)
    assert newer["progress"] == {"step": 40, "epoch": 1, "metrics": {"loss": 0.5}, "reportedAt": LATER}
    assert newer["lastCheckpoint"] == "gs://b/run/checkpoint_000001", "a report without one keeps the last"
    assert progress.apply(first, None, LATER) is first


def test_a_status_derived_anew_keeps_the_progress_read_and_a_wiped_one_is_removed():
    job = spec.parse(body())
    rayjob = {"metadata": {"name": job.name}, "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                          "rayClusterName": "c-abcde", "jobId": "j-abcde"}}
    read = {"progress": {"step": 5, "metrics": {"loss": 1.0}, "reportedAt": NOW}, "lastCheckpoint": "/c/1"}
    previous = {**statuses.derive(job, 1, rayjob, [], {}, NOW), **read}
    current = statuses.derive(job, 1, rayjob, [], previous, LATER)
    assert {k: current[k] for k in read} == read
    assert statuses.patch_for(previous, current) is None
    # the whole status wiped by hand: progress comes back with the next read, nothing stale is kept
    assert statuses.patch_for(previous, statuses.derive(job, 1, rayjob, [], {}, LATER))["progress"] is None


# --- report() in a training function ------------------------------------------------------------

class _Ray:
    """ray.train as report() uses it: a persisted copy of each reported checkpoint."""

    def __init__(self, rank: int) -> None:
        self.rank, self.reported, self.latest = rank, [], None

    def module(self) -> types.ModuleType:
        m = types.ModuleType("ray.train")
        m.report = self.report
        m.get_checkpoint = lambda: self.latest
        m.get_context = lambda: types.SimpleNamespace(get_world_rank=lambda: self.rank)
        return m

    def report(self, metrics, checkpoint=None, **kwargs):
        self.reported.append((metrics, checkpoint, kwargs))
        if checkpoint is not None:
            self.latest = types.SimpleNamespace(path="bucket/run/checkpoint_000003",
                                                filesystem=types.SimpleNamespace(type_name="gcs"))


@pytest.mark.parametrize("rank", [0, 1])
def test_report_reports_to_ray_train_and_prints_one_line_on_rank_zero(rank, monkeypatch, capsys):
    fake = _Ray(rank)
    ray = types.ModuleType("ray")
    ray.train = fake.module()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.train", ray.train)
    monkeypatch.setattr(train, "CLOCK", train.StepClock())  # this process's clock: this test's alone
    local = types.SimpleNamespace(path="/tmp/local-ckpt", filesystem=None)
    train.report({"loss": 0.75, "step": 30}, checkpoint=local, checkpoint_dir_name="c3")
    assert fake.reported == [({"loss": 0.75, "step": 30}, local, {"checkpoint_dir_name": "c3"})]
    printed = [ln for ln in capsys.readouterr().out.splitlines() if PROGRESS_MARKER in ln]
    if rank:
        assert printed == []
    else:
        read = progress.parse("\n".join(printed))
        assert dataclasses.replace(read, timing=()) == progress.Report(30, None, (("loss", 0.75),),
                                                                      "gs://bucket/run/checkpoint_000003")
        # the first report: the clock starts; its time in ray.train.report was the checkpoint's save
        timing = dict(read.timing)
        assert (timing["attempt"], timing["checkpoint_step"], timing["compute_s"]) == (1, 30, 0.0)
        assert timing["at"] - timing["first"] == pytest.approx(timing["checkpoint_s"], abs=2e-3)


def test_the_driver_log_tail_a_real_ray_head_served_reads_as_the_run_reported():
    """hack/fakedash/recorded/driver-log.json: Ray 2.60's answer for a Ray Train run reporting
    through report() (tests/cluster/realray_jobs/record_driver_log.py), workers' colours and all."""
    from pathlib import Path

    recorded = json.loads((Path(__file__).resolve().parents[3] / "hack/fakedash/recorded/driver-log.json").read_text())
    running, finished = progress.parse(recorded["running"]["body"]), progress.parse(recorded["finished"]["body"])
    assert running.step == 1 and finished.step == 3 and finished.epoch == 0
    assert dict(finished.metrics)["loss"] < dict(running.metrics)["loss"]
    assert "/storage/progress-0c0ffee0/checkpoint_" in finished.checkpoint and finished.checkpoint != running.checkpoint
    assert progress.parse(recorded["unknown"]["body"]) is None
