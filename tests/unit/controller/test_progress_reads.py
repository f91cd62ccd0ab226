"""A running job's training progress, read from its Ray dashboard by the reconcile (through the fake
adapter and a fake dashboard, on the fake clock of the write-budget tests): once per interval per
job, only while it runs, off the reconcile's path, and written only when the report changed."""

from __future__ import annotations

import asyncio

import pytest

from tputorch.train import progress_line

from ..fakekube import controller
from .test_write_budget import CLUSTER, KEY, KIND, Life, lives_of, start_slice, succeed

INTERVAL = 30.0


class FakeDashboard:
    # The read's timeout is real time (asyncio.wait_for), the test's clock is fake: a short one made
    # the held read of the one-read-at-a-time test time out and start a second under load.
    timeout = 600.0

    def __init__(self) -> None:
        self.log = ""
        self.calls: list[tuple] = []
        self.tokens: list[str | None] = []  # the Ray token each read carried
        self.fail: Exception | None = None
        self.hold: asyncio.Event | None = None  # a dashboard that does not answer until set

    async def driver_log(self, namespace, cluster, submission_id, token=None):
        self.calls.append((namespace, cluster, submission_id))
        self.tokens.append(token)
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        return self.log

    def report(self, step: int, loss: float, checkpoint: str | None = None) -> None:
        self.log += f"(RayTrainWorker pid=7, ip=10.0.0.2) {progress_line({'loss': loss}, step=step, checkpoint=checkpoint)}\n"


class ProgressLife(Life):
    def __init__(self, interval: float = INTERVAL, **spec) -> None:
        super().__init__(**spec)
        self.dashboard = FakeDashboard()
        job = self.ctl.parents[KIND].get(("ml", "demo"))
        self.ctl = controller(self.kube, status_interval=2.0, monotonic=lambda: self.t, dashboard=self.dashboard,
                              progress_interval=interval)
        self.ctl.queue.add_after = lambda key, delay: self.due.append((self.t + delay, key))
        self.ctl.parents[KIND]._put(job)
        self.reconciles = 0

    def reconcile(self) -> str:
        self.reconciles += 1
        result = super().reconcile()
        self.settle()
        return result

    def settle(self) -> None:
        """Let the reads in flight end; a read that brought a new report queues the job: reconcile it
        as the worker would."""
        while self.ctl.progress.reading and self.dashboard.hold is None:
            self.loop.run_until_complete(asyncio.gather(*self.ctl.progress.reading.values(), return_exceptions=True))
        if KEY in self.ctl.queue.known():
            self.ctl.queue.drop(KEY)
            super().reconcile()

    def progress(self) -> list[dict]:
        return [c[4]["progress"] for c in self.kube.called("patch_status") if c[4].get("progress")]

    def close(self) -> None:
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:  # a read still held (a failed test): never left to the garbage collector
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.wait(pending, timeout=10))
        super().close()


life = lives_of(ProgressLife)


def test_a_running_job_shows_its_reports_read_once_per_interval_and_keeps_the_last_when_done(life):
    job = life()
    job.reconcile()
    start_slice(job, 4, host_ready_at=[0.6, 0.8, 1.0, 1.2], running_at=1.5)
    assert job.dashboard.calls == [("ml", CLUSTER, "demo-abc")], "read at once when it runs"
    secret = next(o for (plural, _, _), o in job.kube.objects.items() if plural == "secrets")
    assert job.dashboard.tokens == [secret["stringData"]["auth_token"]], "with the token KubeRay gave the cluster"
    assert job.progress() == []  # nothing reported yet: nothing to write

    job.dashboard.report(100, 2.5, checkpoint="gs://bucket/run/checkpoint_000000")
    job.at(31.6)
    job.dashboard.report(200, 1.25)
    job.at(61.6)
    job.at(91.6)  # no new report: a read, no write
    job.dashboard.report(300, 0.5)
    job.at(100.0)  # within the interval: not read yet
    assert [p["step"] for p in job.progress()] == [100, 200]
    job.at(121.6)
    assert [(p["step"], p["metrics"]["loss"]) for p in job.progress()] == [(100, 2.5), (200, 1.25), (300, 0.5)]
    last = job.kube.called("patch_status")[-1][4]
    assert last["lastCheckpoint"] == "gs://bucket/run/checkpoint_000000"
    assert len(job.dashboard.calls) == 5  # at 1.5, 31.5, 61.5, 91.5, 121.5: once per 30 s

    succeed(job, 130.0)
    job.at(400.0)
    assert len(job.dashboard.calls) == 5, "no read once the job is not running"
    final = job.ctl.parents[KIND].get(("ml", "demo"))["status"]
    assert final["phase"] == "Succeeded" and final["progress"]["step"] == 300
    assert job.due == []
    # the write budget: Pending, Running, three reports, Succeeded
    assert job.writes()["patch_status"] == 6


def test_a_failing_dashboard_costs_no_write_and_is_read_again_next_interval(life, caplog):
    job = life()
    job.reconcile()
    job.dashboard.fail = ConnectionRefusedError("connection refused")
    start_slice(job, 1, host_ready_at=[0.6], running_at=1.5)
    job.at(100.0)
    assert len(job.dashboard.calls) == 4
    assert job.progress() == [] and job.writes()["patch_status"] == 2
    warnings = [r for r in caplog.records if "progress not read" in r.getMessage() and r.levelname == "WARNING"]
    assert len(warnings) == 1, "the same failure is logged once, not every interval"
    job.dashboard.fail = None
    job.dashboard.report(7, 3.0)
    job.at(130.0)
    assert [p["step"] for p in job.progress()] == [7]


def test_a_dashboard_that_does_not_answer_holds_no_reconcile_and_gets_one_read_at_a_time(life):
    job = life()
    job.dashboard.hold = asyncio.Event()
    job.reconcile()
    start_slice(job, 1, host_ready_at=[0.6], running_at=1.5)  # each reconcile returned meanwhile
    before = job.reconciles
    job.at(200.0)
    assert len(job.dashboard.calls) == 1 and len(job.ctl.progress.reading) == 1
    # Once an interval per delayed add this fake holds (it keeps every add; the work queue keeps the
    # earliest): 54 here; coming back every 0.1 s while the read hung made 13,502.
    assert job.reconciles - before <= 100, "while the read hangs, the job comes back once an interval"
    assert job.kube.called("patch_status")[-1][4]["phase"] == "Running"
    # the job is deleted: its read goes with it
    task = next(iter(job.ctl.progress.reading.values()))
    job.ctl.sweeps.forget(KEY)
    assert job.ctl.progress.reading == {}
    done, _ = job.loop.run_until_complete(asyncio.wait([task], timeout=10))
    assert task in done and task.cancelled()


def test_an_interval_of_zero_reads_nothing(life):
    job = life(interval=0)  # `tputorch run --progress-interval 0`
    job.reconcile()
    start_slice(job, 1, host_ready_at=[0.6], running_at=1.5)
    job.at(100.0)
    assert job.dashboard.calls == [] and job.ctl.progress.reading == {}


def test_a_deeply_nested_report_line_is_no_report_and_the_reads_go_on(life, caplog):
    """Issue 34: a report line nested deeper than Python's decoder goes raised RecursionError and
    ended the read task unlogged; it is a malformed line, and later reports are read."""
    from tputorch.train import PROGRESS_MARKER
    job = life()
    job.reconcile()
    job.dashboard.log = f"(RayTrainWorker pid=7) {PROGRESS_MARKER}{'[' * 4000}\n"
    start_slice(job, 1, host_ready_at=[0.6], running_at=1.5)
    assert len(job.dashboard.calls) == 1 and job.progress() == []
    job.dashboard.report(5, 1.0)
    job.at(31.6)
    assert [p["step"] for p in job.progress()] == [5]


# --- a key rotation: the previous key's tokens are still tried ------------------------------------

class Head:
    """A Ray head with token auth that holds ``token``: 401 without one, 403 with another (Ray 2.60,
    hack/fakedash/recorded/auth.json), and ``status`` instead where set (a head that fails otherwise)."""

    def __init__(self, token: str, status: int | None = None) -> None:
        self.token, self.status, self.tried = token, status, []

    async def driver_log(self, namespace, cluster, submission_id, token=None):
        from tputorch.controller.dashboard import DashboardError
        self.tried.append(token)
        if self.status:
            raise DashboardError(f"job info: HTTP {self.status}: Internal Server Error", self.status)
        if token != self.token:
            status = 401 if token is None else 403
            raise DashboardError(f"job info: HTTP {status}: Unauthorized", status)
        return "the log"


SECRET = "demo-ray-token-abc123"


def read(tokens, head: Head) -> str:
    return asyncio.run(controller(dashboard=head, ray_tokens=tokens).progress._driver_log("ml", CLUSTER, "demo-abc", SECRET))


def test_clusters_made_before_a_rotation_are_read_with_the_previous_key_new_ones_with_the_current():
    from tputorch.controller.dashboard import DashboardError
    from tputorch.controller.raytoken import RayTokens
    old, new = b"o" * 32, b"n" * 32
    rotated = RayTokens(new, previous=old)
    assert rotated.token("ml", SECRET) == RayTokens(new).token("ml", SECRET)  # new tokens: the current key's
    made_before = Head(RayTokens(old).token("ml", SECRET))
    assert read(rotated, made_before) == "the log"
    assert made_before.tried == rotated.candidates("ml", SECRET)  # the current key's first, then the previous
    made_after = Head(rotated.token("ml", SECRET))
    assert read(rotated, made_after) == "the log" and len(made_after.tried) == 1
    # a head that fails otherwise is not asked again with another token
    failing = Head(RayTokens(old).token("ml", SECRET), status=500)
    with pytest.raises(DashboardError, match="HTTP 500"):
        read(rotated, failing)
    assert len(failing.tried) == 1
    # the previous key removed: what was made under the new key still reads; an old cluster is refused
    assert read(RayTokens(new), Head(rotated.token("ml", SECRET))) == "the log"
    with pytest.raises(DashboardError, match="HTTP 403"):
        read(RayTokens(new), Head(RayTokens(old).token("ml", SECRET)))


def test_the_previous_key_file_is_optional_and_checked_like_the_key(tmp_path):
    from tputorch.controller.raytoken import RayTokens
    key, previous = tmp_path / "key", tmp_path / "previousKey"
    key.write_bytes(b"n" * 32 + b"\n")
    alone = RayTokens.from_file(str(key), str(previous))  # no such file: no previous key (a Secret without it)
    assert alone.candidates("ml", SECRET) == [RayTokens(b"n" * 32).token("ml", SECRET)]
    previous.write_bytes(b"o" * 32)
    both = RayTokens.from_file(str(key), str(previous))
    assert both.candidates("ml", SECRET) == [RayTokens(b"n" * 32).token("ml", SECRET), RayTokens(b"o" * 32).token("ml", SECRET)]
    previous.write_bytes(b"short")
    with pytest.raises(ValueError, match="the previous Ray token key must hold at least 32 bytes, it holds 5"):
        RayTokens.from_file(str(key), str(previous))


def test_a_cloud_storage_403_in_the_driver_log_reaches_the_status_for_its_attempt(life):
    """Issue 55: the same read of the driver's log tells a 403 from Cloud Storage; the job's status says
    who was refused, on which bucket, and the role; a later attempt starts without it."""
    from tputorch.status import storage_access

    job = life()
    job.reconcile()
    start_slice(job, 1, host_ready_at=[0.6], running_at=1.5)
    job.dashboard.report(5, 2.0)
    job.dashboard.log += ("(RayTrainWorker pid=7, ip=10.0.0.2) OSError: google::cloud::Status(PERMISSION_DENIED: Permanent "
                          "error, with a last message of principal://iam.googleapis.com/projects/1/locations/global/"
                          "workloadIdentityPools/p.svc.id.goog/subject/ns/ml/sa/default does not have "
                          "storage.objects.create access to the Google Cloud Storage object. Permission "
                          "'storage.objects.create' denied on resource '//storage.googleapis.com/projects/_/buckets/"
                          "team-ckpt/objects/run/checkpoint_000000/model.pt' (or it may not exist).)\n")
    job.at(31.6)
    written = job.ctl.parents[KIND].get(("ml", "demo"))["status"]
    found = next(c for c in written["conditions"] if c["type"] == "StorageIdentity")
    assert found["reason"] == "StorageAccessDenied" and "storage.objects.create on gs://team-ckpt" in found["message"]
    assert written["progress"]["step"] == 5  # the report of the same tail is there too
    uid = job.ctl.parents[KIND].get(("ml", "demo"))["metadata"]["uid"]
    assert job.ctl.progress.denial(uid, written["attempts"]) == storage_access.find(job.dashboard.log)
    assert job.ctl.progress.denial(uid, written["attempts"] + 1) is None  # a later attempt starts clean
def test_the_reconcile_keeps_the_goodput_ledger_from_what_it_observed(life):
    """The step after the progress read: the moments the stores hold (the job's and the RayJob's
    creation, the pods' condition times) and the script's clock in the report read make
    status.goodput, each part measured between the moments observed."""
    job = life(topology="2x2")  # one host: the slice is up once the head and it are Ready
    parent = job.ctl.parents[KIND].get(("ml", "demo"))
    job.rv += 1
    job.ctl.parents[KIND]._put({**parent, "metadata": {**parent["metadata"], "resourceVersion": str(job.rv),
                                                       "creationTimestamp": "2026-11-30T00:00:00Z"}})
    job.reconcile()
    job.kube.objects[("rayjobs", "ml", "demo")]["metadata"]["creationTimestamp"] = "2026-11-30T00:00:02Z"
    start_slice(job, 1, host_ready_at=[0.6], running_at=1.5)
    for name, role in (("head", "head"), ("worker-0", "worker")):  # the pods as the API has them: with their times
        pod = job.ctl.pods.get(("ml", name))
        times = {"PodScheduled": "2026-11-30T00:00:10Z", "Ready": "2026-11-30T00:01:00Z" if role == "head" else "2026-11-30T00:01:30Z"}
        conditions = [{**c, "lastTransitionTime": times[c["type"]]} for c in pod["status"]["conditions"]]
        job.rv += 1
        job.ctl.pods._put({**pod, "metadata": {**pod["metadata"], "resourceVersion": str(job.rv)},
                           "status": {**pod["status"], "conditions": conditions}})
    first, last = 1_795_996_900.0, 1_795_997_000.0  # 00:01:40 and 00:03:20 on the script's clock
    timing = {"attempt": 1, "at": last, "first": first, "compute_s": 90.0, "checkpoint_s": 10.0, "restore_s": 4.0}
    job.dashboard.log += progress_line({"loss": 1.0}, step=50, timing=timing) + "\n"
    job.at(31.6)
    book = job.ctl.parents[KIND].get(("ml", "demo"))["status"]["goodput"]
    assert book["seconds"] == {"teardown": 2.0, "queued": 0.0, "provisioning": 8.0, "start": 80.0, "restore": 4.0,
                               "firstStep": 6.0, "productive": 90.0, "checkpointSave": 10.0, "lostWork": 0.0,
                               "hang": 0.0, "unaccounted": 0.0}
    assert book["wallClockSeconds"] == 200.0 and book["productiveFraction"] == 0.45
    assert book["asOf"] == "2026-11-30T00:03:20.000Z"
