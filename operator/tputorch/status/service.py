"""Observed RayService (+ its pods) -> TPUTorchService status, and the endpoint it serves."""

from __future__ import annotations

import re
from typing import Iterable

from .. import render
from ..api.spec import ServiceSpec
from .conditions import (
    CLUSTER_LABEL, FAILED, QUEUE_PHASES, ROLE_LABEL, RAYSERVICE_CREATED, READY, SLICE_READY, SPEC_APPLIED, VALIDATED, admitted_condition,
    child_created, condition, container_problem, labels_of, quota_problem, queue_fields, queue_message, queue_phase, ready_hosts,
    ready_slices, running, scheduling_problem, stamp, no_node_pool, tpu_webhook_missing, wanted_hosts,
)
from . import applied as appl
from . import auth
from . import network as net
from .kueue import Admission

# Ray Serve LLM's build_openai_app names the deployment that runs the engine LLMServer:<model id>
# (the others route requests: OpenAiIngress, LLMRouter).
LLM_DEPLOYMENT_PREFIX = "LLMServer"

SCALED_TO_ZERO = "ScaledToZero"


def _first_request_wait() -> str:
    return (f"Serve LLM answers a request 408 after {render.SCALE_FROM_ZERO_TIMEOUT_S} s: the slice's provisioning, "
            "the image, the weights and the compile must fit")


# SliceReady's reason while the service serves on at least replicas.min slices and Ray's autoscaler
# has asked for more that are not up yet (starting, or waiting for capacity).
SCALING_UP = "ScalingUp"


def scaling_up_message(missing: int, no_pool: tuple[str, str] | None, unschedulable: str | None,
                       stuck: tuple[str, str] | None) -> str:
    """What the slices Ray's autoscaler added and that are not up yet wait for."""
    why = (no_pool and no_pool[1]) or unschedulable or (stuck and stuck[1])
    return f"{missing} more wanted by Ray's autoscaler " + (f"cannot start: {why}" if why else "starting")


def scaled_to_zero_message(svc: ServiceSpec, hosts_running: int = 0) -> str:
    s = svc.slice
    held = (f"scaling to zero: Ray's autoscaler is giving back the slice ({hosts_running} host(s) still running)"
            if hosts_running else f"scaled to zero: no slice is held while {svc.model_name} is idle")
    return (f"{held}; the next request waits while Ray's autoscaler brings a {s.generation.name} {s.topology} slice "
            f"back and the model loads ({_first_request_wait()})")


def endpoint(svc: ServiceSpec) -> str:
    """The OpenAI base URL inside the cluster: KubeRay's serve Service <name>-serve-svc."""
    return f"http://{svc.name}-serve-svc.{svc.namespace}.svc.cluster.local:{render.SERVE_PORT}/v1"


def _kuberay_condition(rs_status: dict, ctype: str) -> dict:
    return next((c for c in rs_status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == ctype), {})


def _application(service_status: dict) -> dict:
    return ((service_status or {}).get("applicationStatuses") or {}).get(render.SERVE_APP) or {}


# A deployment Serve is scaling on load (UPSCALING/DOWNSCALING, Ray 2.60 keeps the application
# RUNNING then) serves on the replicas it has: under load with no free slice for the next replica
# it stays UPSCALING for as long as that slice is missing.
SERVING_DEPLOYMENT = ("HEALTHY", "UPSCALING", "DOWNSCALING")


def _serving(app: dict) -> tuple[bool, str, str]:
    """(serving, reason, message) of the Serve application: serving only while it is RUNNING and
    its LLM deployment(s) HEALTHY (or scaling on load). KubeRay's own Ready stays true while any Serve proxy is
    healthy, and the head always has one, so it outlives a crashed model replica."""
    status, message = app.get("status"), app.get("message") or ""
    deployments = app.get("serveDeploymentStatuses") or {}
    llm = {n: d for n, d in deployments.items() if n.startswith(LLM_DEPLOYMENT_PREFIX)} or deployments
    sick = sorted((n, d) for n, d in llm.items() if (d or {}).get("status") not in SERVING_DEPLOYMENT)
    if status == "RUNNING" and not sick:
        return True, "Serving", "the application is RUNNING and its LLM deployment HEALTHY"
    detail = "; ".join(f"{n} is {d.get('status') or 'unknown'}" + (f": {d['message']}" if d.get("message") else "")
                       for n, d in sick)
    reason = {"UNHEALTHY": "ApplicationUnhealthy", "DEPLOYING": "ApplicationDeploying",
              "DEPLOY_FAILED": "DeployFailed"}.get(status or "", "ApplicationNotRunning")
    if status == "RUNNING":  # not yet reflected in the app's own status
        reason = "ApplicationUnhealthy"
    return False, reason, "; ".join(x for x in (f"the application is {status or 'not reported'}" +
                                                (f": {message}" if message else ""), detail) if x)


def _ready_during_upgrade(serving_cluster: str, previous: dict, generation: int) -> dict:
    """Ready while KubeRay upgrades to a new RayCluster, whose status then carries no applications
    for the serving one: KubeRay 1.6 reads only the pending cluster's Serve applications during an
    upgrade and writes the active cluster's as none (rayservice_controller.go, recorded from KubeRay
    1.6.2). The serving cluster's state is the last one read (its Ready kept); KubeRay's own Ready
    (Serve endpoints) is true here."""
    last = next((c for c in previous.get("conditions") or [] if isinstance(c, dict) and c.get("type") == READY), None)
    if last and last.get("status") in ("True", "False"):
        return condition(READY, last["status"] == "True", last.get("reason") or "Serving", last.get("message") or "", generation)
    return condition(READY, True, "Serving", f"KubeRay reports Serve endpoints; it does not read RayCluster "
                     f"{serving_cluster}'s applications while it upgrades to a new one", generation)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _failure(app: dict) -> str:
    """Ray's reason a model failed to load: the application's message ("Failed to update the
    deployments [...]") and the last line of the failing LLM deployment's message, where Serve puts
    the replica's exception after its traceback (e.g. RuntimeError: Failed to create vLLM engine
    config: ...)."""
    message = app.get("message") or ""
    for name, d in sorted((app.get("serveDeploymentStatuses") or {}).items()):
        if name.startswith(LLM_DEPLOYMENT_PREFIX) and d.get("status") in ("DEPLOY_FAILED", "UNHEALTHY"):
            lines = [ln.strip() for ln in _ANSI.sub("", d.get("message") or "").splitlines() if ln.strip()]
            if lines and lines[-1] not in message:
                message = f"{message} {lines[-1]}".strip()
    return message


def _service_phase(rayservice: dict | None, rs_status: dict, up_to_date: bool, slice_ready: bool,
                   app: dict, previous_phase: str | None, slice_held: bool = False) -> str:
    if rayservice is None:
        return "Pending"
    ready = _kuberay_condition(rs_status, "Ready")
    active = rs_status.get("activeServiceStatus") or {}
    active_app = _application(active)
    pending_app = _application(rs_status.get("pendingServiceStatus"))
    if ready.get("reason") in ("InitializingTimeout", "ValidationFailed") or active_app.get("status") == "DEPLOY_FAILED":
        return "Failed"
    if not active.get("rayClusterName") and pending_app.get("status") == "DEPLOY_FAILED":
        # Before the first promotion KubeRay reports the application under pendingServiceStatus.
        return "Failed"
    if ready.get("status") == "True" or ready.get("reason") == "ZeroServeEndpoints":
        upgrading = _kuberay_condition(rs_status, "UpgradeInProgress").get("status") == "True"
        # ZeroServeEndpoints (KubeRay sets it only after Ready): no Serve proxy is left behind
        # <name>-serve-svc, so nothing answers clients whatever Serve says of the application.
        serving = _serving(active_app)[0] and ready.get("reason") != "ZeroServeEndpoints"
        if serving:
            return "Ready" if up_to_date and not upgrading else "Updating"
        if not up_to_date or upgrading:
            return "Updating"
        if active_app.get("status") == "DEPLOYING":
            # Serve is starting replicas: replacing a lost one after Degraded, else an in-place
            # redeploy of an edited serve config.
            return "Recovering" if previous_phase in ("Degraded", "Recovering") else "Updating"
        return "Degraded"
    if slice_held:
        # Serve deploys as soon as the head is up (the application DEPLOYING), but the slice's
        # hosts cannot start: nothing is deploying onto TPUs until they do.
        return "Pending"
    return "Deploying" if slice_ready or app.get("status") else "Pending"


def derive_service(
    svc: ServiceSpec,
    generation: int,
    rayservice: dict | None,
    pods: Iterable[dict],
    previous: dict,
    now: str,
    problem: tuple[str, str] | None = None,
    queue: Admission | None = None,
    deleted: Iterable[dict] = (),  # noqa: ARG001  (a service has no attempts: lost pods are KubeRay's to replace)
    pods_problem: tuple[str, str] | None = None,
    network: net.NetworkPolicyState | None = None,
    *,
    desired_hash: str,
) -> dict:
    """The whole status of a valid TPUTorchService from its RayService (KubeRay v1.5's status:
    conditions Ready/UpgradeInProgress, serviceStatus, active/pendingServiceStatus with the Serve
    application's status) and its pods; ``problem``, ``queue`` and ``network`` as for derive.
    ``desired_hash`` is the spec hash of the RayService ``svc`` renders (the reconcile renders it
    once): the live one is up to date only when it carries that hash."""
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
    pending_problem = None
    if cluster_name:
        # During an upgrade the pending cluster's pods are there too: count the serving cluster's,
        # and say why the pending cluster's cannot start (the upgrade waits on them).
        if active.get("rayClusterName") and pending.get("rayClusterName"):
            new = [p for p in pods if labels_of(p).get(CLUSTER_LABEL) == pending["rayClusterName"]]
            held = no_node_pool(new, render.worker_node_selector(svc))
            pending_problem = ((held[1] if held else None) or scheduling_problem(new)
                               or (quota_problem(pending.get("rayClusterStatus")) or container_problem(new) or (None, None))[1])
        serving = [p for p in pods if labels_of(p).get(CLUSTER_LABEL) in (None, cluster_name)]
        pods = serving or pods
    cluster_status = active.get("rayClusterStatus") or pending.get("rayClusterStatus") or {}
    # A RayService worker's readiness probe includes the Serve proxy, which runs only on nodes with
    # a Serve replica: a TPU host running only vLLM workers stays NotReady by design (KubeRay 1.5
    # pod builder). A host counts once its pod runs.
    ready = ready_hosts(pods, cluster_status, up=running)
    ready_replicas = ready_slices(pods, s.hosts, ready, up=running)
    desired_hosts = wanted_hosts(pods, cluster_status, pods_read=pods_problem is None)
    replicas = max(svc.min_replicas, min(desired_hosts // s.hosts, svc.max_replicas))
    # Our edits reach the RayService by its spec hash; until KubeRay has seen the new generation
    # (and the hash is the desired one) the service is updating, not ready.
    meta = (rayservice or {}).get("metadata") or {}
    seen, wanted = rs_status.get("observedGeneration"), meta.get("generation")
    up_to_date = (
        (meta.get("annotations") or {}).get(render.SPEC_HASH_ANNOTATION) == desired_hash
        and (seen is None or wanted is None or seen >= wanted)
    )

    conditions = [condition(VALIDATED, True, "Valid", shape, generation),
                  child_created(RAYSERVICE_CREATED, "RayService", svc.name, rayservice, problem, generation)]
    ray_auth = auth.ray_auth_condition("RayService", rayservice, False, generation)
    if ray_auth is not None:
        conditions.append(ray_auth)
    if queue is not None:
        conditions.append(admitted_condition(queue, generation))
    if network is not None:
        conditions.append(net.ready_condition(network, generation))

    unschedulable = scheduling_problem(pods)
    stuck = quota_problem(cluster_status) or container_problem(pods)
    no_pool = no_node_pool(pods, render.worker_node_selector(svc))
    no_webhook = tpu_webhook_missing(pods, s.hosts)
    slices_message = f"{ready_replicas}/{replicas} slice replica(s) up, {ready}/{replicas * s.hosts} TPU hosts running"
    # Scale to zero: no slice is wanted until Serve asks for a replica, then that one is. With none
    # wanted, the head alone must run (its Serve proxy takes the next request).
    slices_wanted = svc.min_replicas or min(replicas, 1)
    scaling_up = None
    head_runs = any(labels_of(p).get(ROLE_LABEL) == "head" and running(p) for p in pods)
    if no_webhook:
        slice_ready = condition(SLICE_READY, False, no_webhook[0], no_webhook[1], generation)
    elif rayservice is not None and slices_wanted == 0 and head_runs and not (unschedulable or stuck):
        slice_ready = condition(SLICE_READY, True, SCALED_TO_ZERO, scaled_to_zero_message(svc, ready), generation)
    elif rayservice is not None and slices_wanted and ready_replicas >= slices_wanted:
        # Serving on what is up; more slices, asked for by Ray's autoscaler, may not be up yet.
        scaling_up = (scaling_up_message(replicas - ready_replicas, no_pool, unschedulable, stuck)
                      if ready_replicas < replicas else None)
        slice_ready = (condition(SLICE_READY, True, SCALING_UP, f"{slices_message}; {scaling_up}", generation)
                       if scaling_up else condition(SLICE_READY, True, "AllHostsReady", slices_message, generation))
    elif no_pool:
        slice_ready = condition(SLICE_READY, False, no_pool[0], no_pool[1], generation)
    elif unschedulable:
        slice_ready = condition(SLICE_READY, False, "Unschedulable", unschedulable, generation)
    elif stuck:
        slice_ready = condition(SLICE_READY, False, stuck[0], stuck[1], generation)
    else:
        slice_ready = condition(SLICE_READY, False, "WaitingForHosts", slices_message, generation)
    slice_up = slice_ready["status"] == "True"  # from KubeRay's count alone when the pods cannot be read
    # the hosts cannot start (no pool, unschedulable, quota, an image or a crash loop)
    slice_held = not slice_up and slice_ready["reason"] != "WaitingForHosts"
    if pods_problem:  # the operator may not read the pods: what they would say is unknown
        slice_ready = condition(SLICE_READY, None, pods_problem[0], pods_problem[1], generation)
    conditions.append(slice_ready)

    kuberay_ready = _kuberay_condition(rs_status, "Ready")
    app = _application(active) or _application(pending)
    app_status, app_message = app.get("status"), app.get("message") or ""
    if rayservice is None:
        ready_cond = condition(READY, False, "NoRayService", "the RayService does not exist yet", generation)
    elif not kuberay_ready:
        ready_cond = condition(READY, False, "WaitingForKubeRay", "KubeRay has not reported on the RayService yet", generation)
    elif kuberay_ready.get("status") != "True":
        ready_cond = condition(READY, False, kuberay_ready.get("reason") or "Unknown", kuberay_ready.get("message") or "", generation)
    elif not _application(active) and active.get("rayClusterName") and pending.get("rayClusterName"):
        ready_cond = _ready_during_upgrade(active["rayClusterName"], previous, generation)
    else:
        serving, reason, why = _serving(_application(active))
        ready_cond = condition(READY, serving, reason, why, generation)
    # The slice is up and KubeRay reports no Serve application: it may not reach the dashboard
    # to PUT the Serve config (it fails the service at the initializing timeout).
    unreached = net.dashboard_cause(network) if rayservice is not None and slice_up and not app_status else None
    if unreached and ready_cond["status"] != "True":
        ready_cond = condition(READY, False, net.DASHBOARD_UNREACHABLE,
                               f"the slice is up but no Serve application is reported: {unreached}", generation)
    conditions.append(ready_cond)

    spec_applied = None
    if rayservice is not None:
        spec_applied = appl.applied(rayservice, previous.get(appl.APPLIED_FIELD), svc.upgrade_strategy, pending_problem, now)
        conditions.append(condition(SPEC_APPLIED, spec_applied.applied, spec_applied.reason, spec_applied.message, generation))
    phase = queue_phase(_service_phase(rayservice, rs_status, up_to_date, slice_up, app,
                                       previous.get("phase"), slice_held), False, queue)
    if phase == "Ready" and spec_applied is not None and spec_applied.reason in appl.IN_PROGRESS:
        # KubeRay's first status of an edit is the old config's (see status/applied.py)
        phase = "Updating"
    if phase == "Failed":
        if kuberay_ready.get("reason") == "InitializingTimeout":
            reason = "InitializingTimeout"
            text = "; ".join(x for x in (_failure(app), unreached, kuberay_ready.get("message"), "KubeRay deleted its RayClusters "
                                         "(the slices are released); delete and re-create the TPUTorchService to try again") if x)
        elif app_status == "DEPLOY_FAILED":
            reason = "DeployFailed"
            text = _failure(app) or "the Serve application failed to deploy"
            if not active.get("rayClusterName") and svc.initializing_timeout_s:
                text += (f" (KubeRay releases the slices once the service is {svc.initializing_timeout_s}s old without "
                         "having been ready: spec.serve.initializingTimeoutSeconds)")
        else:
            reason = kuberay_ready.get("reason") or "Failed"
            text = app_message or kuberay_ready.get("message") or "the service failed"
        conditions.append(condition(FAILED, True, reason, text, generation))

    if phase == "Ready":
        if slices_wanted == 0:
            message = scaled_to_zero_message(svc, ready)
        elif ready_replicas == 0 and svc.min_replicas == 0:
            message = (f"waking from zero: a {s.generation.name} {s.topology} slice is starting for {svc.model_name}; "
                       f"requests wait until it serves ({_first_request_wait()})")
            if slice_ready["status"] != "True" and slice_ready["reason"] != "WaitingForHosts":
                message += f"; {slice_ready['message']}"
        else:
            message = f"serving {svc.model_name} on {ready_replicas} replica(s) of a {s.generation.name} {s.topology} slice"
            if scaling_up:
                message += f"; {scaling_up}"
        if spec_applied is not None and not spec_applied.applied:
            message += f"; the last edit is not applied: {spec_applied.message}"
    elif phase in ("Degraded", "Recovering"):
        message = (f"{svc.model_name} is not answering on every replica: " if phase == "Degraded"
                   else f"Serve is replacing a lost replica of {svc.model_name}: ") + ready_cond["message"]
    elif phase == "Updating":
        pending_app = _application(pending)
        if pending_app.get("status") == "DEPLOY_FAILED":
            message = f"the new version failed to deploy, the old one still serves: {pending_app.get('message', '')}".rstrip(": ")
        elif spec_applied is not None and spec_applied.reason in (appl.UNSCHEDULABLE, appl.WAITING_FOR_SERVE_RELOAD):
            message = f"applying the new spec; the service keeps serving meanwhile: {spec_applied.message}"
        else:
            message = "applying the new spec; the service keeps serving meanwhile (KubeRay upgrades it)"
    elif phase == "Failed":
        message = conditions[-1]["message"]
    elif rayservice is None:
        message = conditions[1]["message"]
    elif phase in QUEUE_PHASES:
        message = queue_message(svc, queue)
    elif phase == "Deploying":
        message = f"deploying {svc.model_name}" + (f": {app_status}" if app_status else "") + (f" {app_message}" if app_message else "")
        if ready_cond["reason"] == net.DASHBOARD_UNREACHABLE:
            message += f"; {ready_cond['message']}"
        if slice_ready["status"] != "True" and slice_ready["reason"] != "WaitingForHosts":
            message += f"; {slice_ready['message']}"
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
        **queue_fields(svc, queue),
    }
    if spec_applied is not None and spec_applied.record:
        status[appl.APPLIED_FIELD] = spec_applied.record
    optional = {
        "rayClusterName": cluster_name,
        "serviceStatus": rs_status.get("serviceStatus"),
        "applicationStatus": app_status,
        "applicationMessage": app_message,
    }
    status.update({k: v for k, v in optional.items() if v})
    return status


