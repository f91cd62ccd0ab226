"""`tputorch doctor`: can this cluster run a TPUTorchJob and a TPUTorchService, and what to fix.

Every check is a pure function over what doctor_read.py read from the cluster (plain dicts, as the
API returns them), so each is tested with dicts. A fact that could not be read is an `Unread`
(its reason), and a check over it says `?`, never `✓`. Each result: ok ✓, fail ✗ (with the fix and
the doc section), warn ! or unknown ?. Exit code 0 when nothing failed, else 1.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from ..api import crd, network, spec, topology
from .. import render

OK, FAIL, WARN, UNKNOWN = "ok", "fail", "warn", "unknown"
SYMBOLS = {OK: "✓", FAIL: "✗", WARN: "!", UNKNOWN: "?"}

# docs/compatibility.md: the chart and the CRDs' CEL rules need Kubernetes 1.29 or later.
MIN_KUBERNETES = (1, 29)
# KubeRay versions that break something the operator relies on (docs/compatibility.md).
KNOWN_BAD_KUBERAY = {
    "1.6.0": "a RayService created suspended (queued by Kueue) never starts (kuberay#4686, fixed in 1.6.1)",
}
# No KubeRay Deployment in the cluster: what GKE's Ray Operator add-on looks like ("GKE installs and
# hosts the KubeRay operator"; Google's own quickstart says to ignore `kubectl ray version`'s "no
# KubeRay operator deployments found in any namespace"). Its version is then nowhere to be read.
KUBERAY_NO_DEPLOYMENT = ("no KubeRay Deployment in the cluster (labels app.kubernetes.io/name=kuberay-operator or "
                         "kuberay); GKE's Ray Operator add-on runs KubeRay outside the cluster and publishes no version")
KUBERAY_CRDS = {"RayJob": "rayjobs.ray.io", "RayCluster": "rayclusters.ray.io", "RayService": "rayservices.ray.io"}
KUEUE_INTEGRATIONS = ("ray.io/rayjob", "ray.io/rayservice")
KUEUE_LOCALQUEUE_CRD = "localqueues.kueue.x-k8s.io"
GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
LEASE_NAME = "tputorch-operator"  # `tputorch run --lease-name`'s default, the chart's too
# kube-system pods of CNIs that enforce NetworkPolicy (GKE Dataplane V2 is anetd, i.e. Cilium).
ENFORCING_CNI_PODS = {"anetd": "GKE Dataplane V2", "cilium": "Cilium", "calico-node": "Calico",
                      "antrea-agent": "Antrea", "kube-router": "kube-router"}
GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
GKE_FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

DOCS = "docs/"  # the project's docs folder
DOC_COMPAT_K8S = DOCS + "compatibility.md#kubernetes-and-gke"
DOC_COMPAT_KUBERAY = DOCS + "compatibility.md#kuberay"
DOC_WEBHOOK = DOCS + "compatibility.md#the-ray-tpu-webhook"
DOC_OPERATOR = DOCS + "install-gke.md#7-the-operator"
DOC_OPERATOR_TROUBLE = DOCS + "troubleshooting.md#the-operator"
DOC_POOLS = DOCS + "install-gke.md#3-tpu-node-pools-one-per-slice-that-runs-at-the-same-time"
DOC_QUOTA = DOCS + "troubleshooting.md#quota-and-capacity"
DOC_KUEUE = DOCS + "kueue.md#gke-specifics"
DOC_NETWORK = DOCS + "operations.md#policies"
DOC_GCSFUSE = DOCS + "install-gke.md#1-the-cluster-ray-operator-add-on-gcs-fuse-workload-identity"
DOC_RIGHTS = DOCS + "install-gke.md#who-may-submit-jobs"


@dataclass(frozen=True)
class Unread:
    """A fact the reader could not get: the API's error or a timeout."""
    reason: str


@dataclass
class Result:
    check: str  # a stable id, for -o json
    status: str
    message: str
    fix: str = ""
    doc: str = ""
    details: list = field(default_factory=list)  # e.g. the TPU pool table's rows

    def as_dict(self) -> dict:
        out = {"check": self.check, "status": self.status, "message": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.doc:
            out["doc"] = self.doc
        if self.details:
            out["details"] = self.details
        return out


def _unknown(check: str, what: str, fact: Unread) -> Result:
    return Result(check, UNKNOWN, f"{what}: could not read ({fact.reason})")


# ---------------------------------------------------------------- the API server

def parse_version(text: str) -> tuple[int, ...] | None:
    """`v1.34.4-gke.100` -> (1, 34, 4); None for something that is no version."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def check_kubernetes(version: dict | Unread) -> list[Result]:
    if isinstance(version, Unread):
        return [_unknown("kubernetes", "the API server's version", version)]
    text = version.get("gitVersion") or f"{version.get('major')}.{version.get('minor')}"
    parsed = parse_version(text) or parse_version(f"{version.get('major')}.{str(version.get('minor')).rstrip('+')}")
    minimum = ".".join(map(str, MIN_KUBERNETES))
    if parsed is None:
        return [Result("kubernetes", UNKNOWN, f"Kubernetes {text!r}: not a version this tool reads")]
    if parsed[:2] < MIN_KUBERNETES:
        return [Result("kubernetes", FAIL, f"Kubernetes {text} is older than {minimum}, the minimum",
                       f"upgrade the cluster to Kubernetes {minimum} or later (the CRDs' CEL rules need it)",
                       DOC_COMPAT_K8S)]
    return [Result("kubernetes", OK, f"Kubernetes {text} (≥ {minimum})")]


# ---------------------------------------------------------------- this operator's CRDs

def _schemas(definition: dict) -> dict:
    """version name -> what of a CRD's version this CLI and the cluster must agree on."""
    return {v.get("name"): {"schema": (v.get("schema") or {}).get("openAPIV3Schema"),
                            "served": v.get("served"), "storage": v.get("storage"),
                            "subresources": v.get("subresources") or {},
                            "additionalPrinterColumns": v.get("additionalPrinterColumns") or []}
            for v in (definition.get("spec") or {}).get("versions") or []}


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first path where two JSON values differ, or None when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{path}.{key}".lstrip(".")
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} vs {len(b)})".lstrip(".")
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b else (path.lstrip(".") or "(the whole value)")


def check_tputorch_crds(installed: dict[str, dict | None | Unread]) -> list[Result]:
    """installed: CRD name -> the installed CRD (None: not installed)."""
    results = []
    fix = "install the CRDs of this CLI's version: `tputorch crd | kubectl apply --server-side -f -` (or upgrade the chart)"
    for kind, build in crd.BUILDERS.items():
        expected = build()
        name = expected["metadata"]["name"]
        got = installed.get(name)
        check = f"crd/{name}"
        if isinstance(got, Unread):
            results.append(_unknown(check, f"{kind} CRD", got))
        elif got is None:
            results.append(Result(check, FAIL, f"{kind} CRD ({name}) is not installed", fix, DOC_OPERATOR))
        else:
            diff = first_difference(_schemas(got), _schemas(expected))
            if diff:
                results.append(Result(check, FAIL, f"{kind} CRD differs from this CLI's at versions.{diff}",
                                      fix + "; or use the CLI that matches the installed operator", DOC_OPERATOR))
            else:
                results.append(Result(check, OK, f"{kind} CRD installed, the same schema as this CLI's"))
    return results


# ---------------------------------------------------------------- the operator

def _age(timestamp: str | None, now: datetime) -> float | None:
    if not timestamp:
        return None
    try:
        when = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return (now - when).total_seconds()


def check_operator(deployments: list[dict] | Unread, lease: dict | None | Unread, now: datetime) -> list[Result]:
    """The operator's Deployment(s) (the chart's labels) and its leader Lease."""
    results = []
    if isinstance(deployments, Unread):
        results.append(_unknown("operator", "the operator's Deployment", deployments))
    elif not deployments:
        leading = isinstance(lease, dict) and check_lease(lease, now).status == OK
        results.append(Result(
            "operator", WARN if leading else FAIL,
            "no operator Deployment (labels app.kubernetes.io/part-of=tputorch, component=operator) in any namespace"
            + ("; an operator holds the leader Lease (it runs outside a Deployment)" if leading else ""),
            "" if leading else "install the operator: `helm install tputorch charts/tputorch-operator ...`",
            "" if leading else DOC_OPERATOR))
    else:
        for d in deployments:
            meta, st = d.get("metadata") or {}, d.get("status") or {}
            want = (d.get("spec") or {}).get("replicas", 1)
            ready = st.get("readyReplicas") or 0
            image = next(iter(((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []), {}).get("image", "?")
            where = f"{meta.get('namespace')}/{meta.get('name')}"
            version = (meta.get("labels") or {}).get("app.kubernetes.io/version")
            shown = f"operator {where} ({image}{', version ' + version if version else ''})"
            fix_stopped = (f"start the operator: `kubectl -n {meta.get('namespace')} scale deployment/{meta.get('name')} "
                           f"--replicas=2`, then `kubectl -n {meta.get('namespace')} describe deployment/{meta.get('name')}` "
                           "and its pods' logs say why it does not run")
            if want == 0 or ready == 0:
                results.append(Result("operator", FAIL, f"{shown}: {ready} of {want} replica(s) ready", fix_stopped,
                                      DOC_OPERATOR_TROUBLE))
            elif ready < want:
                results.append(Result("operator", WARN, f"{shown}: {ready} of {want} replica(s) ready"))
            else:
                results.append(Result("operator", OK, f"{shown}: {ready} of {want} replica(s) ready"))
    results.append(check_lease(lease, now))
    return results


def operator_args(deployment: dict) -> list[str]:
    return [a for c in ((deployment.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
            for a in (c.get("command") or []) + (c.get("args") or [])]


def lease_names(deployments: list[dict]) -> list[tuple[str, str]]:
    """(namespace, name) of the Lease each operator Deployment elects its leader with (--lease-name)."""
    out = []
    for d in deployments:
        args = operator_args(d)
        if "--leader-elect" in args:
            name = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--lease-name"), LEASE_NAME)
            out.append((d["metadata"]["namespace"], name))
    return out


def check_lease(lease: dict | None | Unread, now: datetime) -> Result:
    if isinstance(lease, Unread):
        return _unknown("operator-lease", "the operator's leader Lease", lease)
    if lease is None:
        return Result("operator-lease", WARN, f"no Lease {LEASE_NAME!r}: the operator runs without --leader-elect "
                      "(one replica only) or is not running")
    meta, sp = lease.get("metadata") or {}, lease.get("spec") or {}
    holder = sp.get("holderIdentity")
    duration = sp.get("leaseDurationSeconds") or 15
    age = _age(sp.get("renewTime"), now)
    where = f"Lease {meta.get('namespace')}/{meta.get('name')}"
    if not holder or age is None:
        return Result("operator-lease", FAIL, f"{where} is held by no one: no operator replica leads, nothing is reconciled",
                      "start the operator (its replicas take the Lease within 15 s)", DOC_OPERATOR_TROUBLE)
    if age > duration:
        return Result("operator-lease", FAIL, f"{where}: leader {holder} last renewed {age:.0f} s ago (lease "
                      f"{duration} s): the operator is stopped or cannot reach the API server",
                      f"look at the operator's pods: `kubectl -n {meta.get('namespace')} get pods -l "
                      "app.kubernetes.io/component=operator` and their logs", DOC_OPERATOR_TROUBLE)
    return Result("operator-lease", OK, f"{where}: held by {holder}, renewed {max(age, 0):.0f} s ago")


# ---------------------------------------------------------------- KubeRay

def representative_children() -> dict[str, list[dict]]:
    """RayJob and RayService bodies as the operator writes them, with every optional part it can
    write (extra worker groups with Ray labels, autoscaling, runtime env, storage, the token
    Secret's name), so each field the operator writes is checked against the cluster's CRDs."""
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
        "volumes": [{"name": "data", "mountPath": "/data", "gcs": {"bucket": "doctor"}}]}}
    rayjob = render.render_any(spec.parse_any(job))
    render.with_ray_token_secret(rayjob, "doctor-ray-token")
    rayservice = render.render_any(spec.parse_any(service))
    rayservice["spec"]["rayClusterConfig"]["authOptions"] = {**render.RAY_AUTH, "secretName": "doctor-ray-token"}
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
    """The KubeRay operator's version, from its Deployment's image tag (v1.6.2 -> 1.6.2; a digest
    after the tag is ignored, an image by digest alone has no version)."""
    if isinstance(deployments, Unread):
        return None
    for d in deployments:
        for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            name = (c.get("image") or "").partition("@")[0]
            tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else ""
            parsed = parse_version(tag)
            if parsed:
                return ".".join(map(str, parsed))
    return None


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
        results.append(Result("kuberay-version", status, f"KubeRay {version}: {KNOWN_BAD_KUBERAY[version]}",
                              "upgrade KubeRay to 1.6.1 or later", DOC_COMPAT_KUBERAY))
    else:
        results.append(Result("kuberay-version", OK, f"KubeRay {version}"))
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


# ---------------------------------------------------------------- TPU node pools

@dataclass(frozen=True)
class Pool:
    name: str
    accelerator: str  # the GKE label value
    topology: str
    machine_type: str
    nodes: int  # Ready, schedulable nodes
    not_ready: int
    chips_per_host: int | None
    capacity: str  # on-demand, spot, reservation NAME, flex-start
    slice: topology.Slice | None
    problem: str  # why the labels make no slice ("" when they do)

    @property
    def slices(self) -> int:
        return self.nodes // self.slice.hosts if self.slice else 0

    def row(self) -> dict:
        return {"pool": self.name, "accelerator": self.slice.generation.name if self.slice else self.accelerator,
                "topology": self.topology, "hosts": self.slice.hosts if self.slice else None,
                "machineType": self.machine_type, "nodes": self.nodes, "notReady": self.not_ready,
                "slices": self.slices, "capacity": self.capacity, "problem": self.problem}


def _ready(node: dict) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _chips_per_host(node: dict) -> int | None:
    machine = (node.get("metadata") or {}).get("labels", {}).get(INSTANCE_TYPE_LABEL, "")
    m = re.search(r"-(\d+)t$", machine)
    if m:
        return int(m.group(1))
    chips = ((node.get("status") or {}).get("capacity") or {}).get(topology.TPU_RESOURCE)
    return int(chips) if chips and str(chips).isdigit() else None


def _capacity(labels: dict) -> str:
    if labels.get(topology.GKE_RESERVATION_LABEL):
        return f"reservation {labels[topology.GKE_RESERVATION_LABEL]}"
    if labels.get(topology.GKE_SPOT_LABEL) == "true":
        return "spot"
    if labels.get(GKE_FLEX_START_LABEL) == "true":
        return "flex-start"
    return "on-demand"


def tpu_pools(nodes: list[dict]) -> list[Pool]:
    """The TPU node pools among the nodes (by GKE's node-pool label), each resolved to its slice."""
    groups: dict[str, list[dict]] = {}
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if topology.GKE_ACCELERATOR_LABEL not in labels:
            continue
        key = labels.get(GKE_NODEPOOL_LABEL) or f"{labels[topology.GKE_ACCELERATOR_LABEL]}/{labels.get(topology.GKE_TOPOLOGY_LABEL)}"
        groups.setdefault(key, []).append(node)
    pools = []
    for name, members in sorted(groups.items()):
        labels = members[0]["metadata"]["labels"]
        accel, topo = labels[topology.GKE_ACCELERATOR_LABEL], labels.get(topology.GKE_TOPOLOGY_LABEL, "")
        layouts = {_chips_per_host(n) for n in members}
        chips = layouts.pop() if len(layouts) == 1 else None
        problem, shape = "", None
        try:
            generation = topology.GENERATIONS[topology.normalize_accelerator(accel)]
            options = topology.host_layouts(generation, topo) if topo in generation.topologies else ()
            if not options:
                problem = f"topology {topo!r} is not a {generation.name} slice this operator runs"
            elif chips is None and len(options) > 1:
                problem = (f"ambiguous: {generation.name} {topo} is {' or '.join(map(str, options))} chips per host "
                           f"and the nodes say neither ({INSTANCE_TYPE_LABEL}, {topology.TPU_RESOURCE})")
            else:
                shape = topology.resolve(accel, topo, chips if chips in options else None)
                if chips is not None and chips not in options:
                    problem = f"{chips} chips per host is no {generation.name} {topo} layout"
                    shape = None
        except topology.TopologyError as err:
            problem = f"{err.field} {err.value!r} {err.message}"
        ready = [n for n in members if _ready(n)]
        pools.append(Pool(name, accel, topo, labels.get(INSTANCE_TYPE_LABEL, "?"), len(ready),
                          len(members) - len(ready), chips, _capacity(labels), shape, problem))
    return pools


def check_pools(nodes: list[dict] | Unread) -> list[Result]:
    if isinstance(nodes, Unread):
        return [_unknown("tpu-pools", "the nodes", nodes)]
    pools = tpu_pools(nodes)
    if not pools:
        return [Result("tpu-pools", WARN, "no TPU nodes: no slice can run now (a pool scaled to zero has no nodes "
                       "to see; its jobs wait for the autoscaler)", doc=DOC_POOLS)]
    rows = [p.row() for p in pools]
    usable = [p for p in pools if p.slices]
    summary = ", ".join(f"{p.name} ({p.slice.generation.name} {p.topology}: {p.slices} slice(s), {p.capacity})"
                        for p in usable) or "none"
    results = [Result("tpu-pools", OK if usable else FAIL, f"TPU slices that can run now: {summary}",
                      "" if usable else "create a TPU node pool per slice (install-gke.md step 3)",
                      "" if usable else DOC_POOLS, rows)]
    for p in pools:
        check = f"tpu-pool/{p.name}"
        if p.problem:
            status = WARN if p.problem.startswith("ambiguous") else FAIL
            results.append(Result(check, status, f"pool {p.name}: {p.problem}",
                                  f"label the nodes as GKE does ({topology.GKE_ACCELERATOR_LABEL}, "
                                  f"{topology.GKE_TOPOLOGY_LABEL}, {INSTANCE_TYPE_LABEL})", DOC_POOLS))
        elif p.nodes % p.slice.hosts:
            short = p.slice.hosts - p.nodes % p.slice.hosts
            status = FAIL if p.slices == 0 else WARN
            results.append(Result(check, status, f"pool {p.name}: {p.nodes} ready node(s) of a "
                                  f"{p.slice.hosts}-host {p.slice.generation.name} {p.topology} slice, {short} short"
                                  + (f" ({p.not_ready} not ready)" if p.not_ready else ""),
                                  f"resize the pool to a multiple of {p.slice.hosts} nodes, or repair the missing "
                                  "node(s) (`kubectl get nodes -l cloud.google.com/gke-nodepool=" + p.name + "`)",
                                  DOC_POOLS))
    return results


def pools_table(rows: list[dict]) -> list[str]:
    headers = ["POOL", "ACCELERATOR", "TOPOLOGY", "HOSTS", "MACHINE TYPE", "NODES", "SLICES", "CAPACITY"]
    keys = ["pool", "accelerator", "topology", "hosts", "machineType", "nodes", "slices", "capacity"]
    table = [headers] + [["-" if r[k] is None else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]


# ---------------------------------------------------------------- --for FILE: where would each land

def quantity(text: str | int | None) -> float:
    """A Kubernetes quantity as a number (only what TPU and CPU quotas use: plain, m, Ki..Ei, k..E)."""
    if text is None:
        return 0.0
    s = str(text)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    for suf in sorted(suffixes, key=len, reverse=True):
        if s.endswith(suf):
            return float(s[: -len(suf)]) * suffixes[suf]
    return float(s)


def _tpu_quota_left(quotas: list[dict]) -> tuple[float, str] | None:
    """The least google.com/tpu any ResourceQuota of the namespace still allows, and its name."""
    least = None
    for q in quotas:
        hard, used = (q.get("status") or {}).get("hard") or (q.get("spec") or {}).get("hard") or {}, (q.get("status") or {}).get("used") or {}
        for key in (f"requests.{topology.TPU_RESOURCE}", f"limits.{topology.TPU_RESOURCE}"):
            if key in hard:
                left = quantity(hard[key]) - quantity(used.get(key))
                if least is None or left < least[0]:
                    least = (left, f"{q['metadata']['name']} ({key}: {used.get(key, '0')} of {hard[key]} used)")
    return least


def check_placement(specs: list, nodes: list[dict] | Unread, quotas: dict[str, list[dict] | Unread],
                    local_queues: dict[str, list[dict] | Unread]) -> list[Result]:
    """Which pool each job or service of a file would land on, or why none fits."""
    if isinstance(nodes, Unread):
        return [_unknown("for", "the nodes", nodes)]
    pools = tpu_pools(nodes)
    results = []
    for s in specs:
        sl = s.slice
        kind = "service" if isinstance(s, spec.ServiceSpec) else "job"
        what = f"{kind} {s.namespace}/{s.name} ({sl.generation.name} {sl.topology}, {sl.hosts} host(s))"
        check = f"for/{s.namespace}/{s.name}"
        wanted = 1 if kind == "job" else max(1, s.min_replicas)
        capacity_label = {"spot": s.spot, "reservation": s.reservation}
        fits = [p for p in pools if p.slice and p.slice.generation is sl.generation and p.topology == sl.topology
                and p.slice.chips_per_host == sl.chips_per_host and _capacity_matches(p, capacity_label)]
        problems = []
        if not fits:
            near = [p.name for p in pools if p.slice and p.slice.generation is sl.generation and p.topology == sl.topology]
            reason = (f"pool(s) {', '.join(near)} have this shape but not its capacity ({_capacity_text(capacity_label)})"
                      if near else f"no node pool is a {sl.generation.gke_accelerator} {sl.topology} slice")
            results.append(Result(check, FAIL, f"{what}: no pool fits: {reason}",
                                  f"create a node pool: --machine-type={sl.machine_type} --tpu-topology={sl.topology} "
                                  f"--num-nodes={sl.hosts}" + (" --spot" if capacity_label.get("spot") else ""),
                                  DOC_POOLS))
            continue
        slices = sum(p.slices for p in fits)
        if slices < wanted:
            problems.append(f"{slices} whole slice(s) ready, {wanted} needed")
        quota = quotas.get(s.namespace)
        if isinstance(quota, Unread):
            problems.append(f"ResourceQuota unreadable ({quota.reason})")
        elif quota:
            left = _tpu_quota_left(quota)
            if left is not None and left[0] < sl.chips * wanted:
                problems.append(f"ResourceQuota {left[1]} leaves {left[0]:g} chips, {sl.chips * wanted} needed")
        queue = getattr(s, "queue_name", None)
        if queue:
            lqs = local_queues.get(s.namespace)
            if isinstance(lqs, Unread):
                problems.append(f"LocalQueue {queue!r} unreadable ({lqs.reason})")
            elif not any((q.get("metadata") or {}).get("name") == queue for q in lqs or []):
                problems.append(f"no Kueue LocalQueue {queue!r} in namespace {s.namespace}")
        names = ", ".join(p.name for p in fits)
        if problems:
            results.append(Result(check, FAIL, f"{what}: pool {names}, but " + "; ".join(problems),
                                  "add nodes (or slices) to the pool, raise the namespace's ResourceQuota, or create "
                                  "the LocalQueue", DOC_QUOTA))
        else:
            results.append(Result(check, OK, f"{what}: would land on pool {names} ({slices} slice(s))"))
    return results


def _capacity_matches(pool: Pool, wanted: dict) -> bool:
    if wanted.get("reservation"):
        return pool.capacity == f"reservation {wanted['reservation']}"
    if wanted.get("spot"):
        return pool.capacity == "spot"
    return pool.capacity in ("on-demand", "flex-start") or pool.capacity.startswith("reservation")


def _capacity_text(wanted: dict) -> str:
    if wanted.get("reservation"):
        return f"reservation {wanted['reservation']}"
    return "spot" if wanted.get("spot") else "on-demand"


# ---------------------------------------------------------------- network policy

def check_network(kube_system_pods: list[dict] | Unread, operator_deployments: list[dict] | Unread,
                  kuberay_deployments: list[dict] | Unread) -> list[Result]:
    """Whether NetworkPolicies are enforced (a heuristic: an enforcing CNI's pods in kube-system)
    and what the operator's policy mode admits."""
    results = []
    if isinstance(kube_system_pods, Unread):
        results.append(_unknown("network-policy", "kube-system's pods", kube_system_pods))
        enforced = None
    else:
        seen = sorted({label for p in kube_system_pods for prefix, label in ENFORCING_CNI_PODS.items()
                       if ((p.get("metadata") or {}).get("name") or "").startswith(prefix + "-")})
        enforced = bool(seen)
        if seen:
            results.append(Result("network-policy", UNKNOWN, f"NetworkPolicy probably enforced ({', '.join(seen)} pods "
                                  "in kube-system); `tputorch doctor --smoke` would tell"))
        else:
            results.append(Result("network-policy", WARN, "no NetworkPolicy engine seen in kube-system (no anetd/"
                                  "Dataplane V2, Cilium, Calico, Antrea): the Ray clusters' NetworkPolicies are "
                                  "probably not enforced; Ray token auth still guards the heads", doc=DOC_NETWORK))
    if isinstance(operator_deployments, Unread) or not operator_deployments:
        return results
    results.append(check_policy_mode(operator_args(operator_deployments[0]), kuberay_deployments, enforced))
    return results


def _flag_values(args: list[str], flag: str) -> list[str]:
    return ([args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
            + [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")])


def policy_config(args: list[str]) -> "render.NetworkPolicyConfig | None":
    """The NetworkPolicy the operator with these flags gives a Ray cluster (None: --no-network-policy),
    for --smoke to give its probe the same; ValueError on a peer the operator would refuse too."""
    if "--no-network-policy" in args:
        return None
    mode = (_flag_values(args, "--network-policy-mode") or ["open"])[-1]
    return render.NetworkPolicyConfig(mode, tuple(network.parse_peer_text(p) for p in _flag_values(args, "--network-policy-peer")),
                                      tuple(network.parse_peer_text(p) for p in _flag_values(args, "--network-policy-metrics-peer")))


def check_policy_mode(args: list[str], kuberay_deployments: list[dict] | Unread, enforced: bool | None) -> Result:
    """What the operator's NetworkPolicy mode (its Deployment's flags) admits to the Ray dashboard,
    which KubeRay must reach (it polls jobs and deploys Serve applications through it)."""
    if "--no-network-policy" in args:
        return Result("operator-policy", WARN, "the operator runs with --no-network-policy: its Ray clusters get no "
                      "NetworkPolicy (any pod may reach their ports; Ray token auth still guards the dashboard)",
                      doc=DOC_NETWORK)
    mode = (_flag_values(args, "--network-policy-mode") or ["open"])[-1]
    if mode != "strict":
        return Result("operator-policy", OK, f"the operator's NetworkPolicy mode is {mode}: the Ray dashboard (8265) "
                      "admits any source (KubeRay included), Ray token auth guards it")
    try:
        peers = [network.parse_peer_text(p) for p in _flag_values(args, "--network-policy-peer")]
    except ValueError as err:
        return Result("operator-policy", UNKNOWN, f"the operator's --network-policy-peer: {err}")
    shown = ", ".join(_flag_values(args, "--network-policy-peer")) or "no peer"
    kuberay_ns = None
    if not isinstance(kuberay_deployments, Unread) and kuberay_deployments:
        kuberay_ns = kuberay_deployments[0]["metadata"]["namespace"]
    admits = any(p.cidr is not None or p.namespace in (network.ANY_NAMESPACE, kuberay_ns) for p in peers)
    fix = ("list KubeRay's pods (chart: networkPolicy.kuberay.namespace, podLabels, or kuberay.cidrs for a hosted "
           "KubeRay), or use networkPolicy.mode=open")
    if kuberay_ns is None:
        return Result("operator-policy", WARN if peers else (FAIL if enforced else WARN),
                      f"strict NetworkPolicy mode admits {shown} to the Ray dashboard; no KubeRay Deployment found to "
                      "tell whether that admits KubeRay (GKE's add-on runs it where it is not documented)",
                      fix, DOC_NETWORK)
    if not admits:
        return Result("operator-policy", FAIL if enforced else WARN,
                      f"strict NetworkPolicy mode admits {shown}, not KubeRay's namespace {kuberay_ns}: "
                      "KubeRay could not reach the Ray dashboard", fix, DOC_NETWORK)
    return Result("operator-policy", OK, f"strict NetworkPolicy mode admits {shown} (KubeRay runs in {kuberay_ns})")


# ---------------------------------------------------------------- Kueue

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
                local_queues: list[dict] | Unread, namespace: str) -> list[Result]:
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
    if isinstance(local_queues, Unread):
        results.append(_unknown("kueue-localqueues", f"LocalQueues of {namespace}", local_queues))
    elif local_queues:
        names = ", ".join(q["metadata"]["name"] for q in local_queues)
        results.append(Result("kueue-localqueues", OK, f"LocalQueues in {namespace}: {names}"))
    else:
        results.append(Result("kueue-localqueues", WARN, f"no LocalQueue in namespace {namespace}: a job with "
                              "spec.queueName waits here forever", doc=DOC_KUEUE))
    return results


def kueue_rayservice_enabled(crd_installed, frameworks) -> bool | None:
    if crd_installed is not True or not isinstance(frameworks, list):
        return None
    return "ray.io/rayservice" in frameworks


# ---------------------------------------------------------------- GCS FUSE, the caller's rights

def check_gcsfuse(driver: dict | None | Unread) -> list[Result]:
    if isinstance(driver, Unread):
        return [_unknown("gcsfuse", f"CSIDriver {GCS_FUSE_DRIVER}", driver)]
    if driver is None:
        return [Result("gcsfuse", WARN, f"no CSIDriver {GCS_FUSE_DRIVER}: a spec.volumes gcs volume cannot mount",
                       "enable the add-on: `gcloud container clusters update CLUSTER --update-addons GcsFuseCsiDriver=ENABLED`",
                       DOC_GCSFUSE)]
    return [Result("gcsfuse", OK, f"Cloud Storage FUSE CSI driver ({GCS_FUSE_DRIVER})")]


# What a user of the operator does (submit, serve, get, logs, delete), each a SelfSubjectAccessReview.
RIGHTS = (
    ("create", crd.GROUP, crd.PLURAL, "", "submit jobs"),
    ("create", crd.GROUP, crd.SERVICE_PLURAL, "", "serve models"),
    ("watch", crd.GROUP, crd.PLURAL, "", "follow jobs"),
    ("delete", crd.GROUP, crd.PLURAL, "", "delete jobs"),
    ("list", "", "pods", "", "find the Ray pods"),
    ("get", "", "pods", "log", "read driver logs"),
    ("list", "", "events", "", "see events"),
)


def check_rights(allowed: dict[tuple, bool | Unread], namespace: str, user: str) -> list[Result]:
    """allowed: RIGHTS entry -> the review's answer."""
    denied, unread = [], []
    for right in RIGHTS:
        answer = allowed.get(right)
        if isinstance(answer, Unread) or answer is None:
            unread.append(right)
        elif not answer:
            denied.append(right)
    if denied:
        shown = "; ".join(f"{v} {r}{'/' + sub if sub else ''} ({why})" for v, _, r, sub, why in denied)
        return [Result("rights", FAIL, f"{user} may not, in namespace {namespace}: {shown}",
                       f"bind the chart's tputorch-user ClusterRole: `kubectl -n {namespace} create rolebinding "
                       f"tputorch-user --clusterrole=tputorch-user --user=YOU`", DOC_RIGHTS)]
    if unread:
        return [Result("rights", UNKNOWN, f"could not review {len(unread)} of the caller's rights in {namespace}")]
    return [Result("rights", OK, f"{user} may submit, serve, follow, read logs and delete in {namespace}")]


# ---------------------------------------------------------------- putting it together

def run_checks(facts: dict, now: datetime | None = None) -> list[Result]:
    """Every check over what was read. facts: see doctor_read.read_facts."""
    now = now or datetime.now(timezone.utc)
    kueue_rs = kueue_rayservice_enabled(facts["kueue_installed"], kueue_frameworks(facts["kueue_config"]))
    results = []
    results += check_kubernetes(facts["version"])
    results += check_tputorch_crds(facts["crds"])
    results += check_operator(facts["operator_deployments"], facts["lease"], now)
    results += check_kuberay(facts["crds"], facts["kuberay_deployments"], kueue_rs)
    results += check_tpu_webhook(facts["mutating_webhooks"], facts["validating_webhooks"])
    results += check_pools(facts["nodes"])
    results += check_network(facts["kube_system_pods"], facts["operator_deployments"], facts["kuberay_deployments"])
    results += check_kueue(facts["kueue_installed"], kueue_frameworks(facts["kueue_config"]),
                           facts["local_queues"].get(facts["namespace"], []), facts["namespace"])
    results += check_gcsfuse(facts["gcsfuse_driver"])
    results += check_rights(facts["rights"], facts["namespace"], facts.get("user") or "you")
    if facts.get("specs") is not None:
        results += check_placement(facts["specs"], facts["nodes"], facts["quotas"], facts["local_queues"])
    return results


def exit_code(results: Iterable[Result]) -> int:
    return 1 if any(r.status == FAIL for r in results) else 0


def format_text(results: list[Result], header: str) -> str:
    lines = [header]
    for r in results:
        lines.append(f"{SYMBOLS[r.status]} {r.message}")
        if r.check == "tpu-pools" and r.details:
            lines += ["    " + row for row in pools_table(r.details)]
        if r.status in (FAIL, WARN):
            if r.fix:
                lines.append(f"    fix: {r.fix}")
            if r.doc:
                lines.append(f"    see: {r.doc}")
    counts = {s: sum(r.status == s for r in results) for s in SYMBOLS}
    lines.append(f"{counts[OK]} ok, {counts[FAIL]} failed, {counts[WARN]} warning(s), {counts[UNKNOWN]} unknown")
    return "\n".join(lines) + "\n"


def format_json(results: list[Result], context: dict) -> str:
    return json.dumps({**context, "ok": exit_code(results) == 0, "checks": [r.as_dict() for r in results]},
                      indent=2) + "\n"
