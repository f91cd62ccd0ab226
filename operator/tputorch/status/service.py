"""Observed RayService (+ its pods) -> TPUTorchService status, and the endpoint it serves."""

from __future__ import annotations

from typing import Iterable

from .. import render
from ..api.spec import ServiceSpec
from .conditions import (
    CLUSTER_LABEL, FAILED, RAYSERVICE_CREATED, READY, SLICE_READY, VALIDATED, child_created, condition, labels_of, ready_hosts,
    ready_slices, scheduling_problem, stamp,
)

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
        serving = [p for p in pods if labels_of(p).get(CLUSTER_LABEL) in (None, cluster_name)]
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

    conditions = [condition(VALIDATED, True, "Valid", shape, generation),
                  child_created(RAYSERVICE_CREATED, "RayService", svc.name, rayservice, problem, generation)]

    unschedulable = scheduling_problem(pods)
    slices_message = f"{ready_replicas}/{replicas} slice replica(s) ready, {ready}/{replicas * s.hosts} TPU hosts"
    if rayservice is not None and ready_replicas >= svc.min_replicas:
        slice_ready = condition(SLICE_READY, True, "AllHostsReady", slices_message, generation)
    elif unschedulable:
        slice_ready = condition(SLICE_READY, False, "Unschedulable", unschedulable, generation)
    else:
        slice_ready = condition(SLICE_READY, False, "WaitingForHosts", slices_message, generation)
    conditions.append(slice_ready)

    kuberay_ready = _kuberay_condition(rs_status, "Ready")
    if rayservice is None:
        ready_cond = condition(READY, False, "NoRayService", "the RayService does not exist yet", generation)
    elif not kuberay_ready:
        ready_cond = condition(READY, False, "WaitingForKubeRay", "KubeRay has not reported on the RayService yet", generation)
    else:
        ready_cond = condition(
            READY, kuberay_ready.get("status") == "True", kuberay_ready.get("reason") or "Unknown",
            kuberay_ready.get("message") or "", generation,
        )
    conditions.append(ready_cond)

    app = _application(active) or _application(pending)
    app_status, app_message = app.get("status"), app.get("message") or ""
    phase = _service_phase(rayservice, rs_status, up_to_date, slice_ready["status"] == "True")
    if phase == "Failed":
        reason = "DeployFailed" if _application(active).get("status") == "DEPLOY_FAILED" else kuberay_ready.get("reason", "Failed")
        conditions.append(condition(FAILED, True, reason, app_message or kuberay_ready.get("message") or "the service failed", generation))

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
        "conditions": stamp(conditions, previous, now),
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


