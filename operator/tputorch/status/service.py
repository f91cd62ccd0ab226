"""Observed RayService (+ its pods) -> TPUTorchService status, and the endpoint it serves.

The derivation runs in stages, each reading only what the ones before it produced, so that a
wrong status leads to one place: what is observed (observe_service: which RayCluster serves, its
hosts and slice replicas, the Serve application, whether KubeRay runs the current spec), then the
conditions (SliceReady: slice_state; Ready: ready_condition; SpecApplied: status/applied.py), then
the phase (service_phase), then the Failed condition the phase calls for (failed_condition), then
the message (service_message). The conditions every object starts with are status/leading.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from ..render.cluster import worker_node_selector
from ..render.names import SERVE_APP, SERVE_PORT, SPEC_HASH_ANNOTATION
from ..render.serveconfig import SCALE_FROM_ZERO_TIMEOUT_S
from ..api.phases import FAILED, QUEUE_PHASES, RAYSERVICE_CREATED, READY, SLICE_READY, SPEC_APPLIED
from ..api.spec import ServiceSpec
from .conditions import condition, condition_of, queue_fields, queue_message, queue_phase, stamp
from . import applied as appl
from . import network as net, slices, storage_access
from .kueue import Admission
from .leading import leading_conditions
from .pods import (
    CLUSTER_LABEL, ROLE_LABEL, container_problem, labels_of, no_node_pool, quota_problem, ready_hosts, ready_slices,
    running, scheduling_problem, tpu_webhook_missing, wanted_hosts,
)

# Ray Serve LLM's build_openai_app names the deployment that runs the engine LLMServer:<model id>
# (the others route requests: OpenAiIngress, LLMRouter).
LLM_DEPLOYMENT_PREFIX = "LLMServer"

SCALED_TO_ZERO = "ScaledToZero"


def _first_request_wait() -> str:
    return (f"Serve LLM answers a request 408 after {SCALE_FROM_ZERO_TIMEOUT_S} s: the slice's provisioning, "
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
    return f"http://{svc.name}-serve-svc.{svc.namespace}.svc.cluster.local:{SERVE_PORT}/v1"


def _application(service_status: dict) -> dict:
    return ((service_status or {}).get("applicationStatuses") or {}).get(SERVE_APP) or {}


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
    last = condition_of(previous, READY)
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


# --- what is observed -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceObserved:
    """What the RayService and its pods say now, before any judgement of them."""

    exists: bool  # the RayService exists
    rs_status: dict  # its status ({} before KubeRay writes one)
    active: dict  # activeServiceStatus: the serving RayCluster's, once KubeRay promoted one
    pending: dict  # pendingServiceStatus: the RayCluster being prepared (the first one, before its promotion)
    cluster_name: str | None  # the RayCluster that serves (the pending one before the first promotion)
    new_cluster_pending: bool  # an upgrade: a new RayCluster is prepared beside the serving one
    pending_problem: str | None  # then, why the new cluster's hosts cannot start (the upgrade waits on them)
    # The serving cluster's hosts (its pods; KubeRay's copy of its status where they cannot be read):
    ready: int  # TPU hosts running
    ready_replicas: int  # slice replicas whose every host runs
    replicas: int  # slice replicas wanted now: Ray's autoscaler's count, within spec.replicas
    slices_wanted: int  # slice replicas that must be up to serve (0: scaled to zero)
    head_runs: bool  # the head's pod runs (its Serve proxy takes the next request)
    # Why its hosts cannot start, when they cannot:
    no_webhook: tuple[str, str] | None  # created without what the GKE Ray TPU webhook sets
    no_pool: tuple[str, str] | None  # no node pool has the slice's node labels
    unschedulable: str | None  # the scheduler's reason
    stuck: tuple[str, str] | None  # a quota, an image or a crash loop
    up_to_date: bool  # KubeRay has seen the current spec (its hash and generation)
    app: dict  # the Serve application: the serving cluster's, else the pending one's
    kuberay_ready: dict  # KubeRay's own Ready condition ({} before it reports one)

    @property
    def app_status(self) -> str | None:
        return self.app.get("status")

    @property
    def app_message(self) -> str:
        return self.app.get("message") or ""


def _serving_cluster_pods(pods: list[dict], cluster_name: str | None) -> list[dict]:
    """During an upgrade the pending cluster's pods are there too: the serving cluster's count
    (a pod without the cluster label among them); all pods while no cluster is named or none matches."""
    if not cluster_name:
        return pods
    return [p for p in pods if labels_of(p).get(CLUSTER_LABEL) in (None, cluster_name)] or pods


def _pending_cluster_problem(svc: ServiceSpec, pods: list[dict], pending: dict) -> str | None:
    """Why the pending cluster's hosts cannot start: no node pool, unschedulable, a quota, an image
    or a crash loop."""
    new = [p for p in pods if labels_of(p).get(CLUSTER_LABEL) == pending["rayClusterName"]]
    held = no_node_pool(new, worker_node_selector(svc))
    return ((held[1] if held else None) or scheduling_problem(new)
            or (quota_problem(pending.get("rayClusterStatus")) or container_problem(new) or (None, None))[1])


def _runs_current_spec(rayservice: dict | None, rs_status: dict, desired_hash: str) -> bool:
    """Our edits reach the RayService by its spec hash; until KubeRay has seen the new generation
    (and the hash is the desired one) the service is updating, not ready."""
    meta = (rayservice or {}).get("metadata") or {}
    seen, wanted = rs_status.get("observedGeneration"), meta.get("generation")
    return ((meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION) == desired_hash
            and (seen is None or wanted is None or seen >= wanted))


def observe_service(svc: ServiceSpec, rayservice: dict | None, pods: Iterable[dict], pods_read: bool,
                    desired_hash: str) -> ServiceObserved:
    """Which RayCluster serves, its hosts and slice replicas (up, wanted, and why they cannot start),
    the Serve application and KubeRay's Ready, and whether the RayService runs the current spec."""
    s = svc.slice
    rs_status = (rayservice or {}).get("status") or {}
    active = rs_status.get("activeServiceStatus") or {}
    pending = rs_status.get("pendingServiceStatus") or {}
    cluster_name = active.get("rayClusterName") or pending.get("rayClusterName")
    new_cluster_pending = bool(active.get("rayClusterName") and pending.get("rayClusterName"))
    every_pod = list(pods)
    serving = _serving_cluster_pods(every_pod, cluster_name)
    cluster_status = active.get("rayClusterStatus") or pending.get("rayClusterStatus") or {}
    # A RayService worker's readiness probe includes the Serve proxy, which runs only on nodes with
    # a Serve replica: a TPU host running only vLLM workers stays NotReady by design (KubeRay 1.5
    # pod builder). A host counts once its pod runs.
    ready = ready_hosts(serving, cluster_status, up=running)
    desired_hosts = wanted_hosts(serving, cluster_status, pods_read=pods_read)
    replicas = max(svc.min_replicas, min(desired_hosts // s.hosts, svc.max_replicas))
    return ServiceObserved(
        exists=rayservice is not None, rs_status=rs_status, active=active, pending=pending,
        cluster_name=cluster_name, new_cluster_pending=new_cluster_pending,
        pending_problem=_pending_cluster_problem(svc, every_pod, pending) if new_cluster_pending else None,
        ready=ready,
        ready_replicas=ready_slices(serving, s.hosts, ready, up=running), replicas=replicas,
        # Scale to zero: no slice is wanted until Serve asks for a replica, then that one is. With
        # none wanted, the head alone must run (its Serve proxy takes the next request).
        slices_wanted=svc.min_replicas or min(replicas, 1),
        head_runs=any(labels_of(p).get(ROLE_LABEL) == "head" and running(p) for p in serving),
        no_webhook=tpu_webhook_missing(serving, s.hosts),
        no_pool=no_node_pool(serving, worker_node_selector(svc)),
        unschedulable=scheduling_problem(serving),
        stuck=quota_problem(cluster_status) or container_problem(serving),
        up_to_date=_runs_current_spec(rayservice, rs_status, desired_hash),
        app=_application(active) or _application(pending),
        kuberay_ready=condition_of(rs_status, "Ready"),
    )


# --- the conditions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SliceState:
    """The SliceReady condition and what the phase and the message read of it."""

    condition: dict
    up: bool  # the slices wanted are up (from KubeRay's count alone when the pods cannot be read)
    held: bool  # not up, and the hosts cannot start (no pool, unschedulable, quota, an image or a crash loop)
    scaling_up: str | None  # serving, and what the further slices Ray's autoscaler asked for wait for


def slice_state(svc: ServiceSpec, seen: ServiceObserved, pods_problem: tuple[str, str] | None,
                generation: int) -> SliceState:
    s = svc.slice
    slices_message = (f"{seen.ready_replicas}/{seen.replicas} slice replica(s) up, "
                      f"{seen.ready}/{seen.replicas * s.hosts} TPU hosts running")
    scaling_up = None
    if seen.no_webhook:
        slice_ready = condition(SLICE_READY, False, seen.no_webhook[0], seen.no_webhook[1], generation)
    elif seen.exists and seen.slices_wanted == 0 and seen.head_runs and not (seen.unschedulable or seen.stuck):
        slice_ready = condition(SLICE_READY, True, SCALED_TO_ZERO, scaled_to_zero_message(svc, seen.ready), generation)
    elif seen.exists and seen.slices_wanted and seen.ready_replicas >= seen.slices_wanted:
        # Serving on what is up; more slices, asked for by Ray's autoscaler, may not be up yet.
        scaling_up = (scaling_up_message(seen.replicas - seen.ready_replicas, seen.no_pool, seen.unschedulable, seen.stuck)
                      if seen.ready_replicas < seen.replicas else None)
        slice_ready = (condition(SLICE_READY, True, SCALING_UP, f"{slices_message}; {scaling_up}", generation)
                       if scaling_up else condition(SLICE_READY, True, "AllHostsReady", slices_message, generation))
    elif seen.no_pool:
        slice_ready = condition(SLICE_READY, False, seen.no_pool[0], seen.no_pool[1], generation)
    elif seen.unschedulable:
        slice_ready = condition(SLICE_READY, False, "Unschedulable", seen.unschedulable, generation)
    elif seen.stuck:
        slice_ready = condition(SLICE_READY, False, seen.stuck[0], seen.stuck[1], generation)
    else:
        slice_ready = condition(SLICE_READY, False, "WaitingForHosts", slices_message, generation)
    up = slice_ready["status"] == "True"
    held = not up and slice_ready["reason"] != "WaitingForHosts"
    if pods_problem:  # the operator may not read the pods: what they would say is unknown
        slice_ready = condition(SLICE_READY, None, pods_problem[0], pods_problem[1], generation)
    return SliceState(slice_ready, up, held, scaling_up)


def dashboard_unreached(seen: ServiceObserved, slice_: SliceState, network: net.NetworkPolicyState | None) -> str | None:
    """The slice is up and KubeRay reports no Serve application: it may not reach the dashboard to
    PUT the Serve config (it fails the service at the initializing timeout). Why, when the
    NetworkPolicy is the likely cause."""
    return net.dashboard_cause(network) if seen.exists and slice_.up and not seen.app_status else None


def ready_condition(seen: ServiceObserved, previous: dict, unreached: str | None, generation: int) -> dict:
    """Ready: KubeRay's, then Serve's application and its LLM deployment; the dashboard's
    unreachability when that is the likely cause of not being ready."""
    kuberay_ready = seen.kuberay_ready
    if not seen.exists:
        ready = condition(READY, False, "NoRayService", "the RayService does not exist yet", generation)
    elif not kuberay_ready:
        ready = condition(READY, False, "WaitingForKubeRay", "KubeRay has not reported on the RayService yet", generation)
    elif kuberay_ready.get("status") != "True":
        ready = condition(READY, False, kuberay_ready.get("reason") or "Unknown", kuberay_ready.get("message") or "", generation)
    elif not _application(seen.active) and seen.new_cluster_pending:
        ready = _ready_during_upgrade(seen.active["rayClusterName"], previous, generation)
    else:
        serving, reason, why = _serving(_application(seen.active))
        ready = condition(READY, serving, reason, why, generation)
    if unreached and ready["status"] != "True":
        ready = condition(READY, False, net.DASHBOARD_UNREACHABLE,
                          f"the slice is up but no Serve application is reported: {unreached}", generation)
    return ready


def failed_condition(svc: ServiceSpec, seen: ServiceObserved, unreached: str | None, generation: int) -> dict:
    """Failed, for a service whose phase is Failed: the initializing timeout (KubeRay released the
    slices), the Serve application's failure to deploy, or KubeRay's own reason."""
    kuberay_ready = seen.kuberay_ready
    if kuberay_ready.get("reason") == "InitializingTimeout":
        reason = "InitializingTimeout"
        text = "; ".join(x for x in (_failure(seen.app), unreached, kuberay_ready.get("message"), "KubeRay deleted its RayClusters "
                                     "(the slices are released); delete and re-create the TPUTorchService to try again") if x)
    elif seen.app_status == "DEPLOY_FAILED":
        reason = "DeployFailed"
        text = _failure(seen.app) or "the Serve application failed to deploy"
        if not seen.active.get("rayClusterName") and svc.initializing_timeout_s:
            text += (f" (KubeRay releases the slices once the service is {svc.initializing_timeout_s}s old without "
                     "having been ready: spec.serve.initializingTimeoutSeconds)")
    else:
        reason = kuberay_ready.get("reason") or "Failed"
        text = seen.app_message or kuberay_ready.get("message") or "the service failed"
    return condition(FAILED, True, reason, text, generation)


# --- the phase ------------------------------------------------------------------------------------


def _kuberay_phase(seen: ServiceObserved, slice_: SliceState, previous_phase: str | None) -> str:
    """The phase KubeRay's RayService and Serve's application say, before Kueue and SpecApplied are heard."""
    if not seen.exists:
        return "Pending"
    ready = seen.kuberay_ready
    active_app = _application(seen.active)
    pending_app = _application(seen.pending)
    if ready.get("reason") in ("InitializingTimeout", "ValidationFailed") or active_app.get("status") == "DEPLOY_FAILED":
        return "Failed"
    if not seen.active.get("rayClusterName") and pending_app.get("status") == "DEPLOY_FAILED":
        # Before the first promotion KubeRay reports the application under pendingServiceStatus.
        return "Failed"
    if ready.get("status") == "True" or ready.get("reason") == "ZeroServeEndpoints":
        upgrading = condition_of(seen.rs_status, "UpgradeInProgress").get("status") == "True"
        # ZeroServeEndpoints (KubeRay sets it only after Ready): no Serve proxy is left behind
        # <name>-serve-svc, so nothing answers clients whatever Serve says of the application.
        serving = _serving(active_app)[0] and ready.get("reason") != "ZeroServeEndpoints"
        if serving:
            return "Ready" if seen.up_to_date and not upgrading else "Updating"
        if not seen.up_to_date or upgrading:
            return "Updating"
        if active_app.get("status") == "DEPLOYING":
            # Serve is starting replicas: replacing a lost one after Degraded, else an in-place
            # redeploy of an edited serve config.
            return "Recovering" if previous_phase in ("Degraded", "Recovering") else "Updating"
        return "Degraded"
    if slice_.held:
        # Serve deploys as soon as the head is up (the application DEPLOYING), but the slice's
        # hosts cannot start: nothing is deploying onto TPUs until they do.
        return "Pending"
    return "Deploying" if slice_.up or seen.app_status else "Pending"


def service_phase(seen: ServiceObserved, slice_: SliceState, spec_applied: appl.Applied | None,
                  previous_phase: str | None, queue: Admission | None) -> str:
    """KubeRay's phase, then Kueue's (Queued, Preempted), then SpecApplied's: KubeRay's first
    status of an edit is the old config's (see status/applied.py)."""
    phase = queue_phase(_kuberay_phase(seen, slice_, previous_phase), False, queue)
    if phase == "Ready" and spec_applied is not None and spec_applied.reason in appl.IN_PROGRESS:
        phase = "Updating"
    return phase


# --- the message ----------------------------------------------------------------------------------


def _ready_message(svc: ServiceSpec, seen: ServiceObserved, slice_: SliceState, spec_applied: appl.Applied | None) -> str:
    s = svc.slice
    if seen.slices_wanted == 0:
        message = scaled_to_zero_message(svc, seen.ready)
    elif seen.ready_replicas == 0 and svc.min_replicas == 0:
        message = (f"waking from zero: a {s.generation.name} {s.topology} slice is starting for {svc.model_name}; "
                   f"requests wait until it serves ({_first_request_wait()})")
        if slice_.condition["status"] != "True" and slice_.condition["reason"] != "WaitingForHosts":
            message += f"; {slice_.condition['message']}"
    else:
        message = f"serving {svc.model_name} on {seen.ready_replicas} replica(s) of a {s.generation.name} {s.topology} slice"
        if slice_.scaling_up:
            message += f"; {slice_.scaling_up}"
    if spec_applied is not None and not spec_applied.applied:
        message += f"; the last edit is not applied: {spec_applied.message}"
    return message


def _updating_message(seen: ServiceObserved, spec_applied: appl.Applied | None) -> str:
    pending_app = _application(seen.pending)
    if pending_app.get("status") == "DEPLOY_FAILED":
        return f"the new version failed to deploy, the old one still serves: {pending_app.get('message', '')}".rstrip(": ")
    if spec_applied is not None and spec_applied.reason in (appl.UNSCHEDULABLE, appl.WAITING_FOR_SERVE_RELOAD):
        return f"applying the new spec; the service keeps serving meanwhile: {spec_applied.message}"
    return "applying the new spec; the service keeps serving meanwhile (KubeRay upgrades it)"


def _deploying_message(svc: ServiceSpec, seen: ServiceObserved, slice_ready: dict, ready: dict) -> str:
    message = (f"deploying {svc.model_name}" + (f": {seen.app_status}" if seen.app_status else "")
               + (f" {seen.app_message}" if seen.app_message else ""))
    if ready["reason"] == net.DASHBOARD_UNREACHABLE:
        message += f"; {ready['message']}"
    if slice_ready["status"] != "True" and slice_ready["reason"] != "WaitingForHosts":
        message += f"; {slice_ready['message']}"
    return message


def service_message(svc: ServiceSpec, phase: str, seen: ServiceObserved, slice_: SliceState, created: dict,
                    ready: dict, spec_applied: appl.Applied | None, failed: dict | None, queue: Admission | None) -> str:
    """The status message: what the phase means for this service now, and what it waits for."""
    if phase == "Ready":
        return _ready_message(svc, seen, slice_, spec_applied)
    if phase in ("Degraded", "Recovering"):
        return (f"{svc.model_name} is not answering on every replica: " if phase == "Degraded"
                else f"Serve is replacing a lost replica of {svc.model_name}: ") + ready["message"]
    if phase == "Updating":
        return _updating_message(seen, spec_applied)
    if failed is not None:
        return failed["message"]
    if not seen.exists:
        return created["message"]
    if phase in QUEUE_PHASES:
        return queue_message(svc, queue)
    if phase == "Deploying":
        return _deploying_message(svc, seen, slice_.condition, ready)
    return slice_.condition["message"]


# --- the whole status -----------------------------------------------------------------------------


def _shape(svc: ServiceSpec) -> str:
    s = svc.slice
    return (f"{s.generation.name} {s.topology} slice per replica: {s.hosts} host(s) x {s.chips_per_host} chips, "
            f"tensor parallel {svc.tensor_parallel_size} x pipeline parallel {svc.pipeline_parallel_size}")


def derive_service(
    svc: ServiceSpec,
    generation: int,
    rayservice: dict | None,
    pods: Iterable[dict],
    previous: dict,
    now: str,
    problem: tuple[str, str] | None = None,
    queue: Admission | None = None,
    pods_problem: tuple[str, str] | None = None,
    network: net.NetworkPolicyState | None = None,
    *,
    desired_hash: str,
    slice_check: slices.SliceCheck | None = None,
) -> dict:
    """The whole status of a valid TPUTorchService from its RayService (KubeRay v1.5's status:
    conditions Ready/UpgradeInProgress, serviceStatus, active/pendingServiceStatus with the Serve
    application's status) and its pods; ``problem``, ``queue`` and ``network`` as for derive.
    ``desired_hash`` is the spec hash of the RayService ``svc`` renders (the reconcile renders it
    once): the live one is up to date only when it carries that hash. ``slice_check``: the last
    read of Ray's placement groups (controller/slicereads.py), for ReplicasOnWholeSlices."""
    seen = observe_service(svc, rayservice, pods, pods_problem is None, desired_hash)

    denied = storage_access.said(svc, [("the Serve application's message", storage_access.find(seen.app_message))])
    conditions = leading_conditions(_shape(svc), RAYSERVICE_CREATED, "RayService", svc.name, rayservice, problem,
                                    False, queue, network, generation, svc.identity_warning, denied)
    slice_ = slice_state(svc, seen, pods_problem, generation)
    unreached = dashboard_unreached(seen, slice_, network)
    ready = ready_condition(seen, previous, unreached, generation)
    whole = slices.whole_slices_condition(svc.slice.multi_host, slice_check, previous, generation,
                                          scaled_to_zero=seen.slices_wanted == 0)
    conditions += [slice_.condition, *([whole] if whole else []), ready]
    spec_applied = None
    if rayservice is not None:
        spec_applied = appl.applied(rayservice, previous.get(appl.APPLIED_FIELD), svc.upgrade_strategy,
                                    seen.pending_problem, now)
        conditions.append(condition(SPEC_APPLIED, spec_applied.applied, spec_applied.reason, spec_applied.message, generation))

    phase = service_phase(seen, slice_, spec_applied, previous.get("phase"), queue)
    failed = failed_condition(svc, seen, unreached, generation) if phase == "Failed" else None
    if failed is not None:
        conditions.append(failed)

    message = service_message(svc, phase, seen, slice_, conditions[1], ready, spec_applied, failed, queue)
    return _service_status(svc, seen, phase, message, stamp(conditions, previous, now), spec_applied, generation, queue)


def _service_status(svc: ServiceSpec, seen: ServiceObserved, phase: str, message: str, conditions: list[dict],
                    spec_applied: appl.Applied | None, generation: int, queue: Admission | None) -> dict:
    s = svc.slice
    status = {
        "phase": phase,
        "message": message,
        "observedGeneration": generation,
        "conditions": conditions,
        "replicas": seen.replicas,
        "readyReplicas": seen.ready_replicas,
        "replicasReady": f"{seen.ready_replicas}/{seen.replicas}",
        "hosts": seen.replicas * s.hosts,
        "readyHosts": seen.ready,
        "model": svc.model_name,
        "endpoint": endpoint(svc),
        "rayServiceName": svc.name,
        **queue_fields(svc, queue),
    }
    if spec_applied is not None and spec_applied.record:
        status[appl.APPLIED_FIELD] = spec_applied.record
    optional = {
        "rayClusterName": seen.cluster_name,
        "serviceStatus": seen.rs_status.get("serviceStatus"),
        "applicationStatus": seen.app_status,
        "applicationMessage": seen.app_message,
    }
    status.update({k: v for k, v in optional.items() if v})
    return status
