"""Observed RayJob (+ its pods) -> TPUTorchJob status: its phase, its conditions, and its attempts.

Every phase a TPUTorchJob can be in is listed here (PHASES); the CRD's enum is built from it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .. import render
from ..api.spec import JobSpec
from ..train import TRAIN_GROUP
from . import attempts as tries
from . import network as net
from . import progress as training
from .conditions import (
    FAILED, QUEUE_PHASES, RAYJOB_CREATED, SLICE_READY, SUCCEEDED, TERMINAL_PHASES,
    condition, queue_fields, queue_message, queue_phase, ready_hosts, scheduling_problem, stamp,
    container_problem, quota_problem, no_node_pool, tpu_webhook_missing, GROUP_LABEL,
)
from .kueue import Admission
from .leading import leading_conditions

# Retrying: an attempt ended for a reason another attempt may cure; the next one is on its way.
PHASES = ("Pending", *QUEUE_PHASES, "Running", "Retrying", "Succeeded", "Failed", "Suspended")
ATTEMPT_LABEL = "tputorch.io/attempt"  # on the RayJob: which attempt it runs (1 when absent)
MAX_HISTORY = 20  # attempt records kept in the status: the first one and the latest ones


def attempt_of_child(rayjob: Mapping) -> int:
    value = ((rayjob.get("metadata") or {}).get("labels") or {}).get(ATTEMPT_LABEL)
    return int(value) if isinstance(value, str) and value.isdigit() else 1


def attempt(status: Mapping) -> int:
    """The attempt a job's status says is current (1 before any ended)."""
    value = status.get("attempts")
    return value if isinstance(value, int) and value > 0 else 1


def child_must_go(status: Mapping, rayjob: Mapping) -> bool:
    """The RayJob belongs to an attempt that has ended: a new attempt needs a fresh Ray cluster on a
    whole slice, and a job out of retries must free its slice."""
    if attempt_of_child(rayjob) < attempt(status):
        return True
    deployment = (rayjob.get("status") or {}).get("jobDeploymentStatus")
    return status.get("phase") == "Failed" and bool(status.get("attemptHistory")) and \
        deployment not in ("Complete", "Failed", "ValidationFailed", None)


def _record(number: int, ending: tries.Ending, now: str) -> dict:
    return {"attempt": number, "result": ending.result, "reason": ending.reason,
            "message": ending.message[:1024], "endTime": now}


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



KUBERAY_GROUP_LABEL = GROUP_LABEL


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
    deleted: Iterable[dict] = (),
    pods_problem: tuple[str, str] | None = None,
    network: net.NetworkPolicyState | None = None,
    desired_hash: str | None = None,  # noqa: ARG001  (a live RayJob takes no edit but suspend: nothing to compare)
) -> dict:
    """The whole status of a valid TPUTorchJob from what is observed now.

    ``problem`` is (reason, message) when the RayJob could not be created (e.g. KubeRay's
    CRDs are missing); ``pods`` are the pods of the RayJob's cluster (metadata.name, labels,
    deletionTimestamp, status.phase/reason/conditions as the API returns them), ``deleted`` those of
    its pods seen deleted while it ran; ``queue`` is where Kueue has the RayJob (spec.queueName set
    and the RayJob exists); ``pods_problem`` is (reason, message) while the operator may not read
    the namespace's pods; ``network`` its NetworkPolicy (None: the operator makes none).

    ``rayjob`` is the current attempt's when its attempt label says so; one of an ended attempt
    is going (the reconcile deletes it) and shows the job Retrying.
    """
    number = attempt(previous)
    history = [dict(a) for a in previous.get("attemptHistory") or [] if isinstance(a, Mapping)]
    if rayjob is not None and attempt_of_child(rayjob) != number:
        rayjob = None  # an ended attempt's RayJob: nothing of it describes this attempt
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
    ending = None
    settled = any(a.get("attempt") == number for a in history)  # this attempt's end is recorded
    # Pods go when a job is suspended (by its user or by Kueue's preemption): that ends no attempt.
    suspended = job.suspend or bool(((rayjob or {}).get("spec") or {}).get("suspend")) or phase in QUEUE_PHASES
    watching = rayjob is not None and not suspended and deployment in ("", "Initializing", "Running", "Complete", "Failed")
    if watching and not settled and previous.get("phase") not in TERMINAL_PHASES:
        ending = tries.classify(rj_status, pods, deleted)
    cause = net.dashboard_cause(network) if ending is not None and ending.reason == net.GRACE_PERIOD_EXCEEDED else None
    if cause:  # another attempt behind the same NetworkPolicy would end the same way
        ending = tries.Ending(tries.FINAL, net.DASHBOARD_UNREACHABLE, f"{cause}; KubeRay: {ending.message}")
    retry_note = ""
    if ending is not None and ending.result != tries.SUCCEEDED:
        history.append(_record(number, ending, now))
        left = tries.retries_left(ending.result, history[:-1], job.retries)
        if left > 0:
            number += 1
            phase = "Retrying"
            retry_note = (f"attempt {number - 1} ended: {ending.message} ({ending.result.lower()} failure); "
                          f"starting attempt {number} ({left - 1} {ending.result.lower()} retries left after it)")
        else:
            phase = "Failed"
    elif ending is not None:
        history.append(_record(number, ending, now))
        phase = "Succeeded"
    elif settled and previous.get("phase") in TERMINAL_PHASES:
        phase = previous["phase"]  # decided before; what KubeRay does with the RayJob now changes nothing
    elif number > 1 and phase == "Pending":
        phase = "Retrying"  # the previous attempt's RayJob is going or the new one is starting
    ready = ready_hosts(_training_slice(job, pods), cluster_status)
    if job.groups:  # KubeRay's fallback count (pods gone) includes the groups' pods
        ready = min(ready, s.hosts)
    kuberay_message = rj_status.get("message") or rj_status.get("reason") or ""
    no_webhook = tpu_webhook_missing(_training_slice(job, pods), s.hosts)
    if no_webhook and phase == "Running":
        phase = "Pending"  # Ray may run the script, but a slice whose hosts cannot find each other never trains

    conditions = leading_conditions(shape, RAYJOB_CREATED, "RayJob", job.name, rayjob, problem, True, queue, network,
                                    generation)

    unschedulable = scheduling_problem(pods)
    blocked = quota_problem(cluster_status) or container_problem(pods) or \
        no_node_pool(_training_slice(job, pods), render.worker_node_selector(job))
    if phase in TERMINAL_PHASES:
        slice_ready = condition(SLICE_READY, False, "JobFinished", "the job has finished", generation)
    elif phase == "Suspended":
        slice_ready = condition(SLICE_READY, False, "Suspended", "the job is suspended", generation)
    elif phase in QUEUE_PHASES:
        slice_ready = condition(SLICE_READY, False, "WaitingForKueue", f"{phase.lower()} by Kueue: the job holds no slice", generation)
    elif pods_problem:  # the operator may not read the pods: what they would say is unknown
        slice_ready = condition(SLICE_READY, None, pods_problem[0], pods_problem[1], generation)
    elif no_webhook:
        slice_ready = condition(SLICE_READY, False, no_webhook[0], no_webhook[1], generation)
    elif rayjob is not None and ready >= s.hosts:
        slice_ready = condition(SLICE_READY, True, "AllHostsReady", f"{ready}/{s.hosts} TPU hosts ready", generation)
    elif blocked:
        slice_ready = condition(SLICE_READY, False, blocked[0], blocked[1], generation)
    elif unschedulable:
        slice_ready = condition(SLICE_READY, False, "Unschedulable", unschedulable, generation)
    else:
        slice_ready = condition(SLICE_READY, False, "WaitingForHosts", f"{ready}/{s.hosts} TPU hosts ready", generation)
    conditions.append(slice_ready)

    if phase == "Succeeded":
        conditions.append(condition(SUCCEEDED, True, "JobSucceeded", kuberay_message or "the Ray job succeeded", generation))
    if phase == "Failed":
        last = history[-1] if history else None
        if last is not None and last.get("attempt") == number:
            budget = job.retries.get(str(last["result"]).lower())
            why = last["message"] + (f" ({last['result'].lower()} failure after {budget} retries of that kind)"
                                     if budget is not None and budget > 0 else "")
            conditions.append(condition(FAILED, True, last["reason"], why, generation))
        else:
            reason = rj_status.get("reason") or "JobFailed"
            conditions.append(condition(FAILED, True, reason, kuberay_message or f"the Ray job ended {job_status or 'in failure'}", generation))

    if phase == "Retrying":
        if retry_note:
            message = retry_note
        elif previous.get("phase") == "Retrying" and previous.get("message"):
            message = previous["message"]
        else:
            message = f"attempt {number}: {slice_ready['message']}"
    elif phase == "Running":
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
        "attempts": number,
    }
    status.update(training.carried(previous))  # the controller puts a newer read in (progress.apply)
    if history:
        status["attemptHistory"] = history if len(history) <= MAX_HISTORY else history[:1] + history[-(MAX_HISTORY - 1):]
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

