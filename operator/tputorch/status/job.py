"""Observed RayJob (+ its pods) -> TPUTorchJob status."""

from __future__ import annotations

from typing import Iterable

from ..api.spec import JobSpec
from ..train import TRAIN_GROUP
from .conditions import (
    FAILED, QUEUE_PHASES, RAYJOB_CREATED, SLICE_READY, SUCCEEDED, TERMINAL_PHASES, VALIDATED, admitted_condition,
    child_created, condition, queue_fields, queue_message, queue_phase, ready_hosts, scheduling_problem, stamp,
)
from .kueue import Admission

def _phase(deployment: str, job_status: str) -> str:
    if deployment == "Complete":
        return "Succeeded" if job_status == "SUCCEEDED" else "Failed"
    if deployment in ("Failed", "ValidationFailed"):
        return "Failed"
    if deployment in ("Suspended", "Suspending"):
        return "Suspended"
    if deployment == "Running":
        return "Running"
    return "Pending"



KUBERAY_GROUP_LABEL = "ray.io/group"  # KubeRay labels each pod with its worker group's name


def _training_slice(job: JobSpec, pods: list[dict]) -> list[dict]:
    """The pods whose readiness is the slice's: with spec.groups, only the training slice's."""
    if not job.groups:
        return pods
    return [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(KUBERAY_GROUP_LABEL) == TRAIN_GROUP]


def derive(
    job: JobSpec,
    generation: int,
    rayjob: dict | None,
    pods: Iterable[dict],
    previous: dict,
    now: str,
    problem: tuple[str, str] | None = None,
    queue: Admission | None = None,
) -> dict:
    """The whole status of a valid TPUTorchJob from what is observed now.

    ``problem`` is (reason, message) when the RayJob could not be created (e.g. KubeRay's
    CRDs are missing); ``pods`` are the job's pods (metadata.name, metadata.labels, status.conditions
    as the API returns them); ``queue`` is where Kueue has the RayJob (spec.queueName set and the
    RayJob exists).
    """
    s = job.slice
    shape = (
        f"{s.generation.name} {s.topology} slice: {s.hosts} host(s) x {s.chips_per_host} chips, "
        f"{job.workers} worker(s) x {job.chips_per_worker} chip(s)"
    )
    rj_status = (rayjob or {}).get("status") or {}
    cluster_status = rj_status.get("rayClusterStatus") or {}
    deployment = rj_status.get("jobDeploymentStatus") or ""
    job_status = rj_status.get("jobStatus") or ""
    phase = _phase(deployment, job_status) if rayjob is not None else "Pending"
    phase = queue_phase(phase, job.suspend, queue)
    pods = list(pods)
    ready = ready_hosts(_training_slice(job, pods), cluster_status)
    if job.groups:  # KubeRay's fallback count (pods gone) includes the groups' pods
        ready = min(ready, s.hosts)
    kuberay_message = rj_status.get("message") or rj_status.get("reason") or ""

    conditions = [condition(VALIDATED, True, "Valid", shape, generation),
                  child_created(RAYJOB_CREATED, "RayJob", job.name, rayjob, problem, generation)]
    if queue is not None:
        conditions.append(admitted_condition(queue, generation))

    unschedulable = scheduling_problem(pods)
    if phase in TERMINAL_PHASES:
        slice_ready = condition(SLICE_READY, False, "JobFinished", "the job has finished", generation)
    elif phase == "Suspended":
        slice_ready = condition(SLICE_READY, False, "Suspended", "the job is suspended", generation)
    elif phase in QUEUE_PHASES:
        slice_ready = condition(SLICE_READY, False, "WaitingForKueue", f"{phase.lower()} by Kueue: the job holds no slice", generation)
    elif rayjob is not None and ready >= s.hosts:
        slice_ready = condition(SLICE_READY, True, "AllHostsReady", f"{ready}/{s.hosts} TPU hosts ready", generation)
    elif unschedulable:
        slice_ready = condition(SLICE_READY, False, "Unschedulable", unschedulable, generation)
    else:
        slice_ready = condition(SLICE_READY, False, "WaitingForHosts", f"{ready}/{s.hosts} TPU hosts ready", generation)
    conditions.append(slice_ready)

    if phase == "Succeeded":
        conditions.append(condition(SUCCEEDED, True, "JobSucceeded", kuberay_message or "the Ray job succeeded", generation))
    if phase == "Failed":
        reason = rj_status.get("reason") or "JobFailed"
        conditions.append(condition(FAILED, True, reason, kuberay_message or f"the Ray job ended {job_status or 'in failure'}", generation))

    if phase == "Running":
        message = f"{job.workers} worker(s) on a {shape.split(':')[0]}, {ready}/{s.hosts} hosts ready"
    elif phase in TERMINAL_PHASES:
        message = conditions[-1]["message"]
    elif phase == "Suspended":
        message = "suspended: the RayJob holds no slice"
    elif phase in QUEUE_PHASES:
        message = queue_message(job, queue)
    elif rayjob is None:
        message = conditions[1]["message"]
    else:
        message = slice_ready["message"]

    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": generation,
        "conditions": stamp(conditions, previous, now),
        "workers": job.workers,
        "hosts": s.hosts,
        "readyHosts": ready,
        "hostsReady": f"{ready}/{s.hosts}",
        "rayJobName": job.name,
        **queue_fields(job, queue),
    }
    optional = {
        "rayClusterName": rj_status.get("rayClusterName"),
        "dashboardURL": rj_status.get("dashboardURL"),
        "jobId": rj_status.get("jobId"),
        "jobStatus": job_status or None,
        "jobDeploymentStatus": deployment or None,
        "startTime": rj_status.get("startTime"),
        "completionTime": (rj_status.get("endTime") or previous.get("completionTime") or now) if phase in TERMINAL_PHASES else None,
    }
    status.update({k: v for k, v in optional.items() if v})
    return status

