"""The goodput ledger (status/goodput.py) from recorded statuses: a sequence of what the operator
observed at each reconcile (the RayJob, Kueue's admission, the pods' conditions, the progress read),
each with its timestamps; the figures are worked out by hand from those timestamps."""

from __future__ import annotations

import datetime

import pytest

from tputorch import train
from tputorch.status import goodput, progress
from tputorch.status.kueue import Admission

CREATED = "2026-12-07T10:00:00Z"


def at(hms: str) -> str:
    return f"2026-12-07T{hms}Z"


def unix(hms: str) -> float:
    return datetime.datetime.fromisoformat(at(hms)).timestamp()


def rayjob(number: int, created: str) -> dict:
    return {"metadata": {"name": "j", "creationTimestamp": created, "labels": {"tputorch.io/attempt": str(number)}},
            "status": {}}


def pod(name: str, scheduled: str, ready: str | None) -> dict:
    conds = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)}]
    if ready:
        conds.append({"type": "Ready", "status": "True", "lastTransitionTime": at(ready)})
    return {"metadata": {"name": name}, "status": {"conditions": conds}}


def timing(number, first, last, steps, saves=0.0, restore=0.0, per_step=None, ckpt_step=None) -> dict:
    out = {"attempt": number, "firstReportTime": unix(first), "time": unix(last), "stepSeconds": steps,
           "checkpointSaveSeconds": saves, "restoreSeconds": restore}
    if per_step is not None:
        out["secondsPerStep"] = per_step
    if ckpt_step is not None:
        out["checkpointStep"] = ckpt_step
    return out


def status(number=1, ready=0, history=(), step=None, timed=None) -> dict:
    out = {"phase": "Running", "hosts": 2, "readyHosts": ready, "attempts": number}
    if history:
        out["attemptHistory"] = list(history)
    if timed is not None:
        out["progress"] = {"step": step, "metrics": {}, "timing": timed}
    return out


def replay(observed) -> dict:
    """Each reconcile's (status derived, RayJob, pods, Kueue's answer) in turn, each from the last."""
    previous: dict = {}
    for current, child, pods, queue in observed:
        previous = goodput.apply(current, previous, CREATED, child, pods, queue)
    return previous["goodput"]


def ms(seconds: dict) -> dict:
    return {k: int(round(v * 1000)) for k, v in seconds.items()}


PODS = [pod("j-head", "10:05:30", "10:06:40"), pod("j-w0", "10:05:35", "10:06:55"), pod("j-w1", "10:05:40", "10:07:00")]
QUEUED = Admission(False, "Pending", "waiting", "Queued")
ADMITTED = Admission(True, "Admitted", "admitted", None, "cq", "wl", at("10:05:00"))


def queued_run(end_result="Succeeded", end="10:19:00", report_until="10:19:00", **kw) -> list:
    """Attempt 1 of a queued job: created at 10:00:00, its RayJob at 10:00:01, admitted at 10:05:00,
    its 3 pods scheduled by 10:05:40 and Ready by 10:07:00, a restore of 20 s, its first report at
    10:09:00, then reports until ``report_until``; ended at ``end``."""
    child = rayjob(1, at("10:00:01"))
    span = unix(report_until) - unix("10:09:00")
    timed = timing(1, "10:09:00", report_until, span - 30.0, saves=30.0, restore=20.0, **kw)
    return [
        (status(), child, [], QUEUED),
        (status(), child, [], ADMITTED),
        (status(ready=1), child, PODS[:2], ADMITTED),  # not every host up yet: no moment taken
        (status(ready=2), child, PODS, ADMITTED),
        (status(ready=2, step=600, timed=timed), child, PODS, ADMITTED),
        (status(ready=2, step=600, timed=timed, history=[{"attempt": 1, "result": end_result, "endTime": at(end)}]),
         child, PODS, ADMITTED),
    ]


def test_a_queued_attempt_is_split_by_the_moments_observed_and_nothing_is_unaccounted():
    book = replay(queued_run())
    assert ms(book["seconds"]) == {
        "teardown": 1000,  # job created 10:00:00, its RayJob 10:00:01
        "queued": 299_000,  # -> admitted 10:05:00
        "provisioning": 40_000,  # -> the last pod scheduled 10:05:40
        "start": 80_000,  # -> the last pod Ready 10:07:00
        "restore": 20_000, "firstStep": 100_000,  # -> the first report 10:09:00, 20 s of it the restore
        "productive": 570_000, "checkpointSave": 30_000,  # -> the last report 10:19:00
        "lostWork": 0, "hang": 0, "unaccounted": 0,
    }
    assert book["wallClockSeconds"] == 1140.0
    assert book["productiveFraction"] == pytest.approx(570 / 1140, abs=1e-4)
    assert [a["attempt"] for a in book["attempts"]] == [1] and book["attempts"][0]["result"] == "Succeeded"
    assert book["asOf"] == "2026-12-07T10:19:00.000Z"


def test_the_parts_sum_to_the_wall_clock_exactly_and_a_missing_moment_is_unaccounted():
    # the pods were never seen (the operator may not read them: PodsForbidden)
    book = replay([(current, child, [], queue) for current, child, _, queue in queued_run()])
    parts = ms(book["seconds"])
    assert sum(parts.values()) == int(book["wallClockSeconds"] * 1000) == 1_140_000
    # Kueue's admission time is read later as well (10:05:00); the pods' moments are lost: from the
    # admission to the first report (10:09:00) nothing says what the slice did
    assert parts["queued"] == 299_000 and parts["unaccounted"] == 240_000
    assert parts["provisioning"] == parts["start"] == parts["firstStep"] == parts["restore"] == 0
    assert parts["productive"] == 570_000


def test_a_failed_attempt_loses_the_steps_after_its_checkpoint_and_the_next_one_restores():
    # attempt 1 reached step 500, last checkpointed at 400, 1.5 s a step: 150 s lost; it ended 12 s
    # after the last report read: the work in flight when it failed, lost too
    first = queued_run("Infrastructure", end="10:19:12", per_step=1.5, ckpt_step=400)
    first = [(dict(s, **({"progress": {**s["progress"], "step": 500}} if "progress" in s else {})), c, p, q)
             for s, c, p, q in first]
    first[-1][0]["attempts"] = 2  # the reconcile that ends attempt 1 starts attempt 2 (status/job.py)
    ended = {"attempt": 1, "result": "Infrastructure", "endTime": at("10:19:12")}
    child = rayjob(2, at("10:19:57"))  # 45 s for attempt 1's pods to go
    pods = [pod("k-head", "10:20:00", "10:20:30"), pod("k-w0", "10:20:05", "10:20:40"), pod("k-w1", "10:20:05", "10:20:41")]
    timed = timing(2, "10:23:00", "10:33:00", 600.0, restore=25.0)
    second = [
        (status(2, history=[ended], step=500, timed=first[-1][0]["progress"]["timing"]), None, [], None),
        (status(2, history=[ended], step=500), child, [], None),
        (status(2, ready=2, history=[ended]), child, pods, None),
        (status(2, ready=2, history=[ended], step=900, timed=timed), child, pods, None),
    ]
    book = replay(first + second)
    one, two = (ms(a["seconds"]) for a in book["attempts"])
    assert one["lostWork"] == 150_000 + 12_000 and one["productive"] == 570_000 - 150_000
    assert one["unaccounted"] == 0 and sum(one.values()) == 1_152_000
    assert two == {"teardown": 45_000, "queued": 0, "provisioning": 8_000, "start": 36_000, "restore": 25_000,
                   "firstStep": 114_000, "productive": 600_000, "checkpointSave": 0, "lostWork": 0, "hang": 0,
                   "unaccounted": 0}
    assert book["attempts"][1]["startTime"] == at("10:19:12") and "result" not in book["attempts"][1]
    total = ms(book["seconds"])
    assert total == {p: one[p] + two[p] for p in goodput.PARTS}
    assert book["wallClockSeconds"] == 1152.0 + 828.0  # 10:00:00 -> 10:33:00
    assert book["productiveFraction"] == pytest.approx((420 + 600) / 1980, abs=1e-4)


@pytest.mark.parametrize("result,part", [("Succeeded", "teardown"), ("Application", "lostWork"), ("Final", "lostWork"),
                                         (goodput.HANG, "hang")])
def test_an_ended_attempts_tail_after_its_last_report_is_the_part_its_end_names(result, part):
    # 10:19:00 the last report read, 10:19:20 the end: both observed, so never unaccounted
    parts = ms(replay(queued_run(result, end="10:19:20", report_until="10:19:00", per_step=1.0, ckpt_step=570))["seconds"])
    assert parts[part] >= 20_000 and parts["unaccounted"] == 0, parts


def test_a_failed_attempt_without_a_checkpoint_of_its_own_loses_every_step():
    book = replay(queued_run("Application"))
    parts = ms(book["seconds"])
    assert parts["productive"] == 0 and parts["lostWork"] == 570_000


def test_an_attempt_ended_as_a_hang_spends_its_tail_hanging():
    book = replay(queued_run(goodput.HANG, end="10:25:00", report_until="10:19:00", per_step=1.0, ckpt_step=600))
    parts = ms(book["seconds"])
    assert parts["hang"] == 360_000 and parts["unaccounted"] == 0 and parts["lostWork"] == 0


def test_clocks_that_disagree_make_no_negative_part():
    child = rayjob(1, at("10:00:01"))
    pods = [pod("j-head", "10:00:10", "10:00:30"), pod("j-w0", "10:00:10", "10:02:00"), pod("j-w1", "10:00:10", "10:00:40")]
    timed = timing(1, "10:01:50", "10:05:00", 190.0)  # the script's host is 10 s behind the API server
    book = replay([(status(ready=2, step=10, timed=timed), child, pods, None)])
    parts = ms(book["seconds"])
    assert min(parts.values()) >= 0 and sum(parts.values()) == 300_000
    # the first report (10:01:50 by the script's clock) is taken at Ray up (10:02:00); the script's
    # 190 s of steps fit in the 180 s to its last report
    assert parts["firstStep"] == 0 and parts["productive"] == 180_000 and parts["unaccounted"] == 0
    assert parts["start"] == 110_000


def test_the_attempts_kept_are_bounded_and_the_job_sums_every_attempt():
    previous = goodput.apply(status(1), {}, CREATED, rayjob(1, CREATED), [], None)
    for n in range(1, 31):
        end = f"{10 + n // 60:02d}:{n % 60:02d}:00"
        history = [{"attempt": n, "result": "Infrastructure", "endTime": at(end)}]
        previous = goodput.apply(status(n + 1, history=history), previous, CREATED, rayjob(n, at(end)), [], None)
    book = previous["goodput"]
    assert len(book["attempts"]) == goodput.MAX_HISTORY
    assert book["attempts"][0]["attempt"] == 1 and book["attempts"][-1]["attempt"] == 31
    assert book["ended"]["wallClockSeconds"] == book["wallClockSeconds"] == 30 * 60.0


def test_a_status_without_news_is_the_same_status():
    observed = queued_run()[:5]
    book = replay(observed)
    again = goodput.apply(observed[-1][0], {"goodput": book}, CREATED, *observed[-1][1:])["goodput"]
    assert again == book


# --- the script's clock --------------------------------------------------------------------------


def test_the_step_clock_counts_every_second_from_the_first_report_as_steps_or_saves():
    clock = train.StepClock()
    clock.reported(100.0, 100.5, step=10, saved=False)  # the first report: the first step's end
    clock.reported(110.5, 111.0, step=20, saved=False)  # 10 s for 10 steps
    clock.reported(121.0, 129.0, step=30, saved=True)  # 8 s persisting a checkpoint
    t = clock.timing(attempt_number=2)
    assert t["compute_s"] + t["checkpoint_s"] == pytest.approx(129.0 - 100.0)
    assert (t["checkpoint_s"], t["step_s"], t["checkpoint_step"], t["attempt"]) == (8.0, 1.0, 30, 2)
    assert train.StepClock().timing(1) == {}


def test_a_progress_line_with_timing_reads_into_the_status_and_an_older_line_still_reads():
    clock = train.StepClock(restore_s=4.0)
    clock.reported(100.0, 101.0, step=5, saved=True)
    line = train.progress_line({"loss": 0.5}, step=5, timing=clock.timing(3))
    report = progress.parse_line(line)
    assert report.progress()["timing"] == {"attempt": 3, "time": 101.0, "firstReportTime": 100.0, "stepSeconds": 0.0,
                                           "checkpointSaveSeconds": 1.0, "restoreSeconds": 4.0, "checkpointStep": 5}
    old = train.PROGRESS_MARKER + '{"step":5,"epoch":null,"metrics":{"loss":0.5}}'
    assert progress.parse_line(old) == progress.Report(5, None, (("loss", 0.5),), None)
    assert "timing" not in progress.parse_line(old).progress()


@pytest.mark.parametrize("bad", ['{"attempt":1}', '{"attempt":1,"at":-1,"first":0,"compute_s":0,"checkpoint_s":0,'
                                 '"restore_s":0}', '{"attempt":"1","at":1,"first":0,"compute_s":0,"checkpoint_s":0,'
                                 '"restore_s":0}', '{"attempt":1,"at":1,"first":0,"compute_s":0,"checkpoint_s":0,'
                                 '"restore_s":0,"extra":1}', '[1]'])
def test_a_malformed_timing_makes_the_line_no_report(bad):
    assert progress.parse_line(train.PROGRESS_MARKER + '{"step":5,"metrics":{},"timing":' + bad + '}') is None


def test_a_ledger_begun_mid_job_counts_the_earlier_attempts_unaccounted_and_the_current_one_from_its_start():
    """An operator upgrade: a job at attempt 3 gets its first status.goodput; nothing was kept of
    attempts 1 and 2 but their ends."""
    history = [{"attempt": 1, "result": "Infrastructure", "endTime": at("10:10:00")},
               {"attempt": 2, "result": "Application", "endTime": at("10:20:00")}]
    book = goodput.apply(status(3, history=history), {}, CREATED, rayjob(3, at("10:20:30")), [], None)["goodput"]
    parts = ms(book["seconds"])
    assert parts["unaccounted"] == 1_200_000 and parts["teardown"] == 30_000
    assert sum(parts.values()) == int(book["wallClockSeconds"] * 1000) == 1_230_000
    assert [a["attempt"] for a in book["attempts"]] == [3] and book["attempts"][0]["startTime"] == at("10:20:00")


def test_a_hang_before_the_first_report_hangs_from_when_the_sentinel_says():
    """No report ever came (a compile that never ended): the sentinel's hungSince (the slice's
    readiness) starts the hang; Ray up to it is unobserved."""
    observed = queued_run()[:4]
    ended = {"attempt": 1, "result": goodput.HANG, "endTime": at("10:30:00"), "hungSince": at("10:08:00")}
    observed.append((status(ready=2, history=[ended]), observed[-1][1], PODS, ADMITTED))
    parts = ms(replay(observed)["seconds"])
    assert parts["hang"] == 22 * 60_000 and parts["unaccounted"] == 60_000  # 10:07:00 (Ray up) -> 10:08:00
    assert parts["productive"] == parts["lostWork"] == parts["firstStep"] == 0
    assert sum(parts.values()) == 30 * 60_000


def test_the_report_of_an_attempt_just_ended_is_never_the_next_ones():
    # the script's clock 30 s ahead: attempt 1's last report (10:19:30) is after its end (10:19:12)
    observed = queued_run("Infrastructure", end="10:19:12", report_until="10:19:30")
    observed[-1][0]["attempts"] = 2
    book = replay(observed)
    assert book["attempts"][-1] == {"attempt": 2, "startTime": at("10:19:12"), "wallClockSeconds": 0.0,
                                    "seconds": dict.fromkeys(goodput.PARTS, 0.0)}
    assert book["wallClockSeconds"] == 1152.0


def test_a_worker_process_restarted_within_the_attempt_leaves_the_first_ones_steps_unaccounted():
    """Ray Train restarts the workers (workerRetries) within the attempt: the new process's clock
    starts anew and counts only its own steps; the first step stays the first process's."""
    observed = queued_run()[:4]
    child = observed[-1][1]
    first = timing(1, "10:09:00", "10:12:00", 170.0, saves=10.0, restore=20.0)
    again = timing(1, "10:14:00", "10:19:00", 300.0, restore=5.0)
    observed += [(status(ready=2, step=300, timed=first), child, PODS, ADMITTED),
                 (status(ready=2, step=700, timed=again), child, PODS, ADMITTED)]
    parts = ms(replay(observed)["seconds"])
    assert (parts["restore"], parts["firstStep"]) == (20_000, 100_000)  # Ray up 10:07 -> 10:09, as first seen
    # 10:09 -> 10:19: only the second process's 300 s are known
    assert (parts["productive"], parts["checkpointSave"], parts["unaccounted"]) == (300_000, 0, 300_000)
    assert sum(parts.values()) == 1_140_000


@pytest.mark.parametrize("result", ["Succeeded", "Application", goodput.HANG])
def test_an_ended_jobs_ledger_is_the_same_at_every_later_reconcile(result):
    """A finished job's status is written once: reconciles after its end (a restart re-reads every
    job) derive the same ledger, its last attempt's figures included."""
    observed = queued_run(result)
    once = replay(observed)
    again = replay(observed + [observed[-1]] * 2)
    assert again == once and [a["attempt"] for a in once["attempts"]] == [1], once
