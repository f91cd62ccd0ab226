"""Observed RayJob (+ its pods) -> TPUTorchJob status: its phase, its conditions, and its attempts.

Every phase a TPUTorchJob can be in is listed in api/phases.py (JOB_PHASES), with the CRD's enum.
Retrying: an attempt ended for a reason another attempt may cure; the next one is on its way.

The derivation runs in stages, each reading only what the ones before it produced, so that a
wrong status leads to one place: what is observed (observe_job: the RayJob's state, the training
slice's hosts and why they wait), then the attempt decision (decide_attempt: has the current
attempt ended, and does another start, within the retries of its kind), then the phase
(job_phase), then the conditions (SliceReady, then Succeeded or Failed), then the message
(job_message). The conditions every object starts with are status/leading.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from ..render.cluster import worker_node_selector
from ..api.groups import NOSET_VISIBLE_CHIPS
from ..api.status_schema import MAX_HISTORY
from ..api.phases import CHIP_ISOLATION, FAILED, QUEUE_PHASES, RAYJOB_CREATED, SLICE_READY, SUCCEEDED, TERMINAL_PHASES
from ..api.spec import JobSpec
from ..train import TRAIN_GROUP
from . import attempts as tries
from . import hang as sentinel
from . import network as net
from . import progress as training, storage_access
from .conditions import condition, queue_fields, queue_message, queue_phase, stamp
from .kueue import Admission
from .leading import leading_conditions
from .pods import GROUP_LABEL, container_problem, no_node_pool, quota_problem, ready_hosts, scheduling_problem, tpu_webhook_missing

ATTEMPT_LABEL = "tputorch.io/attempt"  # on the RayJob: which attempt it runs (1 when absent)


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
    record = {"attempt": number, "result": ending.result, "reason": ending.reason,
              "message": ending.message[:1024], "endTime": now}
    if ending.hung_since:  # a hang: from then to endTime the slice did no training
        record["hungSince"] = ending.hung_since
    return record


def rayjob_phase(deployment: str, job_status: str) -> str:
    """The phase a RayJob's jobDeploymentStatus and jobStatus say."""
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


# --- what is observed -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobObserved:
    """What the current attempt's RayJob and its pods say now, before any judgement of them."""

    rj_status: dict  # the RayJob's status ({} without a RayJob of this attempt)
    deployment: str  # its jobDeploymentStatus ("" before KubeRay writes one)
    job_status: str  # its jobStatus: the Ray job's own
    kuberay_message: str  # its message, else its reason
    pods: list[dict]  # the pods of its Ray cluster
    ready: int  # the training slice's TPU hosts Ready
    no_webhook: tuple[str, str] | None  # why the slice's hosts cannot find each other, when they cannot
    blocked: tuple[str, str] | None  # why they cannot start: a quota, a container, no node pool
    unschedulable: str | None


def observe_job(job: JobSpec, rayjob: dict | None, pods: Iterable[dict]) -> JobObserved:
    """The RayJob's state and the training slice's hosts: how many are Ready and why they wait."""
    s = job.slice
    rj_status = (rayjob or {}).get("status") or {}
    cluster_status = rj_status.get("rayClusterStatus") or {}
    pods = list(pods)
    training = _training_slice(job, pods)
    ready = ready_hosts(training, cluster_status)
    if job.groups:  # KubeRay's fallback count (pods gone) includes the groups' pods
        ready = min(ready, s.hosts)
    return JobObserved(
        rj_status=rj_status, deployment=rj_status.get("jobDeploymentStatus") or "",
        job_status=rj_status.get("jobStatus") or "",
        kuberay_message=rj_status.get("message") or rj_status.get("reason") or "",
        pods=pods, ready=ready, no_webhook=tpu_webhook_missing(training, s.hosts),
        blocked=quota_problem(cluster_status) or container_problem(pods) or
        no_node_pool(training, worker_node_selector(job)),
        unschedulable=scheduling_problem(pods),
    )


# --- the attempt decision -------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptDecision:
    """Which attempt is current, the attempts ended so far, and the phase that follows from them."""

    number: int  # the current attempt: one more than before when this reconcile ended one and another starts
    history: list[dict]  # the ended attempts' records, an attempt that just ended included
    phase: str
    retry_note: str  # when an attempt just ended and the next starts: how it ended and what is left ("" otherwise)


def _ending(seen: JobObserved, deleted: Iterable[dict], network: net.NetworkPolicyState | None) -> tries.Ending | None:
    """How the current attempt ended (None: it has not), with the NetworkPolicy blamed when it is
    the likely cause: another attempt behind the same policy would end the same way."""
    ending = tries.classify(seen.rj_status, seen.pods, deleted)
    cause = net.dashboard_cause(network) if ending is not None and ending.reason == net.GRACE_PERIOD_EXCEEDED else None
    if cause:
        ending = tries.Ending(tries.FINAL, net.DASHBOARD_UNREACHABLE, f"{cause}; KubeRay: {ending.message}")
    return ending


def decide_attempt(job: JobSpec, previous: dict, number: int, rayjob: dict | None, seen: JobObserved, phase: str,
                   deleted: Iterable[dict], network: net.NetworkPolicyState | None, now: str,
                   hang: sentinel.Seen | None = None) -> AttemptDecision:
    """Whether attempt ``number`` has just ended, and what follows: the next attempt while retries
    of that kind of failure are left (Retrying), else Failed, or Succeeded. ``phase`` is what the
    RayJob and Kueue say; ``hang`` what the reads of its driver log saw (status/hang.py), for a
    job with spec.hangDetection. An end recorded before stays decided, whatever KubeRay does with
    the RayJob now."""
    history = [dict(a) for a in previous.get("attemptHistory") or [] if isinstance(a, Mapping)]
    settled = any(a.get("attempt") == number for a in history)  # this attempt's end is recorded
    # Pods go when a job is suspended (by its user or by Kueue's preemption): that ends no attempt.
    suspended = job.suspend or bool(((rayjob or {}).get("spec") or {}).get("suspend")) or phase in QUEUE_PHASES
    watching = rayjob is not None and not suspended and \
        seen.deployment in ("", "Initializing", "Running", "Complete", "Failed")
    ending = None
    if watching and not settled and previous.get("phase") not in TERMINAL_PHASES:
        ending = _ending(seen, deleted, network)
        if ending is None and job.hang_detection is not None and seen.deployment == "Running":
            ending = sentinel.ending(job.hang_detection, previous, hang, now)
    if ending is None:
        if settled and previous.get("phase") in TERMINAL_PHASES:
            phase = previous["phase"]  # decided before; what KubeRay does with the RayJob now changes nothing
        elif number > 1 and phase == "Pending":
            phase = "Retrying"  # the previous attempt's RayJob is going or the new one is starting
        return AttemptDecision(number, history, phase, "")
    history.append(_record(number, ending, now))
    if ending.result == tries.SUCCEEDED:
        return AttemptDecision(number, history, "Succeeded", "")
    left = tries.retries_left(ending.result, history[:-1], job.retries)
    if left <= 0:
        return AttemptDecision(number, history, "Failed", "")
    kind = ending.result.lower()
    return AttemptDecision(number + 1, history, "Retrying",
                           f"attempt {number} ended: {ending.message} ({kind} failure); "
                           f"starting attempt {number + 1} ({left - 1} {kind} retries left after it)")


# --- the phase and the conditions -----------------------------------------------------------------


def job_phase(decided: AttemptDecision, seen: JobObserved) -> str:
    """The attempt decision's phase, but Pending while the slice's hosts cannot find each other:
    Ray may run the script, but such a slice never trains."""
    if seen.no_webhook and decided.phase == "Running":
        return "Pending"
    return decided.phase


def slice_ready_condition(job: JobSpec, seen: JobObserved, phase: str, has_rayjob: bool,
                          pods_problem: tuple[str, str] | None, generation: int) -> dict:
    """SliceReady: whether the training slice's hosts are all Ready, and otherwise why not (the
    job holds no slice, the pods cannot be read, or what the hosts wait for)."""
    s = job.slice
    if phase in TERMINAL_PHASES:
        return condition(SLICE_READY, False, "JobFinished", "the job has finished", generation)
    if phase == "Suspended":
        return condition(SLICE_READY, False, "Suspended", "the job is suspended", generation)
    if phase in QUEUE_PHASES:
        return condition(SLICE_READY, False, "WaitingForKueue", f"{phase.lower()} by Kueue: the job holds no slice", generation)
    if pods_problem:  # the operator may not read the pods: what they would say is unknown
        return condition(SLICE_READY, None, pods_problem[0], pods_problem[1], generation)
    if seen.no_webhook:
        return condition(SLICE_READY, False, seen.no_webhook[0], seen.no_webhook[1], generation)
    if has_rayjob and seen.ready >= s.hosts:
        return condition(SLICE_READY, True, "AllHostsReady", f"{seen.ready}/{s.hosts} TPU hosts ready", generation)
    if seen.blocked:
        return condition(SLICE_READY, False, seen.blocked[0], seen.blocked[1], generation)
    if seen.unschedulable:
        return condition(SLICE_READY, False, "Unschedulable", seen.unschedulable, generation)
    return condition(SLICE_READY, False, "WaitingForHosts", f"{seen.ready}/{s.hosts} TPU hosts ready", generation)


def end_condition(job: JobSpec, seen: JobObserved, phase: str, decided: AttemptDecision, generation: int) -> dict | None:
    """Succeeded or Failed once the job has ended: for a failure, the last attempt's reason (and
    the retries of its kind spent), else KubeRay's."""
    if phase == "Succeeded":
        return condition(SUCCEEDED, True, "JobSucceeded", seen.kuberay_message or "the Ray job succeeded", generation)
    if phase != "Failed":
        return None
    last = decided.history[-1] if decided.history else None
    if last is not None and last.get("attempt") == decided.number:
        budget = job.retries.get(str(last["result"]).lower())
        why = last["message"] + (f" ({last['result'].lower()} failure after {budget} retries of that kind)"
                                 if budget is not None and budget > 0 else "")
        return condition(FAILED, True, last["reason"], why, generation)
    reason = seen.rj_status.get("reason") or "JobFailed"
    return condition(FAILED, True, reason, seen.kuberay_message or f"the Ray job ended {seen.job_status or 'in failure'}",
                     generation)


def chip_isolation_condition(job: JobSpec, generation: int) -> dict | None:
    """ChipIsolation=False when a group's env switches Ray's per-worker chip isolation off: its
    processes see every chip of their host and must place themselves (verl's TPU recipe); the
    training slice keeps its isolation. None when no group does."""
    groups = [g.name for g in job.groups if g.manages_own_chips]
    if not groups:
        return None
    return condition(CHIP_ISOLATION, False, "GroupManagesOwnChips",
                     f"group(s) {', '.join(groups)} set {NOSET_VISIBLE_CHIPS}: Ray leaves TPU_VISIBLE_CHIPS unset on their "
                     f"hosts, so each process there sees every chip of its host and must keep to its own (two engines "
                     f"on one host's chips fail or share them); the training slice keeps Ray's per-worker isolation",
                     generation)


# --- the message ----------------------------------------------------------------------------------


def job_message(job: JobSpec, phase: str, seen: JobObserved, decided: AttemptDecision, previous: dict, created: dict,
                slice_ready: dict, ended: dict | None, has_rayjob: bool, queue: Admission | None) -> str:
    """The status message: what the phase means for this job now, and what it waits for."""
    if phase == "Retrying":
        if decided.retry_note:
            return decided.retry_note
        if not has_rayjob and created["reason"] in (tries.EARLIER_PODS_WAITING, tries.EARLIER_PODS_STUCK):
            return created["message"]  # which pods of the previous attempt the next one waits for
        if previous.get("phase") == "Retrying" and previous.get("message"):
            return previous["message"]
        return f"attempt {decided.number}: {slice_ready['message']}"
    if phase == "Running":
        return f"{job.workers} worker(s) on a {_shape(job).split(':')[0]}, {seen.ready}/{job.slice.hosts} hosts ready"
    if ended is not None:
        return ended["message"]
    if phase == "Suspended":
        return "suspended: the RayJob holds no slice"
    if phase in QUEUE_PHASES:
        return queue_message(job, queue)
    if not has_rayjob:
        return created["message"]
    return slice_ready["message"]


# --- the whole status -----------------------------------------------------------------------------


def _shape(job: JobSpec) -> str:
    s = job.slice
    return (f"{s.generation.name} {s.topology} slice: {s.hosts} host(s) x {s.chips_per_host} chips, "
            f"{job.workers} worker(s) x {job.chips_per_worker} chip(s)")


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
    log_denial: storage_access.Denial | None = None,
    hang: sentinel.Seen | None = None,
) -> dict:
    """The whole status of a valid TPUTorchJob from what is observed now.

    ``problem`` is (reason, message) when the RayJob could not be created (e.g. KubeRay's
    CRDs are missing); ``pods`` are the pods of the RayJob's cluster (metadata.name, labels,
    deletionTimestamp, status.phase/reason/conditions as the API returns them), ``deleted`` those of
    its pods seen deleted while it ran; ``queue`` is where Kueue has the RayJob (spec.queueName set
    and the RayJob exists); ``pods_problem`` is (reason, message) while the operator may not read
    the namespace's pods; ``network`` its NetworkPolicy (None: the operator makes none);
    ``log_denial`` a Cloud Storage 403 the driver's log showed in this attempt (the controller reads it);
    ``hang`` what the reads of the attempt's driver log saw for the hang sentinel (status/hang.py).

    ``rayjob`` is the current attempt's when its attempt label says so; one of an ended attempt
    is going (the reconcile deletes it) and shows the job Retrying.
    """
    number = attempt(previous)
    if rayjob is not None and attempt_of_child(rayjob) != number:
        rayjob = None  # an ended attempt's RayJob: nothing of it describes this attempt
    seen = observe_job(job, rayjob, pods)
    kuberay_phase = queue_phase(rayjob_phase(seen.deployment, seen.job_status) if rayjob is not None else "Pending",
                                job.suspend, queue)
    decided = decide_attempt(job, previous, number, rayjob, seen, kuberay_phase, deleted, network, now, hang)
    phase = job_phase(decided, seen)

    denied = storage_access.said(job, (("the Ray job's message", storage_access.find(seen.kuberay_message)),
                                       ("the driver's log", log_denial)))
    conditions = leading_conditions(_shape(job), RAYJOB_CREATED, "RayJob", job.name, rayjob, problem, True, queue, network,
                                    generation, job.identity_warning, denied)
    slice_ready = slice_ready_condition(job, seen, phase, rayjob is not None, pods_problem, generation)
    ended = end_condition(job, seen, phase, decided, generation)
    chips = chip_isolation_condition(job, generation)
    hung = sentinel.hang_condition(job, phase, decided.history, decided.number, previous, now, generation)
    conditions += [slice_ready] + [c for c in (ended, chips, hung) if c is not None]

    message = job_message(job, phase, seen, decided, previous, conditions[1], slice_ready, ended, rayjob is not None, queue)
    return _job_status(job, seen, phase, message, stamp(conditions, previous, now), decided, previous, now, generation, queue)


def _job_status(job: JobSpec, seen: JobObserved, phase: str, message: str, conditions: list[dict],
                decided: AttemptDecision, previous: dict, now: str, generation: int, queue: Admission | None) -> dict:
    s, history, rj_status = job.slice, decided.history, seen.rj_status
    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": generation,
        "conditions": conditions,
        "workers": job.workers,
        "hosts": s.hosts,
        "readyHosts": seen.ready,
        "hostsReady": f"{seen.ready}/{s.hosts}",
        "rayJobName": job.name,
        **queue_fields(job, queue),
        "attempts": decided.number,
    }
    status.update(training.carried(previous))  # the controller puts a newer read in (progress.apply)
    if history:
        status["attemptHistory"] = history if len(history) <= MAX_HISTORY else history[:1] + history[-(MAX_HISTORY - 1):]
    optional = {
        "rayClusterName": rj_status.get("rayClusterName"),
        "dashboardURL": rj_status.get("dashboardURL"),
        "jobId": rj_status.get("jobId"),
        "jobStatus": seen.job_status or None,
        "jobDeploymentStatus": seen.deployment or None,
        "startTime": rj_status.get("startTime"),
        "completionTime": (rj_status.get("endTime") or previous.get("completionTime") or now) if phase in TERMINAL_PHASES else None,
    }
    status.update({k: v for k, v in optional.items() if v})
    return status
