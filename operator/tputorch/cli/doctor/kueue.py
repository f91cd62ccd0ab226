"""`tputorch doctor`'s Kueue checks: its version, its Ray integrations and the namespace's LocalQueues.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import tested_versions
from ...api import groups
from ...status import kueue
from .result import (DOC_COMPAT_KUEUE, DOC_KUEUE, DOC_KUEUE_ELASTIC, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown,
                     image_version, parse_version, quantity)


KUEUE_INTEGRATIONS = ("ray.io/rayjob", "ray.io/rayservice")
KUEUE_LOCALQUEUE_CRD = "localqueues.kueue.x-k8s.io"
# Kueue's controller, as its release manifests and its Helm chart (release name kueue) name it:
# the image tag there is the version (Kueue publishes it nowhere else in the cluster).
KUEUE_DEPLOYMENT = ("kueue-system", "kueue-controller-manager")
# Kueue versions that break something a queued job or service relies on (docs/compatibility.md),
# as (first, last) bad version, what breaks, and the fix.
KNOWN_BAD_KUEUE = [
    ((0, 20, 0), (0, 20, 5), "can break the API server's watch cache for Workloads, which the admission of every "
     "queued job and service goes through (kueue#18411, fixed in 0.20.6)", "upgrade Kueue to 0.20.6 or later"),
]


def _manager_config(config_map: dict) -> dict | None:
    """Kueue's Configuration in its manager config map (the first item that reads as one)."""
    import yaml

    for text in (config_map.get("data") or {}).values():
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict) and (str(doc.get("apiVersion", "")).startswith("config.kueue.x-k8s.io/")
                                      or "integrations" in doc or "resources" in doc):
            return doc
    return None


def kueue_frameworks(config_map: dict | None | Unread) -> list[str] | None | Unread:
    """integrations.frameworks of Kueue's manager config (ConfigMap kueue-manager-config)."""
    if isinstance(config_map, Unread) or config_map is None:
        return config_map
    doc = _manager_config(config_map)
    if doc is None or "integrations" not in doc:
        return None
    return list((doc.get("integrations") or {}).get("frameworks") or [])


@dataclass(frozen=True)
class QuotaCheck:
    """Which of a workload's resources Kueue's own configuration leaves out of quota, as Kueue
    0.19.1 applies its `resources` (read in its source):
    - `excludeResourcePrefixes` (config v1beta1 and v1beta2): a resource whose name starts with one of
      them is dropped from the workload's requests (pkg/workload dropExcludedResources,
      strings.HasPrefix), so no ClusterQueue needs to cover it;
    - `quotaCheckStrategy: IgnoreUndeclared` (config v1beta2 only; a v1beta1 config naming it fails
      Kueue's strict decoding): a resource no resource group of the ClusterQueue covers is skipped
      (pkg/scheduler/flavorassigner), behind the QuotaCheckStrategy feature gate, on by default from
      0.19 (beta; off in 0.18). A gate turned off in the config's `featureGates` is honoured; one
      turned off by kueue-controller-manager's --feature-gates flag is not seen here.
    `unread`: the config map could not be read, so whether it leaves anything out is unknown."""
    excluded_prefixes: tuple[str, ...] = ()
    ignore_undeclared: bool = False
    unread: str | None = None

    def excluded(self, resource: str) -> bool:
        return resource.startswith(self.excluded_prefixes)


def kueue_quota_check(config_map: dict | None | Unread) -> QuotaCheck:
    """What kueue-system/kueue-manager-config leaves out of quota (None: no config map, Kueue's
    defaults: every resource is checked)."""
    if isinstance(config_map, Unread):
        return QuotaCheck(unread=config_map.reason)
    doc = _manager_config(config_map) if config_map is not None else None
    if doc is None:
        return QuotaCheck()
    resources = doc.get("resources") or {}
    prefixes = tuple(str(p) for p in resources.get("excludeResourcePrefixes") or [])
    gate = (doc.get("featureGates") or {}).get("QuotaCheckStrategy", True) is not False
    ignore = (gate and doc.get("apiVersion") == "config.kueue.x-k8s.io/v1beta2"
              and resources.get("quotaCheckStrategy") == "IgnoreUndeclared")
    return QuotaCheck(prefixes, ignore)


def check_kueue_version(crd_installed: bool | Unread, deployment: dict | None | Unread) -> list[Result]:
    """Kueue's version from its Deployment (nothing when Kueue is not installed, which check_kueue
    says): a known-bad one fails, one the suite did not run is a warning naming those it did."""
    if crd_installed is not True:
        return []
    where = "/".join(KUEUE_DEPLOYMENT)
    if isinstance(deployment, Unread):
        return [_unknown("kueue-version", f"Kueue's Deployment {where}", deployment)]
    version = image_version([deployment]) if deployment else None
    if version is None:
        why = "its image has no version tag" if deployment else f"no Deployment {where}"
        return [Result("kueue-version", UNKNOWN, f"Kueue's version: cannot tell: {why} (Kueue "
                       f"{', '.join(f'{_dotted(lo)} to {_dotted(hi)}' for lo, hi, _, _ in KNOWN_BAD_KUEUE)} not ruled out)")]
    parsed = parse_version(version)
    for first, last, what, fix in KNOWN_BAD_KUEUE:
        if first <= parsed <= last:
            return [Result("kueue-version", FAIL, f"Kueue {version}: {what}",
                           f"{fix} (tested: {tested_versions.shown(tested_versions.KUEUE)})", DOC_COMPAT_KUEUE)]
    if version not in tested_versions.KUEUE:
        return [Result("kueue-version", WARN, f"Kueue {version}: not a version this release was tested with "
                       f"(tested: {tested_versions.shown(tested_versions.KUEUE)})",
                       "docs/tasks/kueue.md says what the operator needs of Kueue; or run a tested version", DOC_COMPAT_KUEUE)]
    return [Result("kueue-version", OK, f"Kueue {version} (tested)")]


ELASTIC_GATE = "ElasticJobsViaWorkloadSlices"
ELASTIC_DEFAULT_ON = (0, 18)  # the gate's beta, on by default (Kueue pkg/features: alpha, off, from 0.13)


def check_kueue_elastic(crd_installed: bool | Unread, config_map: dict | None | Unread,
                        deployment: dict | None | Unread) -> list[Result]:
    """Whether Kueue admits a queued autoscaled service (Kueue's elastic job, kueue.x-k8s.io/elastic-job
    on the RayService): only with its ElasticJobsViaWorkloadSlices gate on, else its RayService
    webhook refuses the RayService. Said only when the gate is off in the manager config's
    featureGates, or left at its default on a Kueue before 0.18; a gate set by
    kueue-controller-manager's --feature-gates flag is not seen here."""
    if crd_installed is not True or isinstance(config_map, Unread):
        return []
    doc = _manager_config(config_map) if config_map is not None else None
    gate = ((doc or {}).get("featureGates") or {}).get(ELASTIC_GATE)
    version = image_version([deployment]) if isinstance(deployment, dict) else None
    old = version is not None and parse_version(version)[:2] < ELASTIC_DEFAULT_ON
    if gate is False or (gate is None and old):
        why = f"{ELASTIC_GATE} is off in its config" if gate is False else f"Kueue {version} leaves {ELASTIC_GATE} off"
        return [Result("kueue-elastic", WARN, f"Kueue: {why}: it refuses a queued TPUTorchService with "
                       "replicas.min < replicas.max (its RayService webhook admits Ray's autoscaler only on an elastic job); "
                       "queued services with a fixed count are unaffected",
                       f"set featureGates.{ELASTIC_GATE}: true in kueue-system/kueue-manager-config (Kueue 0.13 or "
                       "later) and restart kueue-controller-manager, or give queued services replicas.min == replicas.max",
                       DOC_KUEUE_ELASTIC)]
    return []


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


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


# ---------------------------------------------------------------- --for FILE: can Kueue ever admit it

def requested_resources(child: dict) -> set[str]:
    """The resources any pod of a rendered RayJob / RayService asks for (requests, else limits, as
    Kueue counts them): a ClusterQueue must cover each, or Kueue admits nothing of it."""
    spec = child.get("spec") or {}
    cluster = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or {}
    groups = [cluster.get("headGroupSpec") or {}] + list(cluster.get("workerGroupSpecs") or [])
    names = set()
    for group in groups:
        for container in ((group.get("template") or {}).get("spec") or {}).get("containers") or []:
            resources = container.get("resources") or {}
            for name, value in {**(resources.get("limits") or {}), **(resources.get("requests") or {})}.items():
                if str(value) not in ("0", "0m"):
                    names.add(name)
    return names


def _flavor_conflict(flavor: dict | None, selector: dict[str, str]) -> str | None:
    """Why Kueue would not give this ResourceFlavor to the slice's pods (None: it may): the
    flavor's nodeLabels must agree with the pods' nodeSelector on every key both name."""
    if flavor is None:
        return "no such ResourceFlavor"
    labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
    clash = [f"{k}={labels[k]}" for k in sorted(labels) if k in selector and selector[k] != labels[k]]
    return f"its nodeLabels {', '.join(clash)} are not the slice's" if clash else None


def queue_problems(queue: str, namespace: str, local_queues: list[dict], cluster_queues: list[dict] | Unread | None,
                   flavors: list[dict] | Unread | None, resources: set[str], selector: dict[str, str],
                   tpu_resource: str, chips: float,
                   quota_check: QuotaCheck = QuotaCheck()) -> tuple[list[str], list[str]]:
    """(why Kueue can never admit the job or service, what could not be read) for one queued by
    `queue` in `namespace`: its LocalQueue, that queue's ClusterQueue (active, covering every
    resource the pods ask for), and a ResourceFlavor of it for `tpu_resource` whose nodeLabels
    agree with the slice's `selector` and whose quota (nominal, plus what it may borrow in a
    cohort) holds `chips`. Usage by others is not counted: that is waiting, not never. A resource
    Kueue's config leaves out of quota (`quota_check`) needs no ClusterQueue to cover it."""
    lq = _named(local_queues, queue)
    if lq is None:
        return [f"no Kueue LocalQueue {queue!r} in namespace {namespace}"], []
    cq_name = (lq.get("spec") or {}).get("clusterQueue")
    if cluster_queues is None:
        return [], []
    if isinstance(cluster_queues, Unread):
        return [], [f"Kueue's ClusterQueues unreadable ({cluster_queues.reason})"]
    cq = _named(cluster_queues, cq_name)
    where = f"LocalQueue {queue!r}'s ClusterQueue {cq_name!r}"
    if cq is None:
        return [f"{where} does not exist"], []
    inactive = _inactive(cq)
    if inactive:
        return [f"{where} is not active ({inactive})"], []
    groups = (cq.get("spec") or {}).get("resourceGroups") or []
    covered = {r for g in groups for r in g.get("coveredResources") or []}
    verdict = _uncovered_problems(where, sorted(r for r in resources - covered if not quota_check.excluded(r)),
                                  quota_check)
    if verdict:
        return verdict
    if quota_check.excluded(tpu_resource) or tpu_resource not in covered and quota_check.ignore_undeclared:
        return [], []  # Kueue counts no TPU quota for it
    if isinstance(flavors, Unread):
        return [], [f"Kueue's ResourceFlavors unreadable ({flavors.reason})"]
    return _tpu_flavor_problems(where, cq, flavors, selector, tpu_resource, chips)


def _named(objects: list[dict], name: str | None) -> dict | None:
    """The object called `name` (metadata.name) among `objects`, None when there is none."""
    return next((o for o in objects if (o.get("metadata") or {}).get("name") == name), None)


def _inactive(cq: dict) -> str | None:
    """'reason: message' of a ClusterQueue whose Active condition is False (Kueue admits nothing
    through it), None when it is active or says nothing."""
    active = next((c for c in (cq.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
    if active and active.get("status") == "False":
        return f"{active.get('reason')}: {active.get('message')}"
    return None


def _uncovered_problems(where: str, uncovered: list[str],
                        quota_check: QuotaCheck) -> tuple[list[str], list[str]] | None:
    """The verdict when the ClusterQueue covers none of `uncovered` (resources the pods ask for that
    Kueue's config does not leave out of quota), None when that stops nothing: there are none, or
    Kueue skips what no resource group declares (IgnoreUndeclared)."""
    if not uncovered or quota_check.ignore_undeclared:
        return None
    problem = f"{where} covers no {', '.join(uncovered)}, which the pods ask for"
    if quota_check.unread:
        return [], [f"{problem}, and whether Kueue's config leaves them out of quota is unknown: "
                    f"kueue-system/kueue-manager-config unreadable ({quota_check.unread})"]
    return [problem], []


def _tpu_flavor_problems(where: str, cq: dict, flavors: list[dict] | None, selector: dict[str, str],
                         tpu_resource: str, chips: float) -> tuple[list[str], list[str]]:
    """Whether a flavor of the ClusterQueue `cq` for `tpu_resource` agrees with the slice's
    `selector` and may ever hold `chips` (its nominal quota, plus what it may borrow in a cohort)."""
    by_name = {(f.get("metadata") or {}).get("name"): f for f in flavors or []}
    spec = cq.get("spec") or {}
    cohort = spec.get("cohortName") or spec.get("cohort")
    tried = []
    for group in spec.get("resourceGroups") or []:
        if tpu_resource not in (group.get("coveredResources") or []):
            continue
        for flavor in group.get("flavors") or []:
            quota = next((r for r in flavor.get("resources") or [] if r.get("name") == tpu_resource), {})
            conflict = _flavor_conflict(by_name.get(flavor.get("name")), selector)
            if conflict:
                tried.append(f"{flavor.get('name')} ({conflict})")
                continue
            nominal = quantity(quota.get("nominalQuota"))
            if cohort and quota.get("borrowingLimit") is None:
                return [], []  # it may borrow without limit in its cohort: not never
            most = nominal + (quantity(quota.get("borrowingLimit")) if cohort else 0)
            if most >= chips:
                return [], []
            tried.append(f"{flavor.get('name')} (at most {most:g} {tpu_resource}"
                         + (f": nominal {nominal:g}, borrowing in cohort {cohort}" if cohort else "") + ")")
    return [f"{where} has no flavor that can ever hold {chips:g} {tpu_resource}: "
            + ("; ".join(tried) if tried else "none is listed")], []
