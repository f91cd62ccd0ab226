"""What submit/serve show and which exit code they return: views, renderers, and the follow loop
driven by a fake API (the cluster tests drive it with the real one)."""

from __future__ import annotations

import io
import json
import threading
from types import SimpleNamespace

import pytest

from tputorch.cli import client, display, submit
from tputorch.cli.display import View

UNSCHEDULABLE = ("pod llama-tpu-slice-worker-0: Unschedulable: 0/9 nodes are available: "
                 "4 Insufficient google.com/tpu, 5 node(s) didn't match Pod's node affinity/selector.")


def job(phase="", ready=0, hosts=4, job_status=None, conditions=(), message="", name="llama", ns="team"):
    status = {"phase": phase, "hosts": hosts, "readyHosts": ready, "hostsReady": f"{ready}/{hosts}",
              "message": message, "conditions": [dict(type=t, status=s, reason=r, message=m) for t, s, r, m in conditions]}
    if job_status:
        status["jobStatus"] = job_status
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": "1"}, "status": status if phase else {}}


def test_pending_view_carries_the_schedulers_message():
    v = display.view("TPUTorchJob", job("Pending", conditions=[("SliceReady", "False", "Unschedulable", UNSCHEDULABLE)]))
    assert v.waiting == UNSCHEDULABLE
    assert display.outcome(v, "Succeeded") is None
    assert display.summary(v) == f"Pending  0/4 TPU hosts  waiting: {UNSCHEDULABLE}"


def test_merely_waiting_for_hosts_is_not_news():
    v = display.view("TPUTorchJob", job("Pending", 2, conditions=[("SliceReady", "False", "WaitingForHosts", "2/4 TPU hosts ready")]))
    assert v.waiting is None and display.summary(v) == "Pending  2/4 TPU hosts"


def test_missing_kuberay_is_shown_while_waiting():
    v = display.view("TPUTorchJob", job("Pending", conditions=[("RayJobCreated", "False", "KubeRayNotInstalled", "no RayJob CRD")]))
    assert v.waiting == "no RayJob CRD"


def test_running_and_the_ray_job_status():
    v = display.view("TPUTorchJob", job("Running", 4, job_status="RUNNING"))
    assert display.summary(v) == "Running  4/4 TPU hosts  Ray job RUNNING"
    assert display.outcome(v, "Succeeded") is None


def test_a_running_job_shows_what_its_script_last_reported():
    obj = job("Running", 4, job_status="RUNNING")
    obj["status"]["progress"] = {"step": 300, "epoch": 1, "metrics": {"loss": 0.123456, "acc": 0.5, "a": 1, "b": 2,
                                                                     "c": 3}, "reportedAt": "2026-12-01T10:00:00Z"}
    v = display.view("TPUTorchJob", obj)
    assert display.summary(v) == "Running  4/4 TPU hosts  Ray job RUNNING  step 300, epoch 1, loss 0.1235, acc 0.5, a 1, b 2"
    assert v.to_json()["progress"] == "step 300, epoch 1, loss 0.1235, acc 0.5, a 1, b 2"
    obj["status"]["progress"] = {"step": "300", "metrics": ["junk"]}  # an edited status prints nothing odd
    assert display.view("TPUTorchJob", obj).progress == ""


@pytest.mark.parametrize("phase, failed, code", [
    ("Succeeded", None, display.OK),
    ("Failed", ("Failed", "True", "AppFailed", "Ray job failed: exit 1"), display.FAILED),
    ("Failed", ("Failed", "True", "ValidationFailed", "invalid spec"), display.INVALID),
])
def test_exit_codes(phase, failed, code):
    v = display.view("TPUTorchJob", job(phase, conditions=[failed] if failed else [], message="m"))
    assert display.outcome(v, "Succeeded") == code


def test_failure_text_names_kuberays_reason():
    v = display.view("TPUTorchJob", job("Failed", job_status="FAILED", message="Job failed: Traceback ...",
                                         conditions=[("Failed", "True", "AppFailed", "Job failed: Traceback ...")]))
    assert v.reason == "AppFailed"
    assert display.final_text(v, display.FAILED) == "TPUTorchJob team/llama Failed (AppFailed): Job failed: Traceback ..."


def test_a_service_is_followed_until_ready_and_shows_its_endpoint():
    deploying = {"metadata": {"name": "llm", "namespace": "t"}, "status": {"phase": "Deploying"}}
    ready = {"metadata": {"name": "llm", "namespace": "t"}, "status": {"phase": "Ready", "endpoint": "http://llm-serve.t:8000"}}
    assert display.outcome(display.view("TPUTorchService", deploying), "Ready") is None
    v = display.view("TPUTorchService", ready)
    assert display.outcome(v, "Ready") == display.OK
    assert display.final_text(v, display.OK).endswith("is Ready; endpoint: http://llm-serve.t:8000")


def test_a_service_edit_under_way_is_waited_for_and_one_never_applied_ends_the_wait():
    def svc(reason):
        return {"metadata": {"name": "llm", "namespace": "t"}, "status": {"phase": "Updating" if reason == "Upgrading" else "Ready",
                "conditions": [{"type": "SpecApplied", "status": "False", "reason": reason, "message": f"because {reason}"}]}}
    assert display.outcome(display.view("TPUTorchService", svc("Upgrading")), "Ready") is None
    for reason in ("UpgradeStrategyNone", "TolerationsNotApplied"):
        v = display.view("TPUTorchService", svc(reason))
        assert (display.outcome(v, "Ready"), v.not_applied) == (display.FAILED, f"because {reason}")
        assert v.to_json()["notApplied"] == f"because {reason}"


def test_plain_renderer_prints_a_line_per_change_only():
    out, err = io.StringIO(), io.StringIO()
    r = display.PlainRenderer(out, err)
    pending = display.view("TPUTorchJob", job("Pending"))
    r.update(pending)
    r.update(pending)
    r.update(display.view("TPUTorchJob", job("Running", 4)))
    r.log("epoch 1 loss 0.3")
    lines = out.getvalue().splitlines()
    assert [line.split("] ", 1)[1] for line in lines[:2]] == ["llama: Pending  0/4 TPU hosts", "llama: Running  4/4 TPU hosts"]
    assert lines[2] == "epoch 1 loss 0.3"


def test_json_renderer_is_one_object_per_line():
    out = io.StringIO()
    r = display.JsonRenderer(out)
    r.created("TPUTorchJob", "llama", "team")
    v = display.view("TPUTorchJob", job("Succeeded", 4, job_status="SUCCEEDED"))
    r.update(v)
    r.log("done")
    r.finish(v, 0)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["created", "status", "log", "finished"]
    assert events[1]["readyHosts"] == 4 and events[1]["rayJobStatus"] == "SUCCEEDED"
    assert events[3]["exitCode"] == 0 and events[3]["phase"] == "Succeeded"


def test_rich_panel_shows_bar_hosts_ray_status_and_reason():
    from rich.console import Console

    r = display.RichRenderer(io.StringIO())
    r.update(display.view("TPUTorchJob", job("Pending", 3, job_status="PENDING",
                                              conditions=[("SliceReady", "False", "Unschedulable", UNSCHEDULABLE)])))
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(r._panel())
    r.close()
    text = console.export_text()
    assert "Pending" in text and "TPU hosts" in text and "3/4" in text and "━" in text
    assert "Ray job" in text and "PENDING" in text and "Insufficient google.com/tpu" in text


# ---------------------------------------------------------------- follow() with a fake API

class Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


class FakeApi:
    """Hands out the given object versions and driver-log lines as the real Api's threads would see them."""

    def __init__(self, versions, log_lines=(), log_follow_blocks=False):
        self.versions = versions
        self.log_lines = list(log_lines)
        self.log_follow_blocks = log_follow_blocks
        pod = SimpleNamespace(metadata=SimpleNamespace(name="llama-abcde"), status=SimpleNamespace(phase="Running"))
        self.pods = [pod]
        self.core = SimpleNamespace(read_namespaced_pod=lambda name, ns: SimpleNamespace(status=SimpleNamespace(phase="Succeeded")))

    def watch_object(self, kind, name, namespace, stop, timeout_seconds=60):
        for obj in self.versions:
            if stop.wait(0.05):
                return
            yield obj
        stop.wait()

    def submitter_pods(self, rayjob, namespace):
        return self.pods

    def pod_log(self, pod, namespace, container=None, follow=False):
        yield from self.log_lines
        if follow and self.log_follow_blocks:  # KWOK's fake kubelet: a followed log never ends
            threading.Event().wait(30)


def test_follow_reaches_succeeded_with_the_driver_log_and_exit_0():
    api = FakeApi([job("Pending"), job("Running", 4, job_status="RUNNING"), job("Succeeded", 4, job_status="SUCCEEDED")],
                  ["Ray job started", "epoch 1", "Job 'llama' succeeded"])
    out = Recorder()
    assert submit.follow(api, client.JOB, "llama", "team", out, "Succeeded") == 0
    assert [c[1] for c in out.calls if c[0] == "log"] == ["Ray job started", "epoch 1", "Job 'llama' succeeded"]
    assert out.calls[-2][0] == "finish" and out.calls[-2][2] == 0


def test_follow_does_not_hang_on_a_log_that_never_ends(monkeypatch):
    monkeypatch.setattr(submit, "LOG_QUIET_SECONDS", 0.5)
    api = FakeApi([job("Running", 4), job("Failed", 4, job_status="FAILED",
                                           conditions=[("Failed", "True", "AppFailed", "boom")], message="boom")],
                  ["Traceback", "ValueError: boom"], log_follow_blocks=True)
    out = Recorder()
    assert submit.follow(api, client.JOB, "llama", "team", out, "Succeeded") == 1
    finish = next(c for c in out.calls if c[0] == "finish")
    assert finish[1].reason == "AppFailed" and [c[1] for c in out.calls if c[0] == "log"] == ["Traceback", "ValueError: boom"]


def test_follow_a_deleted_job_exits_1():
    out = Recorder()
    assert submit.follow(FakeApi([job("Running", 4), None]), client.JOB, "llama", "team", out, "Succeeded") == 1
    assert next(c for c in out.calls if c[0] == "finish")[1].reason == "Deleted"


def test_interrupt_leaves_the_job_and_exits_130(monkeypatch):
    class Interrupting(Recorder):
        def update(self, v):
            raise KeyboardInterrupt

    out = Interrupting()
    assert submit.follow(FakeApi([job("Running", 4)]), client.JOB, "llama", "team", out, "Succeeded") == 130
    assert out.calls[0] == ("interrupted", "TPUTorchJob", "llama", "team")
    assert "keeps running" in display.interrupted_text("TPUTorchJob", "llama", "team")


def test_view_is_pure_data():
    v = display.view("TPUTorchJob", job("Running", 2))
    assert isinstance(v, View) and v.hosts_text == "2/4 TPU hosts"


def test_a_retrying_job_shows_its_attempt_and_why_the_last_one_ended():
    obj = job("Retrying", 0, message="attempt 1 ended: TPU host pod llama-w-2 was deleted (infrastructure failure); starting attempt 2")
    obj["status"]["attempts"] = 2
    v = display.view("TPUTorchJob", obj)
    assert display.outcome(v, "Succeeded") is None  # not over: the next attempt runs
    assert display.summary(v).startswith("Retrying  attempt 2  attempt 1 ended: TPU host pod llama-w-2 was deleted")
    assert v.to_json()["attempt"] == 2
    assert "attempt" not in display.summary(display.view("TPUTorchJob", job("Running", 4)))


KUEUE_PENDING = ("couldn't assign flavors to pod set tpu-slice: insufficient unused quota for google.com/tpu in "
                 "flavor v6e-4x4, 16 more needed")


def test_a_job_queued_by_kueue_shows_kueues_reason_while_waiting():
    v = display.view("TPUTorchJob", job("Queued", conditions=[
        ("Admitted", "False", "Pending", KUEUE_PENDING),
        ("SliceReady", "False", "WaitingForKueue", "queued by Kueue: the job holds no slice")]))
    assert v.waiting == KUEUE_PENDING
    assert display.outcome(v, "Succeeded") is None  # still on its way
    assert display.summary(v) == f"Queued  0/4 TPU hosts  waiting: {KUEUE_PENDING}"
