"""`tputorch doctor`'s KubeRay checks: its CRDs serve every field the operator writes, versions
known to break something, the Ray TPU webhook's configurations.
"""

from __future__ import annotations

from typing import Any

from ...api import crd, spec
from ... import render, tested_versions
from ...render.raytoken import RAY_AUTH, with_ray_token_secret
from .result import (DOC_COMPAT_KUBERAY, DOC_WEBHOOK, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown,
                     image_version)


# KubeRay versions that break something the operator relies on (docs/compatibility.md).
# version -> (what breaks, what to do); with Kueue's RayService integration on, a fail, else a warning
KNOWN_BAD_KUBERAY = {
    "1.6.0": ("a RayService created suspended (queued by Kueue) never starts (kuberay#4686, fixed in 1.6.1)",
              "upgrade KubeRay to 1.6.1 or later"),
    # Run on the local chain (KubeRay 1.7.0 built from its source tag, Kueue 0.19.1): Kueue suspends a
    # RayService through rayClusterConfig.suspend, while 1.7.0 brings RayService spec.suspend of its own.
    "1.7.0": ("a RayService queued by Kueue 0.19.1 is admitted but never starts: its RayCluster stays "
              "suspended, with no head pod (KubeRay: \"found 0 head\"); jobs and unqueued services run",
              "queue only TPUTorchJobs on this KubeRay, or run KubeRay 1.6.2"),
}
# No KubeRay Deployment in the cluster: what GKE's Ray Operator add-on looks like ("GKE installs and
# hosts the KubeRay operator"; Google's own quickstart says to ignore `kubectl ray version`'s "no
# KubeRay operator deployments found in any namespace"). Its version is then nowhere to be read.
KUBERAY_NO_DEPLOYMENT = ("no KubeRay Deployment in the cluster (labels app.kubernetes.io/name=kuberay-operator or "
                         "kuberay); GKE's Ray Operator add-on runs KubeRay outside the cluster and publishes no version")
KUBERAY_CRDS = {"RayJob": "rayjobs.ray.io", "RayCluster": "rayclusters.ray.io", "RayService": "rayservices.ray.io"}


def representative_children() -> dict[str, list[dict]]:
    """RayJob and RayService bodies as the operator writes them, with every optional part it can
    write (extra worker groups with Ray labels, autoscaling, runtime env, storage, the token
    Secret's name, the deletion delay, the serve Service), so each field the operator writes is checked against the cluster's CRDs."""
    base = {"apiVersion": crd.API_VERSION, "metadata": {"name": "doctor", "namespace": "default"}}
    job = {**base, "kind": crd.KIND, "spec": {
        "tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "doctor", "entrypoint": "python -c pass",
        "serviceAccountName": "doctor", "runtimeEnv": {"working_dir": "gs://doctor/x.zip"},
        "ttlSecondsAfterFinished": 60, "activeDeadlineSeconds": 600,
        "volumes": [{"name": "data", "mountPath": "/data", "gcs": {"bucket": "doctor"}}],
        "groups": [{"name": "rollout", "gpu": {"type": "nvidia-l4", "count": 1}, "replicas": 1},
                   {"name": "reward", "cpu": "1", "memory": "1Gi"}]}}
    service = {**base, "kind": crd.SERVICE_KIND, "spec": {
        "tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "doctor",
        "model": {"source": "doctor/model"}, "replicas": {"min": 1, "max": 2},
        "serve": {"clusterDeletionDelaySeconds": 600},
        "exposure": {"serveService": {"type": "LoadBalancer", "annotations": {"doctor": "x"},
                                      "loadBalancerSourceRanges": ["10.0.0.0/8"]}},
        "volumes": [{"name": "data", "mountPath": "/data", "gcs": {"bucket": "doctor"}}]}}
    rayjob = render.render_any(spec.parse_any(job))
    with_ray_token_secret(rayjob, "doctor-ray-token")
    rayservice = render.render_any(spec.parse_any(service))
    rayservice["spec"]["rayClusterConfig"]["authOptions"] = {**RAY_AUTH, "secretName": "doctor-ray-token"}
    return {"RayJob": [rayjob], "RayService": [rayservice]}


def unserved_fields(value: Any, schema: dict, path: str = "") -> list[str]:
    """The paths in `value` that the structural schema does not have (the API server would drop
    them on write, structural pruning), with list indices written as []."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields") \
            or schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-embedded-resource") and not schema.get("properties"):
        return []
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        missing = []
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if path == "" and key in ("apiVersion", "kind", "metadata"):
                continue  # the object's own: every kind has them
            if props is not None and key in props:
                missing += unserved_fields(item, props[key], here)
            elif isinstance(extra, dict):
                missing += unserved_fields(item, extra, here)
            elif extra is True:
                continue
            else:
                missing.append(here)
        return missing
    if isinstance(value, list):
        items = schema.get("items") or {}
        found: list[str] = []
        for item in value:
            for p in unserved_fields(item, items, f"{path}[]"):
                if p not in found:
                    found.append(p)
        return found
    return []


def served_schema(definition: dict, version: str = "v1") -> dict | None:
    for v in (definition.get("spec") or {}).get("versions") or []:
        if v.get("name") == version and v.get("served"):
            return (v.get("schema") or {}).get("openAPIV3Schema")
    return None


def kuberay_version(deployments: list[dict] | Unread) -> str | None:
    """The KubeRay operator's version, from its Deployment's image tag."""
    return None if isinstance(deployments, Unread) else image_version(deployments)


def check_kuberay(installed: dict[str, dict | None | Unread], deployments: list[dict] | Unread,
                  kueue_rayservice: bool | None) -> list[Result]:
    """KubeRay's CRDs, every field the operator writes served by them, and known-bad versions."""
    results = []
    children = representative_children()
    fix_install = ("install KubeRay 1.6.1 or later (GKE: enable the Ray Operator add-on, "
                   "`gcloud container clusters update CLUSTER --update-addons=RayOperator=ENABLED`)")
    for kind, name in KUBERAY_CRDS.items():
        got = installed.get(name)
        check = f"kuberay-crd/{name}"
        if isinstance(got, Unread):
            results.append(_unknown(check, f"KubeRay's {kind} CRD", got))
            continue
        if got is None:
            results.append(Result(check, FAIL, f"KubeRay's {kind} CRD ({name}) is not installed", fix_install,
                                  DOC_COMPAT_KUBERAY))
            continue
        schema = served_schema(got)
        if schema is None:
            results.append(Result(check, FAIL, f"{name} does not serve ray.io/v1", fix_install, DOC_COMPAT_KUBERAY))
            continue
        missing: list[str] = []
        for body in children.get(kind, []):
            missing += [p for p in unserved_fields(body, schema) if p not in missing]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            results.append(Result(check, FAIL, f"{kind} CRD lacks field(s) the operator writes: {shown} "
                                  "(the API server would drop them)",
                                  "upgrade KubeRay's CRDs to 1.6.1 or later (an older KubeRay: its CRDs lack them)",
                                  DOC_COMPAT_KUBERAY, missing))
        elif kind in children:
            results.append(Result(check, OK, f"{kind} CRD serves every field the operator writes"))
        else:
            results.append(Result(check, OK, f"{kind} CRD installed"))
    version = kuberay_version(deployments)
    if isinstance(deployments, Unread):
        results.append(_unknown("kuberay-version", "KubeRay's Deployment", deployments))
    elif version is None:
        why = ("its Deployment's image has no version tag" if deployments else KUBERAY_NO_DEPLOYMENT)
        results.append(Result("kuberay-version", UNKNOWN, f"KubeRay operator's version: cannot tell: {why}; the CRD "
                              f"fields above are what counts (KubeRay {', '.join(KNOWN_BAD_KUBERAY)} not ruled out)"))
    elif version in KNOWN_BAD_KUBERAY:
        status = FAIL if kueue_rayservice else WARN
        what, fix = KNOWN_BAD_KUBERAY[version]
        results.append(Result("kuberay-version", status, f"KubeRay {version}: {what}",
                              f"{fix} (tested: {tested_versions.shown(tested_versions.KUBERAY)})",
                              DOC_COMPAT_KUBERAY))
    elif version not in tested_versions.KUBERAY:
        results.append(Result("kuberay-version", WARN, f"KubeRay {version}: not a version this release was tested "
                              f"with (tested: {tested_versions.shown(tested_versions.KUBERAY)})",
                              "the per-feature table says what each feature needs of KubeRay; or run a tested version",
                              DOC_COMPAT_KUBERAY))
    else:
        results.append(Result("kuberay-version", OK, f"KubeRay {version} (tested)"))
    return results


# ---------------------------------------------------------------- the Ray TPU webhook

def _covers_pods(config: dict) -> bool:
    for hook in config.get("webhooks") or []:
        for rule in hook.get("rules") or []:
            if "pods" in (rule.get("resources") or []) or "*" in (rule.get("resources") or []):
                return True
    return False


def check_tpu_webhook(mutating: list[dict] | Unread, validating: list[dict] | Unread) -> list[Result]:
    """The Ray TPU webhook's configurations: a name with `tpu` in it (GKE's add-on, the
    kuberay-tpu-webhook chart and the local cluster's stand-in all name theirs so)."""
    if isinstance(mutating, Unread):
        return [_unknown("tpu-webhook", "mutating webhook configurations", mutating)]

    def tpu(configs):
        return [c for c in configs if "tpu" in ((c.get("metadata") or {}).get("name") or "").lower()]

    found = [c for c in tpu(mutating) if _covers_pods(c)]
    if not found:
        return [Result("tpu-webhook", FAIL, "no Ray TPU webhook (a mutating webhook configuration for pods with "
                       "`tpu` in its name): multi-host slices get no TPU_WORKER_ID / TPU_WORKER_HOSTNAMES",
                       "enable GKE's Ray Operator add-on (it installs the webhook), or install kuberay-tpu-webhook",
                       DOC_WEBHOOK)]
    names = ", ".join(c["metadata"]["name"] for c in found)
    results = [Result("tpu-webhook", OK, f"Ray TPU webhook: {names}")]
    if isinstance(validating, Unread):
        results.append(_unknown("tpu-webhook-validation", "validating webhook configurations", validating))
    elif not tpu(validating):
        results.append(Result("tpu-webhook-validation", WARN, "no validating TPU webhook: a worker group whose "
                              "numOfHosts does not match its topology is not refused (the operator writes it right)"))
    return results
