"""get / describe / wait without a cluster: durations, --for, rows and the describe text."""

from __future__ import annotations

import datetime as dt

import pytest

from tputorch.api.status_schema import GOODPUT_PARTS
from tputorch.cli import manage

NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1h", 3600), ("1h30m", 5400), ("45", 45), ("2.5", 2.5)])
def test_parse_duration(text, seconds):
    assert manage.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1d", "-5s", "1m1h"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError, match="--timeout"):
        manage.parse_duration(text)


def test_parse_for():
    assert manage.parse_for("phase=Succeeded") == ("phase", "Succeeded")
    assert manage.parse_for("condition=SliceReady") == ("condition", "SliceReady")
    for bad in ("Succeeded", "phase=", "status=Ready"):
        with pytest.raises(ValueError, match="--for"):
            manage.parse_for(bad)


def test_met():
    obj = {"status": {"phase": "Running", "conditions": [{"type": "SliceReady", "status": "True"},
                                                         {"type": "Succeeded", "status": "False"}]}}
    assert manage.met(obj, "phase", "Running") and not manage.met(obj, "phase", "Succeeded")
    assert manage.met(obj, "condition", "SliceReady") and not manage.met(obj, "condition", "Succeeded")


def test_met_waits_for_the_status_of_the_current_generation():
    # kubectl apply of an edit, then tputorch wait --for phase=Ready: the Ready of generation 1 is not the edit's.
    edited = {"metadata": {"generation": 2}, "status": {"phase": "Ready", "observedGeneration": 1}}
    assert not manage.met(edited, "phase", "Ready")
    assert manage.met({**edited, "status": {"phase": "Ready", "observedGeneration": 2}}, "phase", "Ready")
    # A status written before observedGeneration existed (an older operator) still counts.
    assert manage.met({"metadata": {"generation": 2}, "status": {"phase": "Ready"}}, "phase", "Ready")


@pytest.mark.parametrize("created, shown", [("2026-11-30T11:59:30Z", "30s"), ("2026-11-30T11:55:00Z", "5m"),
                                            ("2026-11-30T09:00:00Z", "3h"), ("2026-11-28T12:00:00Z", "2d"), (None, "?")])
def test_age(created, shown):
    assert manage.age(created, NOW) == shown


def test_rows_and_table():
    jobs = [{"metadata": {"name": "llama", "namespace": "a", "creationTimestamp": "2026-11-30T11:58:00Z"},
             "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}},
             "status": {"phase": "Running", "hostsReady": "4/4", "jobStatus": "RUNNING",
                        "progress": {"step": 1200, "metrics": {"loss": 0.41}}}}]
    services = [{"metadata": {"name": "chat", "namespace": "a", "creationTimestamp": "2026-11-30T11:00:00Z"},
                 "spec": {"tpu": {"accelerator": "v6e", "topology": "2x4"}},
                 "status": {"phase": "Ready", "endpoint": "http://chat-serve.a.svc:8000"}}]
    body = manage.rows("ttj", jobs, NOW, False) + manage.rows("ttsvc", services, NOW, False)
    assert body == [["llama", "ttj", "v6e", "4x4", "Running", "4/4", "1200", "RUNNING", "2m"],
                    ["chat", "ttsvc", "v6e", "2x4", "Ready", "", "", "http://chat-serve.a.svc:8000", "1h"]]
    text = manage.table(["NAME", "KIND", "ACCELERATOR", "TOPOLOGY", "PHASE", "HOSTS", "STEP", "RAY JOB / ENDPOINT", "AGE"], body)
    header, first, _ = text.splitlines()
    assert header.index("PHASE") == first.index("Running")
    assert manage.rows("ttj", jobs, NOW, True)[0][0] == "a"


def test_describe_text():
    obj = {"metadata": {"name": "llama", "namespace": "a"},
           "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "img", "entrypoint": "python t.py"},
           "status": {"phase": "Pending", "hostsReady": "0/4", "message": "waiting",
                      "conditions": [{"type": "SliceReady", "status": "False", "reason": "Unschedulable",
                                      "message": "0/9 nodes are available"}]}}
    pods = [{"name": "llama-head", "role": "head", "node": "gke-cpu-pool-0", "phase": "Running"},
            {"name": "llama-w-0", "role": "worker", "node": None, "phase": "Pending"}]
    events = [{"type": "Warning", "reason": "Unschedulable", "age": "1m", "message": "SliceReady=False: 0/9 nodes"}]
    text = manage.describe_text("TPUTorchJob", obj, events, pods)
    assert "Slice:       v6e 4x4" in text and "Entrypoint:  python t.py" in text and "Hosts:       0/4" in text
    assert "SliceReady   False    Unschedulable   0/9 nodes are available" in text
    assert "llama-w-0    worker   <unscheduled>" in text
    assert "Warning   Unschedulable   1m    SliceReady=False: 0/9 nodes" in text
    assert "Events:      <none>" in manage.describe_text("TPUTorchJob", obj, [], [])


def test_describe_shows_the_training_progress_and_the_last_checkpoint():
    obj = {"metadata": {"name": "llama", "namespace": "a"},
           "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "img", "entrypoint": "python t.py"},
           "status": {"phase": "Running", "lastCheckpoint": "gs://b/llama-1a2b3c4d/checkpoint_000003",
                      "progress": {"step": 1200, "epoch": 3, "metrics": {"loss": 0.412734, "lr": 0.0001, "tokens": 10**9},
                                   "reportedAt": "2026-12-01T10:00:30Z"}}}
    text = manage.describe_text("TPUTorchJob", obj, [], [])
    assert "Progress:    step 1200, epoch 3, loss 0.4127, lr 0.0001, tokens 1000000000 (read 2026-12-01T10:00:30Z)" in text
    assert "Checkpoint:  gs://b/llama-1a2b3c4d/checkpoint_000003" in text
    bare = manage.describe_text("TPUTorchJob", {**obj, "status": {"phase": "Running"}}, [], [])
    assert "Progress" not in bare and "Checkpoint" not in bare


def test_describe_lists_the_attempts_and_why_each_ended():
    obj = {"metadata": {"name": "llama", "namespace": "a"},
           "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "img", "entrypoint": "python t.py"},
           "status": {"phase": "Running", "attempts": 2, "attemptHistory": [
               {"attempt": 1, "result": "Infrastructure", "reason": "NodeDeleted", "endTime": "2026-12-01T10:00:00Z",
                "message": "TPU host pod llama-w-2 on node gke-tpu-2: DeletionByPodGC"}]}}
    text = manage.describe_text("TPUTorchJob", obj, [], [])
    assert "Attempt:     2" in text
    assert "1   Infrastructure   NodeDeleted   2026-12-01T10:00:00Z   TPU host pod llama-w-2" in text
    first = {**obj, "status": {"phase": "Running", "attempts": 1}}
    assert "Attempt" not in manage.describe_text("TPUTorchJob", first, [], [])


def test_describe_shows_where_kueue_has_the_job():
    obj = {"metadata": {"name": "llama", "namespace": "a"},
           "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "img", "queueName": "tpu",
                    "priorityClassName": "tpu-low"},
           "status": {"phase": "Queued", "workload": "rayjob-llama-1a2b3",
                      "conditions": [{"type": "Admitted", "status": "False", "reason": "Pending",
                                      "message": "insufficient unused quota for google.com/tpu"}]}}
    text = manage.describe_text("TPUTorchJob", obj, [], [])
    assert "Phase:       Queued" in text
    assert "Queue:       tpu (priority tpu-low, Workload rayjob-llama-1a2b3)" in text
    assert "Admitted   False    Pending   insufficient unused quota for google.com/tpu" in text


def test_get_notes_an_object_whose_child_keeps_an_older_rendering():
    from tputorch.cli.manage import rendering_notes
    older = {"metadata": {"name": "qwen"}, "status": {"conditions": [
        {"type": "RenderingCurrent", "status": "False", "reason": "OlderRendering", "message": "m"}]}}
    current = {"metadata": {"name": "other"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    (note,) = rendering_notes([older, current])
    assert note.startswith("qwen: RenderingCurrent=False (OlderRendering)") and "tputorch describe qwen" in note


def test_describe_shows_the_goodput_ledger_per_part_for_the_job_and_its_latest_attempts():
    parts = dict.fromkeys(GOODPUT_PARTS, 0.0)
    one = {**parts, "provisioning": 40.0, "productive": 420.0, "lostWork": 150.0, "unaccounted": 12.0}
    two = {**parts, "teardown": 45.0, "productive": 600.0, "restore": 25.0}
    job = {p: one[p] + two[p] for p in parts}
    status = {"phase": "Running", "goodput": {
        "productiveFraction": 0.7895, "wallClockSeconds": 1292.0, "asOf": "2026-12-07T10:33:00.000Z", "seconds": job,
        "attempts": [{"attempt": 1, "result": "Infrastructure", "wallClockSeconds": 622.0, "seconds": one},
                     {"attempt": 2, "wallClockSeconds": 670.0, "seconds": two}]}}
    obj = {"metadata": {"name": "llama", "namespace": "a"}, "spec": {"tpu": {}}, "status": status}
    lines = manage.describe_text("TPUTorchJob", obj, [], []).splitlines()
    assert "Goodput:     79.0% productive of 21m32s (as of 2026-12-07T10:33:00.000Z)" in lines
    at = lines.index("Goodput:     79.0% productive of 21m32s (as of 2026-12-07T10:33:00.000Z)")
    rows = [line.split() for line in lines[at + 1:at + 8]]
    assert rows[0] == ["PART", "JOB", "%", "ATTEMPT", "1", "ATTEMPT", "2"]
    # every part either attempt spent time in, in the ledger's order; none of the empty ones
    assert rows[1:] == [["teardown", "45.0s", "3.5", "0.0s", "45.0s"], ["provisioning", "40.0s", "3.1", "40.0s", "0.0s"],
                        ["restore", "25.0s", "1.9", "0.0s", "25.0s"], ["productive", "17m00s", "78.9", "7m00s", "10m00s"],
                        ["lostWork", "2m30s", "11.6", "2m30s", "0.0s"], ["unaccounted", "12.0s", "0.9", "12.0s", "0.0s"]]
    assert "Goodput" not in manage.describe_text("TPUTorchJob", {**obj, "status": {"phase": "Running"}}, [], [])
