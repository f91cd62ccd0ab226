"""Observed RayJob / RayService (+ their pods) -> TPUTorchJob / TPUTorchService status, and the
events a status change deserves.

Pure functions: the reconcile feeds them what the watches saw and patches what comes out. Both
kinds share the condition helpers, the scheduling and host readiness reading, invalid(),
patch_for() and events(); each has its own derive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .. import render
from ..api.spec import FieldError, JobSpec, ServiceSpec

# Condition types, in the order they are written.
VALIDATED = "Validated"
RAYJOB_CREATED = "RayJobCreated"
SLICE_READY = "SliceReady"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
CONDITION_TYPES = (VALIDATED, RAYJOB_CREATED, SLICE_READY, SUCCEEDED, FAILED)
RAYSERVICE_CREATED = "RayServiceCreated"
READY = "Ready"
SERVICE_CONDITION_TYPES = (VALIDATED, RAYSERVICE_CREATED, SLICE_READY, READY, FAILED)

TERMINAL_PHASES = ("Succeeded", "Failed")
SERVICE_PHASES = ("Pending", "Deploying", "Ready", "Updating", "Failed")
ROLE_LABEL = "ray.io/node-type"  # KubeRay labels each pod head or worker
CLUSTER_LABEL = "ray.io/cluster"  # and with its RayCluster's name
# KubeRay >= 1.5 with its RayMultiHostIndexing gate: which slice replica a host pod belongs to.
REPLICA_LABEL = "ray.io/worker-group-replica-name"
# The pod labels the derive functions read (a pod store may keep only these).
POD_LABELS_READ = (ROLE_LABEL, CLUSTER_LABEL, REPLICA_LABEL)

# Every status field this module writes (the CRD declares each one).
STATUS_FIELDS = (
    "phase", "message", "observedGeneration", "conditions", "workers", "hosts", "readyHosts",
    "hostsReady", "rayJobName", "rayClusterName", "dashboardURL", "jobId", "jobStatus",
    "jobDeploymentStatus", "startTime", "completionTime",
)
SERVICE_STATUS_FIELDS = (
    "phase", "message", "observedGeneration", "conditions", "replicas", "readyReplicas",
    "replicasReady", "hosts", "readyHosts", "model", "endpoint", "rayServiceName", "rayClusterName",
    "serviceStatus", "applicationStatus", "applicationMessage",
)
# A condition's message is capped (metav1.Condition allows 32768 characters).
MAX_CONDITION_MESSAGE = 32768

# Condition states that are bad news: their events are Warnings.
_WARNING_STATES = {
    (VALIDATED, "False"),
    (FAILED, "True"),
    (RAYJOB_CREATED, "False"),
    (RAYSERVICE_CREATED, "False"),
}
_WARNING_REASONS = {"Unschedulable"}
# Reasons that only describe waiting; they change often and get no event of their own.
# "Valid" is every job's first state: an event per job for it would only add a write to each create.
_QUIET_REASONS = {"Valid", "Creating", "WaitingForHosts", "WaitingForKubeRay", "NoRayService"}
# Phases whose start is an event of its own (the others have a condition event that says it).
_PHASE_EVENTS = ("Running", "Suspended", "Deploying", "Ready", "Updating")


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase
    message: str


def _condition(ctype: str, status: bool | None, reason: str, message: str, generation: int) -> dict:
    if len(message) > MAX_CONDITION_MESSAGE:
        message = message[: MAX_CONDITION_MESSAGE - 3] + "..."
    return {
        "type": ctype,
        "status": {True: "True", False: "False", None: "Unknown"}[status],
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _stamp(conditions: Iterable[dict], previous: dict, now: str) -> list[dict]:
    """lastTransitionTime moves only when a condition's status flips."""
    before = {c.get("type"): c for c in previous.get("conditions") or [] if isinstance(c, dict)}
    stamped = []
    for cond in conditions:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime")
        stamped.append({**cond, "lastTransitionTime": old["lastTransitionTime"] if same else now})
    return stamped


def invalid(errors: list[FieldError], generation: int, previous: dict, now: str) -> dict:
    message = "invalid spec: " + "; ".join(str(e) for e in errors)
    return {
        "phase": "Failed",
        "message": message,
        "observedGeneration": generation,
        "conditions": _stamp(
            [
                _condition(VALIDATED, False, "ValidationFailed", message, generation),
                _condition(FAILED, True, "ValidationFailed", message, generation),
            ],
            previous,
            now,
        ),
    }


def _pod_name(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def _pod_condition(pod: dict, ctype: str) -> dict:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


# The scheduler rewrites the node counts of its message on every retry ("0/7 nodes are available:
# 3 node(s) had untolerated taint ..."); without them the message changes only with its substance.
_NODE_TOTAL = re.compile(r"\b0/\d+ nodes are available")
_REASON_COUNT = re.compile(r"(^|: |, )\d+ ")


# The scheduler lists its reasons by descending count: with the counts gone, the order would
# still move whenever the counts cross (measured: bench/RESULTS.md run 6, measure 5).
_REASON_LIST = re.compile(r"(no nodes are available: )(.*?)(?=\.(?: |$))")
_REASON_SEPARATOR = re.compile(r", (?![^{]*\})")  # not inside a taint's {key: value}


def stable_scheduler_message(message: str) -> str:
    """The scheduler's message without its node counts, its reasons in a fixed order."""
    without_counts = _REASON_COUNT.sub(r"\1", _NODE_TOTAL.sub("no nodes are available", message))
    return _REASON_LIST.sub(lambda m: m.group(1) + ", ".join(sorted(_REASON_SEPARATOR.split(m.group(2)))),
                            without_counts)


def scheduling_problem(pods: Iterable[dict]) -> str | None:
    """Why the first unschedulable pod (by name) waits, if one does; stable across the
    scheduler's retries."""
    for pod in sorted(pods, key=_pod_name):
        cond = _pod_condition(pod, "PodScheduled")
        if cond.get("status") == "False":
            message = stable_scheduler_message(cond.get("message", ""))
            return f"pod {_pod_name(pod)}: {cond.get('reason', 'Unschedulable')}: {message}".strip()
    return None


def _labels(pod: dict) -> dict:
    return (pod.get("metadata") or {}).get("labels") or {}


def _workers(pods: Iterable[dict]) -> list[dict]:
    return [p for p in pods if _labels(p).get(ROLE_LABEL) == "worker"]


def _ready(pod: dict) -> bool:
    return _pod_condition(pod, "Ready").get("status") == "True"


def ready_hosts(pods: Iterable[dict], cluster_status: dict) -> int:
    """TPU host pods that are Ready. The pods are fresher than the RayJob's copy of the
    RayCluster's status, which is only the fallback once the pods are gone (job finished)."""
    workers = _workers(pods)
    if workers:
        return sum(1 for p in workers if _ready(p))
    return int(cluster_status.get("readyWorkerReplicas") or 0)


def ready_slices(pods: Iterable[dict], hosts_per_slice: int, ready: int) -> int:
    """Slice replicas whose every host is Ready. Grouped by KubeRay's replica label where the pods
    carry it; otherwise whole slices' worth of ready hosts (KubeRay creates a slice's hosts together)."""
    workers = _workers(pods)
    if workers and all(REPLICA_LABEL in _labels(p) for p in workers):
        groups: dict[str, list[dict]] = {}
        for p in workers:
            groups.setdefault(_labels(p)[REPLICA_LABEL], []).append(p)
        return sum(1 for g in groups.values() if len(g) >= hosts_per_slice and all(_ready(p) for p in g))
    return ready // hosts_per_slice


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


def _child_created(ctype: str, child_kind: str, name: str, child: dict | None, problem: tuple[str, str] | None,
                   generation: int) -> dict:
    """<Child>Created: the child exists, or why it does not (yet)."""
    if child is not None:
        return _condition(ctype, True, "Created", f"{child_kind} {name} exists", generation)
    if problem is not None:
        return _condition(ctype, False, problem[0], problem[1], generation)
    return _condition(ctype, False, "Creating", f"creating the {child_kind}", generation)


def derive(
    job: JobSpec,
    generation: int,
    rayjob: dict | None,
    pods: Iterable[dict],
    previous: dict,
    now: str,
    problem: tuple[str, str] | None = None,
) -> dict:
    """The whole status of a valid TPUTorchJob from what is observed now.

    ``problem`` is (reason, message) when the RayJob could not be created (e.g. KubeRay's
    CRDs are missing); ``pods`` are the job's pods (metadata.name, metadata.labels, status.conditions
    as the API returns them).
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
    pods = list(pods)
    ready = ready_hosts(pods, cluster_status)
    kuberay_message = rj_status.get("message") or rj_status.get("reason") or ""

    conditions = [_condition(VALIDATED, True, "Valid", shape, generation),
                  _child_created(RAYJOB_CREATED, "RayJob", job.name, rayjob, problem, generation)]

    unschedulable = scheduling_problem(pods)
    if phase in TERMINAL_PHASES:
        slice_ready = _condition(SLICE_READY, False, "JobFinished", "the job has finished", generation)
    elif phase == "Suspended":
        slice_ready = _condition(SLICE_READY, False, "Suspended", "the job is suspended", generation)
    elif rayjob is not None and ready >= s.hosts:
        slice_ready = _condition(SLICE_READY, True, "AllHostsReady", f"{ready}/{s.hosts} TPU hosts ready", generation)
    elif unschedulable:
        slice_ready = _condition(SLICE_READY, False, "Unschedulable", unschedulable, generation)
    else:
        slice_ready = _condition(SLICE_READY, False, "WaitingForHosts", f"{ready}/{s.hosts} TPU hosts ready", generation)
    conditions.append(slice_ready)

    if phase == "Succeeded":
        conditions.append(_condition(SUCCEEDED, True, "JobSucceeded", kuberay_message or "the Ray job succeeded", generation))
    if phase == "Failed":
        reason = rj_status.get("reason") or "JobFailed"
        conditions.append(_condition(FAILED, True, reason, kuberay_message or f"the Ray job ended {job_status or 'in failure'}", generation))

    if phase == "Running":
        message = f"{job.workers} worker(s) on a {shape.split(':')[0]}, {ready}/{s.hosts} hosts ready"
    elif phase in TERMINAL_PHASES:
        message = conditions[-1]["message"]
    elif phase == "Suspended":
        message = "suspended: the RayJob holds no slice"
    elif rayjob is None:
        message = conditions[1]["message"]
    else:
        message = slice_ready["message"]

    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": generation,
        "conditions": _stamp(conditions, previous, now),
        "workers": job.workers,
        "hosts": s.hosts,
        "readyHosts": ready,
        "hostsReady": f"{ready}/{s.hosts}",
        "rayJobName": job.name,
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


def endpoint(svc: ServiceSpec) -> str:
    """The OpenAI base URL inside the cluster: KubeRay's serve Service <name>-serve-svc."""
    return f"http://{svc.name}-serve-svc.{svc.namespace}.svc.cluster.local:{render.SERVE_PORT}/v1"


def _kuberay_condition(rs_status: dict, ctype: str) -> dict:
    return next((c for c in rs_status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == ctype), {})


def _application(service_status: dict) -> dict:
    return ((service_status or {}).get("applicationStatuses") or {}).get(render.SERVE_APP) or {}


def _service_phase(rayservice: dict | None, rs_status: dict, up_to_date: bool, slice_ready: bool) -> str:
    if rayservice is None:
        return "Pending"
    ready = _kuberay_condition(rs_status, "Ready")
    active_app = _application(rs_status.get("activeServiceStatus")).get("status")
    if ready.get("reason") in ("InitializingTimeout", "ValidationFailed") or active_app == "DEPLOY_FAILED":
        return "Failed"
    if ready.get("status") == "True":
        upgrading = _kuberay_condition(rs_status, "UpgradeInProgress").get("status") == "True"
        # DEPLOYING while ready: KubeRay redeploys the application in place (a serve config edit).
        return "Ready" if up_to_date and not upgrading and active_app != "DEPLOYING" else "Updating"
    return "Deploying" if slice_ready or active_app else "Pending"


def derive_service(
    svc: ServiceSpec,
    generation: int,
    rayservice: dict | None,
    pods: Iterable[dict],
    previous: dict,
    now: str,
    problem: tuple[str, str] | None = None,
) -> dict:
    """The whole status of a valid TPUTorchService from its RayService (KubeRay v1.5's status:
    conditions Ready/UpgradeInProgress, serviceStatus, active/pendingServiceStatus with the Serve
    application's status) and its pods; ``problem`` as for derive."""
    s = svc.slice
    shape = (
        f"{s.generation.name} {s.topology} slice per replica: {s.hosts} host(s) x {s.chips_per_host} chips, "
        f"tensor parallel {svc.tensor_parallel_size} x pipeline parallel {svc.pipeline_parallel_size}"
    )
    rs_status = (rayservice or {}).get("status") or {}
    active = rs_status.get("activeServiceStatus") or {}
    pending = rs_status.get("pendingServiceStatus") or {}
    cluster_name = active.get("rayClusterName") or pending.get("rayClusterName")
    pods = list(pods)
    if cluster_name:
        # During an upgrade the pending cluster's pods are there too: count the serving cluster's.
        serving = [p for p in pods if _labels(p).get(CLUSTER_LABEL) in (None, cluster_name)]
        pods = serving or pods
    cluster_status = active.get("rayClusterStatus") or pending.get("rayClusterStatus") or {}
    ready = ready_hosts(pods, cluster_status)
    ready_replicas = ready_slices(pods, s.hosts, ready)
    desired_hosts = int(cluster_status.get("desiredWorkerReplicas") or 0)
    replicas = max(svc.min_replicas, min(desired_hosts // s.hosts, svc.max_replicas))
    # Our edits reach the RayService by its spec hash; until KubeRay has seen the new generation
    # (and the hash is the desired one) the service is updating, not ready.
    meta = (rayservice or {}).get("metadata") or {}
    desired_hash = render.spec_hash(render.rayservice(svc)["spec"])
    seen, wanted = rs_status.get("observedGeneration"), meta.get("generation")
    up_to_date = (
        (meta.get("annotations") or {}).get(render.SPEC_HASH_ANNOTATION) == desired_hash
        and (seen is None or wanted is None or seen >= wanted)
    )

    conditions = [_condition(VALIDATED, True, "Valid", shape, generation),
                  _child_created(RAYSERVICE_CREATED, "RayService", svc.name, rayservice, problem, generation)]

    unschedulable = scheduling_problem(pods)
    slices_message = f"{ready_replicas}/{replicas} slice replica(s) ready, {ready}/{replicas * s.hosts} TPU hosts"
    if rayservice is not None and ready_replicas >= svc.min_replicas:
        slice_ready = _condition(SLICE_READY, True, "AllHostsReady", slices_message, generation)
    elif unschedulable:
        slice_ready = _condition(SLICE_READY, False, "Unschedulable", unschedulable, generation)
    else:
        slice_ready = _condition(SLICE_READY, False, "WaitingForHosts", slices_message, generation)
    conditions.append(slice_ready)

    kuberay_ready = _kuberay_condition(rs_status, "Ready")
    if rayservice is None:
        ready_cond = _condition(READY, False, "NoRayService", "the RayService does not exist yet", generation)
    elif not kuberay_ready:
        ready_cond = _condition(READY, False, "WaitingForKubeRay", "KubeRay has not reported on the RayService yet", generation)
    else:
        ready_cond = _condition(
            READY, kuberay_ready.get("status") == "True", kuberay_ready.get("reason") or "Unknown",
            kuberay_ready.get("message") or "", generation,
        )
    conditions.append(ready_cond)

    app = _application(active) or _application(pending)
    app_status, app_message = app.get("status"), app.get("message") or ""
    phase = _service_phase(rayservice, rs_status, up_to_date, slice_ready["status"] == "True")
    if phase == "Failed":
        reason = "DeployFailed" if _application(active).get("status") == "DEPLOY_FAILED" else kuberay_ready.get("reason", "Failed")
        conditions.append(_condition(FAILED, True, reason, app_message or kuberay_ready.get("message") or "the service failed", generation))

    if phase == "Ready":
        message = f"serving {svc.model_name} on {ready_replicas} replica(s) of a {s.generation.name} {s.topology} slice"
        if app_status and app_status != "RUNNING":
            message += f"; the application is {app_status}" + (f": {app_message}" if app_message else "")
    elif phase == "Updating":
        pending_app = _application(pending)
        if pending_app.get("status") == "DEPLOY_FAILED":
            message = f"the new version failed to deploy, the old one still serves: {pending_app.get('message', '')}".rstrip(": ")
        else:
            message = "applying the new spec; the service keeps serving meanwhile (KubeRay upgrades it)"
    elif phase == "Failed":
        message = conditions[-1]["message"]
    elif rayservice is None:
        message = conditions[1]["message"]
    elif phase == "Deploying":
        message = f"deploying {svc.model_name}" + (f": {app_status}" if app_status else "") + (f" {app_message}" if app_message else "")
    else:
        message = slice_ready["message"]

    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": generation,
        "conditions": _stamp(conditions, previous, now),
        "replicas": replicas,
        "readyReplicas": ready_replicas,
        "replicasReady": f"{ready_replicas}/{replicas}",
        "hosts": replicas * s.hosts,
        "readyHosts": ready,
        "model": svc.model_name,
        "endpoint": endpoint(svc),
        "rayServiceName": svc.name,
    }
    optional = {
        "rayClusterName": cluster_name,
        "serviceStatus": rs_status.get("serviceStatus"),
        "applicationStatus": app_status,
        "applicationMessage": app_message,
    }
    status.update({k: v for k, v in optional.items() if v})
    return status


def finished(status: dict) -> bool:
    """The Ray job ran to an end (not merely a spec that failed validation): never run it again."""
    return bool(status.get("completionTime"))


def without_times(status: dict) -> dict:
    """Status minus fields that only say when: used to decide whether a patch is needed."""
    return {
        **status,
        "conditions": [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []],
    }


def patch_for(previous: dict, current: dict) -> dict | None:
    """Merge patch that turns ``previous`` into ``current``; None when only timestamps would change.

    Fields of ours that ``current`` no longer has are set to null (a merge patch keeps them otherwise).
    """
    if without_times(previous) == without_times(current):
        return None
    patch = dict(current)
    for key in dict.fromkeys(STATUS_FIELDS + SERVICE_STATUS_FIELDS):
        if key in previous and key not in current:
            patch[key] = None
    return patch


def events(previous: dict, current: dict) -> list[Event]:
    """One event per condition whose status or reason changed, and one per phase change unless a
    condition's event already carries that reason (a suspend is one `Suspended` event, not two)."""
    before = {c.get("type"): c for c in previous.get("conditions") or [] if isinstance(c, dict)}
    result = []
    for cond in current.get("conditions") or []:
        old = before.get(cond["type"]) or {}
        if (old.get("status"), old.get("reason")) == (cond["status"], cond["reason"]):
            continue
        if cond["reason"] in _QUIET_REASONS:
            continue
        warning = (cond["type"], cond["status"]) in _WARNING_STATES or cond["reason"] in _WARNING_REASONS
        result.append(Event("Warning" if warning else "Normal", cond["reason"], f"{cond['type']}={cond['status']}: {cond['message']}"))
    phase = current.get("phase")
    if previous.get("phase") != phase and phase in _PHASE_EVENTS and phase not in {e.reason for e in result}:
        result.append(Event("Normal", phase, current.get("message", "")))
    return result
