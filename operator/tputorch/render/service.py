"""ServiceSpec -> KubeRay RayService (templates/rayservice.json.j2), and the patches that bring a
live RayService (and its RayCluster's worker bounds) to it: its annotations, its initializing
timeout under Kueue, its serveService, its spec hash."""

from __future__ import annotations

import math

import yaml

from .. import timestamps
from ..api.network import ServeService
from ..api.spec import ServiceSpec
from . import output
from .cluster import SERVICE_HEAD_PORTS, cluster_context
from .env import serving_env
from .names import (INITIALIZING_TIMEOUT_ANNOTATION, KUEUE_ELASTIC_JOB_ANNOTATION, SPEC_HASH_ANNOTATION, object_labels,
                    pod_labels)
from .serveconfig import head_num_cpus, serve_config, tpu_host_ray_resources

def rayservice_annotations(svc: ServiceSpec) -> dict[str, str]:
    """The RayService's annotations other than our spec hash. A queued service is created without
    the initializing timeout: admitted_timeout_patch gives it one once Kueue admits it. A queued
    autoscaled one is Kueue's elastic job (Kueue 0.19.1's RayService webhook refuses Ray's
    autoscaler on a queued RayService without it); a queued fixed-count one is not (its rendering
    stays as it was)."""
    if svc.queue_name:
        return {KUEUE_ELASTIC_JOB_ANNOTATION: "true"} if svc.autoscaling else {}
    if not svc.initializing_timeout_s:
        return {}
    return {INITIALIZING_TIMEOUT_ANNOTATION: f"{svc.initializing_timeout_s}s"}


def admitted_timeout_patch(svc: ServiceSpec, observed: dict, admission) -> dict | None:
    """The merge patch that gives a queued RayService (``svc.queue_name``) the initializing
    timeout it should have now, or None when it has it. ``admission`` is its kueue.Admission
    (None: Kueue does not manage it, so nothing holds it back).

    KubeRay 1.6.1+ counts the timeout from its Ready condition's lastTransitionTime with reason
    Initializing, which it sets in its first reconcile (at creation) and checks every reconcile,
    suspended or not (rayservice_controller.go markFailedOnInitializingTimeout): a service that
    waited in Kueue's queue longer than the timeout would be failed in the queue, terminally. So
    a queued service has no timeout while Kueue holds it, and once admitted the time it waited
    (admission - that lastTransitionTime) plus spec.serve.initializingTimeoutSeconds."""
    if not svc.queue_name or not svc.initializing_timeout_s:
        return None
    have = (((observed.get("metadata") or {}).get("annotations")) or {}).get(INITIALIZING_TIMEOUT_ANNOTATION)
    st = observed.get("status") or {}
    ready = next((c for c in st.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Ready"), {})
    admitted_at = timestamps.seconds(admission.admitted_at) if admission is not None else None
    if admission is None:
        want = f"{svc.initializing_timeout_s}s"
    elif not admission.admitted:
        want = None  # held back by Kueue (queued, or preempted before it was ever ready)
    elif ready.get("reason") not in (None, "Initializing") or admitted_at is None:
        return None  # it was ready once (KubeRay times out only an initializing service), or unknown
    else:
        since = timestamps.seconds(ready.get("lastTransitionTime"))  # None: no wait known, count none
        waited = 0 if since is None else max(0, math.ceil(admitted_at - since))
        want = f"{waited + svc.initializing_timeout_s}s"
    if have == want:
        return None
    return {"metadata": {"annotations": {INITIALIZING_TIMEOUT_ANNOTATION: want}}}


def rayservice_hash(obj: dict) -> str:
    """The hash a RayService carries: its spec and the annotations we write besides the hash."""
    annotations = {k: v for k, v in ((obj.get("metadata") or {}).get("annotations") or {}).items()
                   if k != SPEC_HASH_ANNOTATION}
    return output.spec_hash({"annotations": annotations, "spec": obj.get("spec") or {}})


def serve_service(svc: ServiceSpec) -> dict | None:
    """The RayService's serveService (KubeRay's Service <name>-serve-svc in front of the Serve port)
    from spec.exposure.serveService; None for the default ClusterIP, which KubeRay makes unasked.
    KubeRay sets the name, selector, labels and serve port itself; the ports and their node ports stay
    KubeRay's at every cluster switch, as does the load balancer's address."""
    wanted = svc.exposure.serve_service
    if wanted == ServeService():
        return None
    spec = {"type": wanted.type}
    if wanted.source_ranges:
        spec["loadBalancerSourceRanges"] = list(wanted.source_ranges)
    metadata = {"labels": pod_labels(svc)}
    if wanted.annotations:
        metadata["annotations"] = dict(wanted.annotations)
    return {"metadata": metadata, "spec": spec}


def rayservice(svc: ServiceSpec) -> dict:
    """The RayService the operator creates for ``svc`` (without ownerReferences, added on create).
    Rendered anew at every call: the controller keeps one per version of a spec (controller/specs.py)."""
    obj = output.loaded(output.template("rayservice.json.j2").render({
        "name": svc.name,
        "namespace": svc.namespace,
        "rayservice_labels": object_labels(svc),
        "annotations": rayservice_annotations(svc),
        "upgrade_strategy": svc.upgrade_strategy,
        "serve_service": serve_service(svc),
        "cluster_deletion_delay_s": svc.cluster_deletion_delay_s,
        "serve_config_v2": yaml.safe_dump(serve_config(svc), sort_keys=False, default_flow_style=False),
        # Autoscaling always on: KubeRay's cluster hash leaves out replicas/min/max but not
        # enableInTreeAutoscaling, so a replicas edit from {1,1} to {1,3} would otherwise start a
        # whole second cluster (a second slice) under the NewCluster upgrade.
        # Under Kueue only when autoscaled: a queued fixed-count service renders as before Kueue's
        # elastic jobs (its RayService webhook refuses the autoscaler without the elastic-job
        # annotation, and the spec refuses a change between the two, which Kueue would refuse).
        "cluster": {**cluster_context(svc, serving_env(svc), SERVICE_HEAD_PORTS, svc.min_replicas, svc.max_replicas,
                                      autoscaling=svc.autoscaling or not svc.queue_name,
                                      head_start_params={"num-cpus": head_num_cpus(svc)},
                                      idle_timeout_s=svc.idle_timeout_s),
                    "worker_ray_resources": tpu_host_ray_resources(svc)},
    }), "RayService")
    obj["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = rayservice_hash(obj)
    return obj


def rayservice_spec_hash(svc: ServiceSpec) -> str:
    """The spec hash the RayService ``svc`` renders carries: a live one is up to date when it has it."""
    return rayservice(svc)["metadata"]["annotations"][SPEC_HASH_ANNOTATION]


def _replacing(observed: object, desired: object) -> object:
    """Merge patch that makes ``observed`` equal ``desired``: desired whole, and null for every
    key (at any depth of nested objects) that observed has and desired does not."""
    if not isinstance(desired, dict) or not isinstance(observed, dict):
        return desired
    patch = {k: _replacing(observed.get(k), v) for k, v in desired.items()}
    patch.update({k: None for k in observed if k not in desired})
    return patch


# Keys of the head's pod spec the cluster template writes only when set (the worker group is in a
# list, which a merge patch replaces whole).
_OPTIONAL_HEAD_KEYS = ("serviceAccountName", "nodeSelector", "tolerations", "volumes")


def raycluster_bounds_patch(svc: ServiceSpec, cluster: dict) -> list | None:
    """The JSON patch that gives a RayService's running RayCluster the worker bounds ``svc`` asks
    for, or None when it has them. KubeRay's cluster hash leaves out replicas and min/max
    (kuberay#2331, #4568), so a spec.replicas edit reaches the RayService but never its RayCluster,
    whose bounds the Ray autoscaler reads. Each changed group is tested by name and the cluster by
    uid: a patch never lands on a group list or a cluster other than the one read; and by the
    replicas read (when it has them), so that a patch never overwrites a count the autoscaler wrote
    after the read (the API server refuses the patch, and the controller reads again)."""
    ops = []
    for i, group in enumerate((cluster.get("spec") or {}).get("workerGroupSpecs") or []):
        replicas = group.get("replicas")
        want = {"minReplicas": svc.min_replicas, "maxReplicas": svc.max_replicas,
                "replicas": min(max(replicas if isinstance(replicas, int) else svc.min_replicas, svc.min_replicas),
                                svc.max_replicas)}
        if all(group.get(k) == v for k, v in want.items()):
            continue
        ops.append({"op": "test", "path": f"/spec/workerGroupSpecs/{i}/groupName", "value": group.get("groupName")})
        if "replicas" in group:
            ops.append({"op": "test", "path": f"/spec/workerGroupSpecs/{i}/replicas", "value": replicas})
        ops += [{"op": "add", "path": f"/spec/workerGroupSpecs/{i}/{k}", "value": v} for k, v in want.items()]
    if not ops:
        return None
    return [{"op": "test", "path": "/metadata/uid", "value": (cluster.get("metadata") or {}).get("uid")}, *ops]


def rayservice_patch(svc: ServiceSpec, observed: dict, desired: dict | None = None) -> dict | None:
    """The merge patch that brings an observed RayService to ``desired`` (its metadata.annotations
    and spec; by default what ``svc`` renders), or None when it already is: its spec-hash
    annotation is the desired one and, when its spec is given, that spec still holds every value
    desired (an edit behind our back is put back). KubeRay then upgrades the service. Under the
    upgrade rule (render/stamp.py) ``desired`` is the RayService's own stamped rendering unless the
    spec changed.

    ``observed`` needs only metadata.annotations; its spec, when given, lets the patch also remove
    keys that no longer render. Optional keys of ours are nulled either way."""
    desired = desired or rayservice(svc)
    want = desired["metadata"]["annotations"].get(SPEC_HASH_ANNOTATION)
    have = ((observed.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
    if have == want and not observed.get("spec"):
        return None
    annotations = {**desired["metadata"]["annotations"]}
    if svc.queue_name:  # a queued service's timeout is admitted_timeout_patch's
        annotations.pop(INITIALIZING_TIMEOUT_ANNOTATION, None)
    else:
        annotations.setdefault(INITIALIZING_TIMEOUT_ANNOTATION, None)
    spec = _replacing(observed.get("spec") or {}, desired["spec"])
    if svc.max_replicas > svc.min_replicas:
        # Autoscaled: keep the slice count the autoscaler reached (within the new bounds) rather
        # than reset it to min with every edit.
        observed_groups = ((observed.get("spec") or {}).get("rayClusterConfig") or {}).get("workerGroupSpecs") or []
        for group, seen in zip(spec["rayClusterConfig"]["workerGroupSpecs"], observed_groups):
            if isinstance(seen.get("replicas"), int):
                group["replicas"] = min(max(seen["replicas"], svc.min_replicas), svc.max_replicas)
    # rayClusterConfig.suspend is Kueue's (its RayService integration holds a queued service there):
    # a patch that nulled it would start a service Kueue has not admitted.
    spec["rayClusterConfig"].pop("suspend", None)
    # spec.serve.clusterDeletionDelaySeconds unset: KubeRay's own 60 s again, also when observed has no spec.
    spec.setdefault("rayClusterDeletionDelaySeconds", None)
    head = spec["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    for key in _OPTIONAL_HEAD_KEYS:
        head.setdefault(key, None)
    if have == want and _holds(observed["spec"], spec):
        return None
    return {"metadata": {"annotations": annotations}, "spec": spec}


def _holds(observed: object, patch: object) -> bool:
    """``observed`` already has every value the merge patch sets. Keys the patch removes (null) or
    does not name are not looked at: KubeRay's and the API server's defaults are indistinguishable
    from an addition by hand, and correcting them would patch for ever."""
    if isinstance(patch, dict):
        if not isinstance(observed, dict):
            return all(v is None for v in patch.values())
        return all(v is None or _holds(observed.get(k), v) for k, v in patch.items())
    if isinstance(patch, list):
        return isinstance(observed, list) and len(observed) == len(patch) and all(map(_holds, observed, patch))
    return observed == patch
