"""The status write budget (issue 26), counted through the fake adapter: what a job costs the API
server on its common paths, so that a regression is a failing test.

A job's life is replayed as the watches would deliver it (the RayJob's statuses as KubeRay 1.5
writes them, the pods as the scheduler and kubelet move them, every status write of ours echoed
back), on a fake clock; the work queue's delayed adds are fired when the clock passes them.
"""

from __future__ import annotations

import asyncio

import pytest

from tputorch.controller import writes
from tputorch.controller.events import EventRecorder, SpamFilter, one_per_transition
from tputorch.status import Event

from ..fakekube import FakeKube, controller
from ..jobs import body

KIND = "TPUTorchJob"
KEY = (KIND, "ml", "demo")
CLUSTER = "demo-raycluster-x7k2p"


class Life:
    """One job on a controller with a fake clock; every change is followed by the reconcile its
    watch event would cause, and the status we write comes back as the job's next version."""

    def __init__(self, interval: float = 2.0, topology: str = "4x4", **spec) -> None:
        self.t = 0.0
        self.kube = FakeKube()
        self.ctl = controller(self.kube, status_interval=interval, monotonic=lambda: self.t)
        self.due: list[tuple[float, tuple]] = []  # the queue's delayed adds: (when, key)
        self.ctl.queue.add_after = lambda key, delay: self.due.append((self.t + delay, key))
        self.rv = 10
        job = body(tpu={"topology": topology}, **spec)
        job["metadata"].update(uid="uid-demo", resourceVersion=str(self.rv))
        self.ctl.parents[KIND]._put(job)
        self.rayjob_status: dict = {}
        self.loop = asyncio.new_event_loop()
        self._echoed = 0

    def close(self) -> None:
        self.loop.close()

    def reconcile(self) -> str:
        result = self.loop.run_until_complete(self.ctl.reconcile(KEY))
        self._echo()
        return result

    def _echo(self) -> None:
        """Our last status write, as the job's watch brings it back (a merge patch: null removes)."""
        patches = self.kube.called("patch_status")
        if len(patches) == self._echoed:
            return
        self._echoed = len(patches)
        job = self.ctl.parents[KIND].get(("ml", "demo"))
        status = dict(job.get("status") or {})
        for k, v in patches[-1][4].items():
            if v is None:
                status.pop(k, None)
            else:
                status[k] = v
        self.rv += 1
        self.ctl.parents[KIND]._put({**job, "metadata": {**job["metadata"], "resourceVersion": str(self.rv)},
                                     "status": status})
        self.loop.run_until_complete(self.ctl.reconcile(KEY))  # the echo's own event: nothing to write

    def at(self, t: float) -> None:
        """The clock moves to t; every delayed add that falls due on the way is reconciled then."""
        while True:
            due = sorted(d for d in self.due if d[0] <= t)
            if not due:
                break
            self.due.remove(due[0])
            self.t = max(self.t, due[0][0])
            self.reconcile()
        self.t = t

    def rayjob(self, t: float, **status) -> None:
        self.at(t)
        self.rayjob_status = {**self.rayjob_status, **status}
        # the store holds what the watch brought; before the first event, the RayJob we created
        child = (self.ctl.children[KIND].get(("ml", "demo"))
                 or self.ctl.children[KIND].slim(self.kube.objects[("rayjobs", "ml", "demo")]))
        self.rv += 1
        self.ctl.children[KIND]._put({**child, "metadata": {**child["metadata"], "resourceVersion": str(self.rv)},
                                      "status": dict(self.rayjob_status)})
        self.reconcile()

    def pod(self, t: float, name: str, role: str, scheduled: bool = True, ready: bool = False,
            unschedulable: str = "") -> None:
        self.at(t)
        conditions = [{"type": "PodScheduled", "status": "True" if scheduled else "False"},
                      {"type": "Ready", "status": "True" if ready else "False"}]
        if unschedulable:
            conditions[0].update(reason="Unschedulable", message=unschedulable)
        self.rv += 1
        self.ctl.pods._put({"metadata": {"name": name, "namespace": "ml", "resourceVersion": str(self.rv), "labels": {
            "tputorch.io/job": "demo", "ray.io/cluster": CLUSTER, "ray.io/node-type": role}},
            "status": {"conditions": conditions}})
        self.reconcile()

    def events(self) -> list[str]:
        self.loop.run_until_complete(self.ctl.recorder.drain())
        return [c[2] for c in self.kube.called("event")]

    def phases(self) -> list[str]:
        return [c[4]["phase"] for c in self.kube.called("patch_status")]

    def writes(self) -> dict[str, int]:
        self.events()
        return {verb: len(self.kube.called(verb)) for verb in ("create", "patch", "patch_status", "event")}


def lives_of(kind: type) -> object:
    """A fixture making ``kind`` lives (a Life or a subclass) for a test, each closed after it."""
    @pytest.fixture
    def life():
        lives = []

        def make(**kw):
            lives.append(kind(**kw))
            return lives[-1]
        yield make
        for one in lives:
            one.close()
    return life


life = lives_of(Life)


def start_slice(life: Life, hosts: int, host_ready_at: list[float], running_at: float) -> None:
    """KubeRay's path for a new RayJob: Initializing with its RayCluster, the head and every TPU host
    pod scheduled then Ready, the job submitted and Running."""
    life.rayjob(0.1, jobDeploymentStatus="Initializing", rayClusterName=CLUSTER,
                rayClusterStatus={"desiredWorkerReplicas": hosts})
    life.pod(0.2, "head", "head")
    for i in range(hosts):
        life.pod(0.2, f"worker-{i}", "worker")
    life.pod(0.3, "head", "head", ready=True)
    for i, t in enumerate(host_ready_at):
        life.pod(t, f"worker-{i}", "worker", ready=True)
        life.rayjob(t, rayClusterStatus={"desiredWorkerReplicas": hosts, "readyWorkerReplicas": i + 1})
    life.rayjob(running_at, jobDeploymentStatus="Running", jobStatus="RUNNING", jobId="demo-abc",
                startTime="2026-11-30T00:00:01Z", dashboardURL=f"{CLUSTER}-head-svc.ml.svc.cluster.local:8265")


def succeed(life: Life, t: float) -> None:
    life.rayjob(t, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED", endTime="2026-11-30T00:01:00Z",
                message="Job finished successfully.")


def test_submit_running_succeeded_costs_two_creates_three_status_writes_three_events(life):
    job = life()
    assert job.reconcile() == "created"
    # the critical path: the RayJob and its Ray token's Secret, then one status write that says it all
    assert [c[:2] for c in job.kube.calls] == [("create", "rayjobs"), ("create", "secrets"), ("patch_status", "tputorchjobs")]
    first = job.kube.called("patch_status")[0][4]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in first["conditions"]}
    assert first["phase"] == "Pending"
    assert conditions["Validated"] == ("True", "Valid") and conditions["RayJobCreated"] == ("True", "Created")
    assert job.kube.called("event") == []  # events never wait on the reconcile's path

    start_slice(job, 4, host_ready_at=[0.6, 0.8, 1.0, 1.2], running_at=1.5)  # Running within 2 s
    job.at(5.0)  # every delayed add fires: nothing more to write
    succeed(job, 30.0)
    job.at(60.0)

    assert job.writes() == {"create": 2, "patch": 0, "patch_status": 3, "event": 3}
    assert job.phases() == ["Pending", "Running", "Succeeded"]
    running = job.kube.called("patch_status")[1][4]
    assert (running["readyHosts"], running["hostsReady"]) == (4, "4/4")  # the latest counts
    assert job.events() == ["Created", "Running", "JobSucceeded"]


def test_a_slice_that_comes_up_slowly_is_reported_every_interval_with_the_latest_counts(life):
    job = life()
    job.reconcile()
    # one host every 0.7 s: 5.6 s from the first host to the last, then Running at 9 s
    start_slice(job, 4, host_ready_at=[2.1, 2.8, 3.5, 4.2], running_at=9.0)
    job.at(20.0)
    succeed(job, 30.0)
    writes = job.kube.called("patch_status")
    assert job.phases()[0] == "Pending" and job.phases()[-2:] == ["Running", "Succeeded"]
    progress = writes[1:-2]
    # 0.1 .. 4.2 s of progress in 2 s steps: written at 2, 4 and 6 s, each with the counts of then
    assert 1 <= len(progress) <= 3
    # whatever the number, the last progress write before Running carries every host ready
    assert progress[-1][4]["readyHosts"] == 4
    assert job.writes()["event"] <= len(writes)


def test_progress_never_goes_out_faster_than_the_interval_and_a_put_off_write_is_not_lost(life):
    job = life()
    job.reconcile()
    job.rayjob(0.1, jobDeploymentStatus="Initializing", rayClusterName=CLUSTER)
    written_at = [0.0]
    for step in range(1, 60):  # a host flapping Ready/NotReady every 0.1 s for 6 s
        t = round(0.1 + step * 0.1, 2)
        before = len(job.kube.called("patch_status"))
        job.pod(t, "worker-0", "worker", ready=step % 2 == 1)
        if len(job.kube.called("patch_status")) > before:
            written_at.append(job.t)
    assert all(b - a >= 2.0 for a, b in zip(written_at, written_at[1:])), written_at
    assert len(written_at) <= 1 + 6 / 2 + 1
    # no event after the last flip: the put-off write still goes out, with what holds then
    last = job.ctl.pods.get(("ml", "worker-0"))
    ready_now = any(c["type"] == "Ready" and c["status"] == "True" for c in last["status"]["conditions"])
    job.at(30.0)
    assert job.kube.called("patch_status")[-1][4]["readyHosts"] == int(ready_now)
    assert job.due == []


def test_with_no_interval_every_change_is_written(life):
    """Today's behaviour before the budget, kept as a switch (`--status-interval 0`): it is what the
    budget test above would see without coalescing."""
    job = life(interval=0)
    job.reconcile()
    start_slice(job, 4, host_ready_at=[0.6, 0.8, 1.0, 1.2], running_at=1.5)
    succeed(job, 30.0)
    assert len(job.kube.called("patch_status")) > 3


def test_a_waiting_job_is_written_once_and_then_only_when_its_reason_moves(life):
    job = life()
    job.reconcile()
    job.rayjob(0.1, jobDeploymentStatus="Initializing", rayClusterName=CLUSTER)
    message = "0/12 nodes are available: 4 Insufficient google.com/tpu, 8 node(s) didn't match Pod's node affinity/selector."
    for t in range(1, 300, 10):  # the scheduler retries for 5 min; the counts move, the substance does not
        job.pod(float(t), "worker-0", "worker", scheduled=False,
                unschedulable=message.replace("0/12", f"0/{12 + t % 3}"))
    job.at(400.0)
    assert job.writes()["patch_status"] == 2  # Created, then Unschedulable
    assert job.events() == ["Created", "Unschedulable"]


def test_an_invalid_job_costs_one_status_write_and_one_event(life):
    job = life(topology="3x3")
    assert job.reconcile() == "invalid"
    job.at(10.0)
    job.reconcile()
    assert job.writes() == {"create": 0, "patch": 0, "patch_status": 1, "event": 1}
    assert job.events() == ["ValidationFailed"]


# --- the pure pieces ---------------------------------------------------------------------------------

def test_write_delay_puts_off_progress_only():
    pending = {"phase": "Pending", "observedGeneration": 1, "readyHosts": 1}
    more = {**pending, "readyHosts": 2}
    assert writes.write_delay(pending, more, None, 5.0, 2.0) == 0  # nothing written by this process yet
    assert writes.write_delay(pending, more, 4.5, 5.0, 2.0) == pytest.approx(1.5)
    assert writes.write_delay(pending, more, 1.0, 5.0, 2.0) == 0
    assert writes.write_delay(pending, {**more, "phase": "Running"}, 4.9, 5.0, 2.0) == 0
    assert writes.write_delay(pending, {**more, "observedGeneration": 2}, 4.9, 5.0, 2.0) == 0
    assert writes.write_delay(pending, more, 4.9, 5.0, 0) == 0


def test_one_event_per_transition_prefers_a_warning_then_the_last():
    hosts, running = Event("Normal", "AllHostsReady", "4/4"), Event("Normal", "Running", "r")
    warn = Event("Warning", "AppFailed", "x")
    assert one_per_transition([]) is None
    assert one_per_transition([hosts, running]) == running
    assert one_per_transition([Event("Normal", "JobFinished", ""), warn]) == warn
    assert one_per_transition([warn, running]) == warn


def test_the_spam_filter_allows_a_burst_per_object_and_reason_then_one_per_refill():
    spam = SpamFilter(burst=3, refill_s=300)
    assert [spam.allow("u", "Unschedulable", 0) for _ in range(4)] == [True, True, True, False]
    assert spam.allow("u", "Running", 0) and spam.allow("other", "Unschedulable", 0)
    assert not spam.allow("u", "Unschedulable", 299)
    assert spam.allow("u", "Unschedulable", 301) and not spam.allow("u", "Unschedulable", 302)
    spam.forget("u")
    assert spam.allow("u", "Unschedulable", 302)


def test_events_wait_while_objects_wait_for_a_reconcile_and_never_hold_one_up():
    async def scenario():
        posted, t, busy = [], [0.0], [True]
        hang = asyncio.Event()

        async def post(regarding, event):
            if event.reason == "Hang":
                await hang.wait()
            posted.append(event.reason)
        recorder = EventRecorder(post, busy=lambda: busy[0], max_hold=10.0, monotonic=lambda: t[0])
        worker = asyncio.create_task(recorder.run(poll=0.001))
        recorder.record({"uid": "a"}, [Event("Normal", "Created", "")])
        await asyncio.sleep(0.02)
        held = list(posted)
        busy[0] = False
        await asyncio.sleep(0.02)
        after_idle = list(posted)
        # a post that never returns holds the event worker only: recording goes on at once
        recorder.record({"uid": "a"}, [Event("Normal", "Hang", "")])
        await asyncio.sleep(0.01)
        recorder.record({"uid": "b"}, [Event("Normal", "Created", "")])
        busy[0], t[0] = True, 100.0  # busy for good, but the oldest event has waited past max_hold
        hang.set()
        await asyncio.sleep(0.02)
        worker.cancel()
        return held, after_idle, posted
    held, after_idle, posted = asyncio.run(scenario())
    assert held == [] and after_idle == ["Created"]
    assert posted == ["Created", "Hang", "Created"]


def test_a_status_write_never_waits_for_its_event():
    kube = FakeKube()
    never = asyncio.Event()

    async def post_event(regarding, event):
        await never.wait()
    kube.post_event = post_event
    ctl = controller(kube)
    job = body()
    job["metadata"].update(uid="u1", resourceVersion="1")
    ctl.parents[KIND]._put(job)
    assert asyncio.run(asyncio.wait_for(ctl.reconcile(KEY), 1)) == "created"
    assert len(ctl.recorder.pending) == 1


# ---------------------------------------------------------------- a burst (issue 40)

def burst_controller(t: list[float]):
    """Two new jobs; the first is reconciled while the second still waits in the queue."""
    ctl = controller(FakeKube(), monotonic=lambda: t[0])
    for i, name in enumerate(("first", "second")):
        job = body(name=name)
        job["metadata"].update(uid=f"uid-{i}", resourceVersion=str(i + 1))
        ctl.parents[KIND]._put(job)
    return ctl


def test_in_a_burst_a_first_status_waits_for_the_other_jobs_creates_then_is_written():
    async def scenario():
        t = [0.0]
        ctl = burst_controller(t)
        first, second = (KIND, "ml", "first"), (KIND, "ml", "second")
        ctl.queue.add(second)  # another job waits for its reconcile
        assert await ctl.reconcile(first) == "created"
        held = len(ctl.kube.called("patch_status"))
        assert await asyncio.wait_for(ctl.queue.get(), 1) == second  # the queue runs dry: the parked key is let out
        released = len(ctl.queue)
        assert await ctl.reconcile(second) == "created"  # nothing else waits: written at once
        assert await asyncio.wait_for(ctl.queue.get(), 1) == first
        assert await ctl.reconcile(first) == "unchanged"
        return held, released, [c[3] for c in ctl.kube.called("patch_status")], ctl.writes.held_since
    held, released, written, held_since = asyncio.run(scenario())
    assert held == 0 and released == 1  # RayJob created, its status put off behind the other job
    assert written == ["second", "first"] and held_since == {}


def test_a_first_status_waits_at_most_the_hold_while_others_keep_waiting():
    async def scenario():
        t = [0.0]
        ctl = burst_controller(t)
        ctl.queue.add((KIND, "ml", "second"))
        await ctl.reconcile((KIND, "ml", "first"))
        t[0] = writes.FIRST_STATUS_HOLD - 0.5  # others still wait: parked again for what is left
        await ctl.reconcile((KIND, "ml", "first"))
        before = len(ctl.kube.called("patch_status"))
        t[0] = writes.FIRST_STATUS_HOLD  # the hold is over: written though others still wait
        await ctl.reconcile((KIND, "ml", "first"))
        return before, [c[3] for c in ctl.kube.called("patch_status")]
    before, written = asyncio.run(scenario())
    assert before == 0 and written == ["first"]


def test_first_status_waits_only_for_an_object_without_status_while_others_wait():
    assert writes.first_status_waits({}, True, 0.0, 2.0)
    assert not writes.first_status_waits({}, False, 0.0, 2.0)
    assert not writes.first_status_waits({}, True, 2.0, 2.0)
    assert not writes.first_status_waits({"phase": "Pending"}, True, 0.0, 2.0)
