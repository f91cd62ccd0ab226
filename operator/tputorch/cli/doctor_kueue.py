"""`tputorch doctor`'s Kueue checks: its Ray integrations and the namespace's LocalQueues.
"""

from __future__ import annotations

from ..api import groups
from ..status import kueue
from .doctor_base import DOC_KUEUE, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown


KUEUE_INTEGRATIONS = ("ray.io/rayjob", "ray.io/rayservice")
KUEUE_LOCALQUEUE_CRD = "localqueues.kueue.x-k8s.io"


def kueue_frameworks(config_map: dict | None | Unread) -> list[str] | None | Unread:
    """integrations.frameworks of Kueue's manager config (ConfigMap kueue-manager-config)."""
    import yaml

    if isinstance(config_map, Unread) or config_map is None:
        return config_map
    for text in (config_map.get("data") or {}).values():
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and "integrations" in doc:
            return list((doc.get("integrations") or {}).get("frameworks") or [])
    return None


def check_kueue(crd_installed: bool | Unread, frameworks: list[str] | None | Unread,
                local_queues: list[dict] | Unread, namespace: str,
                workload_crd: dict | None | Unread = None) -> list[Result]:
    if isinstance(crd_installed, Unread):
        return [_unknown("kueue", "Kueue's CRDs", crd_installed)]
    if not crd_installed:
        return [Result("kueue", OK, "Kueue not installed (optional: only jobs with spec.queueName need it)")]
    results = []
    if isinstance(frameworks, Unread):
        results.append(_unknown("kueue-integrations", "Kueue's config (kueue-system/kueue-manager-config)", frameworks))
    elif frameworks is None:
        results.append(Result("kueue-integrations", UNKNOWN, "Kueue installed; its config map "
                              "(kueue-system/kueue-manager-config) not found: cannot tell its integrations"))
    else:
        missing = [f for f in KUEUE_INTEGRATIONS if f not in frameworks]
        if missing:
            results.append(Result("kueue-integrations", FAIL, f"Kueue's integrations lack {', '.join(missing)}: "
                                  "queued children of that kind are never admitted",
                                  "add them to integrations.frameworks in kueue-system/kueue-manager-config and "
                                  "restart kueue-controller-manager", DOC_KUEUE))
        else:
            results.append(Result("kueue-integrations", OK, f"Kueue integrations {', '.join(KUEUE_INTEGRATIONS)} enabled"))
    results += _check_kueue_podsets(workload_crd)
    if isinstance(local_queues, Unread):
        results.append(_unknown("kueue-localqueues", f"LocalQueues of {namespace}", local_queues))
    elif local_queues:
        names = ", ".join(q["metadata"]["name"] for q in local_queues)
        results.append(Result("kueue-localqueues", OK, f"LocalQueues in {namespace}: {names}"))
    else:
        results.append(Result("kueue-localqueues", WARN, f"no LocalQueue in namespace {namespace}: a job with "
                              "spec.queueName waits here forever", doc=DOC_KUEUE))
    return results


def _check_kueue_podsets(workload_crd: dict | None | Unread) -> list[Result]:
    """How many spec.groups a queued job may have under the installed Kueue (its Workload CRD's cap
    on pod sets; the operator reads the same: api/groups.py)."""
    if isinstance(workload_crd, Unread):
        return [_unknown("kueue-podsets", f"Kueue's Workload CRD {kueue.WORKLOAD_CRD}", workload_crd)]
    if workload_crd is None:
        return []
    cap = kueue.podsets_max_items(workload_crd)
    if cap is None:
        return [Result("kueue-podsets", UNKNOWN, f"Kueue's Workload CRD states no spec.podSets maxItems: the operator "
                       f"takes the smallest known, {groups.KUEUE_SAFE_PODSETS} pod sets "
                       f"({groups.max_groups_under_kueue(groups.KUEUE_SAFE_PODSETS)} spec.groups per queued job)")]
    return [Result("kueue-podsets", OK, f"Kueue's Workloads take at most {cap} pod sets: a queued TPUTorchJob may have "
                   f"at most {groups.max_groups_under_kueue(cap)} spec.groups")]


def kueue_rayservice_enabled(crd_installed, frameworks) -> bool | None:
    if crd_installed is not True or not isinstance(frameworks, list):
        return None
    return "ray.io/rayservice" in frameworks
