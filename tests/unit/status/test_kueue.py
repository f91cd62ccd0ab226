"""Kueue's Workload (statuses recorded from Kueue v0.17) -> the Admitted condition and the
Queued / Preempted phases, alone and through the job's derive."""

import pathlib

import pytest
import yaml

from tputorch import status
from tputorch.api import spec
from tputorch.status import kueue

from ..jobs import body

WORKLOADS = yaml.safe_load((pathlib.Path(__file__).parent / "data" / "kueue-workloads.yaml").read_text())
RAYJOB_UID = "rj-uid"
T0 = "2026-12-01T10:00:00Z"


def workload(stage, name="rayjob-demo-ab12c", uid=RAYJOB_UID, created="2026-12-01T10:00:00Z"):
    return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created,
                         "ownerReferences": [{"kind": "RayJob", "name": "demo", "uid": uid, "controller": True}]},
            "spec": {"active": True}, "status": WORKLOADS[stage]}


def admission(stage, **kw):
    return kueue.admission("tpu", "RayJob", "demo", workload(stage) if stage else None, **kw)


@pytest.mark.parametrize("stage,admitted,reason,phase", [
    ("pending", False, "Pending", "Queued"),
    ("admitted", True, "Admitted", None),
    ("finished", True, "Finished", None),
    ("being-preempted", False, "Preempted", "Preempted"),
    ("requeued-after-preemption", False, "Pending", "Queued"),
])
def test_each_recorded_stage(stage, admitted, reason, phase):
    a = admission(stage)
    assert (a.admitted, a.reason, a.phase) == (admitted, reason, phase)
    assert a.workload == "rayjob-demo-ab12c"


def test_queued_carries_kueues_own_message():
    a = admission("pending")
    assert "insufficient unused quota for google.com/tpu in flavor v6e-4x4, 16 more needed" in a.message
    assert admission("being-preempted").message.startswith("Preempted to accommodate a workload")
    assert admission("requeued-after-preemption").message.startswith("preempted earlier, queued again: couldn't")
    assert admission("admitted").message == "admitted by ClusterQueue tpu from LocalQueue tpu"
    assert admission("admitted").cluster_queue == "tpu"


def test_no_workload_yet_and_a_missing_priority_class():
    a = admission(None, priority_class="tpu-low", priority_class_exists=True)
    assert (a.reason, a.phase) == ("WaitingForKueue", "Queued")
    missing = admission(None, priority_class="gold", priority_class_exists=False)
    assert (missing.admitted, missing.reason, missing.phase) == (False, "WorkloadPriorityClassNotFound", "Queued")
    assert "WorkloadPriorityClass gold does not exist" in missing.message


def test_deactivated_by_the_users_suspend_leaves_the_phase_to_the_job():
    w = workload("admitted")
    w["status"] = {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "..."},
        {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": "The workload is deactivated"}]}
    a = kueue.admission("tpu", "RayJob", "demo", w)
    assert (a.admitted, a.reason, a.phase) == (False, "Deactivated", None)


def test_quota_reserved_waiting_for_admission_checks_names_them():
    w = workload("pending")
    w["status"] = {"admission": {"clusterQueue": "tpu"},
                   "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": ""}],
                   "admissionChecks": [{"name": "dws-prov", "state": "Pending", "message": "Waiting for capacity"}]}
    a = kueue.admission("tpu", "RayJob", "demo", w)
    assert (a.reason, a.phase) == ("AdmissionChecksPending", "Queued")
    assert "dws-prov: Pending (Waiting for capacity)" in a.message


def test_the_workload_is_the_one_this_child_owns_by_uid():
    mine = workload("admitted", name="rayjob-demo-new", created="2026-12-01T10:05:00Z")
    older = workload("pending", name="rayjob-demo-old", created="2026-12-01T10:00:00Z")
    other = workload("pending", name="rayjob-demo-prev", uid="earlier-rayjob")
    child = {"metadata": {"uid": RAYJOB_UID}}
    assert kueue.workload_for([other, older, mine], child)["metadata"]["name"] == "rayjob-demo-new"
    assert kueue.workload_for([other], child) is None
    assert kueue.owner_of(mine) == ("RayJob", "demo")


def test_an_elastic_jobs_scale_up_slice_waiting_for_quota_leaves_the_child_on_the_slice_it_replaces():
    """Kueue 0.19.1 (workloadslicing): a queued autoscaled service's scale-up is a new Workload
    naming the admitted one it replaces; until it is admitted the service runs on the old one, so
    it is Admitted (not Queued). Once admitted, Kueue finishes the old one: the new one counts."""
    old = workload("admitted", name="rayservice-llm-1", created="2026-12-01T10:00:00Z")
    grow = workload("pending", name="rayservice-llm-2", created="2026-12-01T10:05:00Z")
    grow["metadata"]["annotations"] = {kueue.SLICE_REPLACEMENT_ANNOTATION: "ml/rayservice-llm-1"}
    child = {"metadata": {"uid": RAYJOB_UID}}
    assert kueue.SLICE_REPLACEMENT_ANNOTATION == "kueue.x-k8s.io/workload-slice-replacement-for"
    assert kueue.workload_for([grow, old], child)["metadata"]["name"] == "rayservice-llm-1"
    assert kueue.admission("tpu", "RayService", "llm", kueue.workload_for([grow, old], child)).phase is None
    grown = {**grow, "status": WORKLOADS["admitted"]}
    replaced = {**old, "status": WORKLOADS["finished"]}
    assert kueue.workload_for([grown, replaced], child)["metadata"]["name"] == "rayservice-llm-2"
    # a pending Workload that replaces none (a first admission) is the one, Queued
    first = workload("pending", name="rayservice-llm-1", created="2026-12-01T10:00:00Z")
    assert kueue.admission("tpu", "RayService", "llm", kueue.workload_for([first], child)).phase == "Queued"


# --- through the job's derive ----------------------------------------------------------------------

JOB = spec.parse(body(queueName="tpu", priorityClassName="tpu-low"))
SUSPENDED_RJ = {"metadata": {"name": "demo"}, "spec": {"suspend": True},
                "status": {"jobDeploymentStatus": "Suspended"}}
RUNNING_RJ = {"metadata": {"name": "demo"}, "status": {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}}
DONE_RJ = {"metadata": {"name": "demo"}, "status": {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}}


def derive(rj, stage, job=JOB, previous=None):
    return status.derive(job, 1, rj, [], previous or {}, T0, queue=admission(stage))


def cond(st, ctype):
    return next((c for c in st["conditions"] if c["type"] == ctype), None)


def test_a_queued_job_is_queued_not_suspended_and_says_why():
    st = derive(SUSPENDED_RJ, "pending")
    assert st["phase"] == "Queued"
    assert st["message"].startswith("queued in LocalQueue tpu: couldn't assign flavors")
    assert (cond(st, "Admitted")["status"], cond(st, "Admitted")["reason"]) == ("False", "Pending")
    assert (st["queue"], st["priorityClass"], st["workload"]) == ("tpu", "tpu-low", "rayjob-demo-ab12c")
    assert "clusterQueue" not in st


def test_admitted_then_kuberays_phase_holds():
    assert derive(SUSPENDED_RJ, "admitted")["phase"] == "Pending"  # Kueue unsuspended it; KubeRay not yet
    st = derive(RUNNING_RJ, "admitted")
    assert st["phase"] == "Running" and st["clusterQueue"] == "tpu"
    assert derive(DONE_RJ, "finished")["phase"] == "Succeeded"


def test_preempted_then_queued_again_each_an_event():
    running = derive(RUNNING_RJ, "admitted")
    preempted = derive(SUSPENDED_RJ, "being-preempted", previous=running)
    assert preempted["phase"] == "Preempted"
    assert preempted["message"].startswith("preempted by Kueue: Preempted to accommodate")
    ev = status.events(running, preempted)
    assert [(e.type, e.reason) for e in ev] == [("Warning", "Preempted")]
    queued = derive(SUSPENDED_RJ, "requeued-after-preemption", previous=preempted)
    assert queued["phase"] == "Queued"
    assert [e.reason for e in status.events(preempted, queued)] == ["Queued"]
    again = derive(RUNNING_RJ, "admitted", previous=queued)
    assert {e.reason for e in status.events(queued, again)} >= {"Admitted", "Running"}


def test_a_users_suspend_shows_suspended_even_while_queued():
    job = spec.parse(body(queueName="tpu", suspend=True))
    assert derive(SUSPENDED_RJ, "pending", job=job)["phase"] == "Suspended"


def test_no_queue_no_admitted_condition():
    st = status.derive(spec.parse(body()), 1, RUNNING_RJ, [], {}, T0)
    assert cond(st, "Admitted") is None and "queue" not in st


def test_queue_validation():
    with pytest.raises(spec.InvalidSpec, match="spec.priorityClassName.*without spec.queueName"):
        spec.parse(body(priorityClassName="tpu-high"))
    with pytest.raises(spec.InvalidSpec, match="spec.shutdownAfterJobFinishes.*must be true when spec.queueName"):
        spec.parse(body(queueName="tpu", shutdownAfterJobFinishes=False))
    with pytest.raises(spec.InvalidSpec, match="spec.priorityClassName.*label value"):
        spec.parse(body(queueName="tpu", priorityClassName="not a label!"))
