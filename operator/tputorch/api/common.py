"""The block both kinds share, declared once: its fields (CommonSpec, COMMON_FIELDS), its parser
(parse_common) and the rules of each of its parts (tpu, image, env, resources, tolerations, node
selectors, securityContext); the typed reader they go through is reader.py's.

Each kind (job.py, service.py) adds only its own block; schema.py builds the schema of the same
block in one function (common_properties). Nothing here raises anything but InvalidSpec from a
kind's parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import Any

from . import identity, storage, topology
from .reader import (
    INT32_MAX, MAX_ENV, MAX_ENV_VALUE, MAX_PROPERTIES, MAX_STRING, MAX_TOLERATIONS, Reader, between, freeform, string,
    string_map,
)
from .quantity import MIN_MEMORY, MIN_MEMORY_MESSAGE, QUANTITY, ZERO_QUANTITY, memory_quantity, positive_quantity, quantity
from .storage import Volume
from .topology import Slice, TopologyError

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
RAY_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# An image reference's characters ([registry[:port]/]path[:tag][@algorithm:digest]): no whitespace or
# control character, which the Pod API (leading/trailing) or the kubelet (InvalidImageName) refuse later.
IMAGE = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9._/:@+]*$")
ENV_SOURCES = ("configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef")
# Pods one object may make: a platform team's bound (`tputorch run --max-pods-per-job`, the chart's
# maxPodsPerJob), so that no spec asks the cluster for 100,000 pods at once. The default fits the
# largest slice (v5p 16x16x24, 1,536 hosts) with its head, its submitter and groups beside it.
MAX_PODS_DEFAULT = 4096
MAX_PODS_ENV = "TPUTORCH_MAX_PODS_PER_JOB"


def check_pods(r: "Reader", path: str, pods: int, max_pods: int, what: str) -> None:
    """The platform's bound on the pods of one object; ``what`` says how they were counted."""
    if pods > max_pods:
        r.error(path, f"{pods} pods", f"must make at most {max_pods} pods per job ({what}); the bound is the "
                "operator's --max-pods-per-job (the chart's maxPodsPerJob), set by the platform team")


# Environment variables a user may not set: they would undo chip isolation or the slice shape.
FORBIDDEN_ENV = {
    "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS": "it switches Ray's per-worker chip isolation off, never on the "
    "training slice (a rollout group whose engines manage their own chips may set it in spec.groups[].env)",
    "TPU_VISIBLE_CHIPS": "Ray sets it per worker to the chips that worker was given",
    # KubeRay sets these from the cluster's authOptions only where absent: a user's value would turn
    # the cluster's token auth off or make its token one others may know.
    **{name: "KubeRay sets it for the cluster's Ray token authentication" for name in (
        "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_K8S_TOKEN_AUTH")},
}
RESERVED_ENV_PREFIX = "TPUTORCH_"

DEFAULTS: dict[str, Any] = {
    "rayVersion": "2.60.0",
    "tpu.slices": 1,
    "tpu.chipsPerWorker": 1,
    "tpu.spot": False,
    "head.cpu": "2",
    "head.memory": "8Gi",
    "worker.cpu": "8",
    "worker.memory": "32Gi",
    "backoffLimit": 0,
    "shutdownAfterJobFinishes": True,
    "suspend": False,
}


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    ephemeral_storage: str | None = None



@dataclass(frozen=True, kw_only=True)
class CommonSpec:
    """What both kinds' specs carry, under the same names."""

    name: str
    namespace: str
    slice: Slice
    spot: bool
    reservation: str | None
    image: str
    ray_version: str
    runtime_env: dict
    env: tuple
    head: Resources
    worker: Resources
    tolerations: tuple
    service_account_name: str | None
    node_selector: dict
    head_node_selector: dict
    queue_name: str | None
    priority_class_name: str | None = None  # a Kueue WorkloadPriorityClass (only with queue_name)
    labels: dict = field(default_factory=dict)
    volumes: tuple[Volume, ...] = ()
    gcs_fuse_sidecar: dict = field(default_factory=dict)  # {annotation: quantity} (storage.SIDECAR_ANNOTATIONS)
    security_context: dict = field(default_factory=lambda: dict(DEFAULT_SECURITY_CONTEXT))
    automount_service_account_token: bool = False
    # Reaches Cloud Storage as the namespace's default ServiceAccount (api/identity.py): said, not refused.
    identity_warning: str | None = None
    gcs_buckets: tuple[str, ...] = ()  # the buckets the spec reaches (api/identity.py), each once


image_reference = string(MAX_STRING, IMAGE, "an image reference such as us-docker.pkg.dev/p/r/ray:2.60.0 or "
                         "name@sha256:<digest> (letters, digits and . _ - / : @ +; no whitespace)")


# The rule of each pod resource, for the main slice, the head and every group alike (RESOURCE_RULES),
# and its admission-time form (resource_schema): one place per rule.
RESOURCE_RULES: dict[str, Callable[[Any], str | None]] = {"cpu": positive_quantity, "memory": memory_quantity}


def resource_schema(resource: str, description: str, default: str) -> dict:
    """The CRD schema of a pod's cpu or memory: the same rules as RESOURCE_RULES[resource]."""
    rules = [{"rule": f"!string(self).matches('{ZERO_QUANTITY.pattern}')",
              "message": "must be greater than zero (a pod with none could never run Ray)"}]
    if resource == "memory":
        rules.append({"rule": f"!isQuantity(string(self)) || quantity(string(self)).compareTo(quantity('{MIN_MEMORY}')) >= 0",
                      "message": MIN_MEMORY_MESSAGE})
    return {"description": description, "x-kubernetes-int-or-string": True, "pattern": QUANTITY.pattern,
            "maxLength": 64, "default": default, "x-kubernetes-validations": rules}


def ray_version_check(minimum: tuple[int, int, int], why: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        m = RAY_VERSION.fullmatch(v)
        if not m:
            return "must be a Ray release such as 2.60.0"
        if tuple(int(x) for x in m.groups()) < minimum:
            return f"must be {'.'.join(map(str, minimum))} or newer: {why}"
        return None

    return check


def env_name_problem(name: str, operator_env: Mapping[str, str], allowed: frozenset[str] = frozenset()) -> str | None:
    """Why a user may not set ``name`` (None: they may); ``allowed``: names of FORBIDDEN_ENV that
    this place admits (a rollout group's, api/groups.py)."""
    if name in FORBIDDEN_ENV and name not in allowed:
        return f"must not be set: {FORBIDDEN_ENV[name]}"
    if name.startswith(RESERVED_ENV_PREFIX):
        return f"must not start with {RESERVED_ENV_PREFIX}: the operator sets those from spec.tpu"
    if name in operator_env:
        return f"must not be set: {operator_env[name]}"
    return None



# Every Ray container (head, TPU workers, KubeRay's submitter, init and autoscaler containers) runs
# with this, which meets the `restricted` Pod Security profile. GKE TPU pods need no privilege on
# GKE 1.28+ (the TPU device plugin hands the chips over); the Ray images run as ray (1000:100).
# spec.securityContext replaces any of these keys.
DEFAULT_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 100,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
SECURITY_CONTEXT_FIELDS = {
    "runAsNonRoot": bool, "runAsUser": int, "runAsGroup": int, "allowPrivilegeEscalation": bool,
    "privileged": bool, "readOnlyRootFilesystem": bool, "capabilities": dict, "seccompProfile": dict,
}
SECCOMP_TYPES = ("RuntimeDefault", "Localhost", "Unconfined")
# CAP_SYS_ADMIN implies privilege escalation: the Pod API refuses it with allowPrivilegeEscalation
# false as "CAP_SYS_ADMIN"; the runtime grants the same capability for "SYS_ADMIN".
SYS_ADMIN = {"SYS_ADMIN", "CAP_SYS_ADMIN"}


def parse_security_context(r: Reader, spec: Mapping) -> dict:
    """The containers' securityContext: DEFAULT_SECURITY_CONTEXT with the user's keys in place of
    ours, and the Pod API's consistency rules (a pod refused later would never run)."""
    path = "spec.securityContext"
    given = r.mapping(spec, "securityContext", path, set(SECURITY_CONTEXT_FIELDS))
    user = {}
    for key, kind in SECURITY_CONTEXT_FIELDS.items():
        check = between(0, INT32_MAX) if kind is int else None
        value = r.value(given, key, f"{path}.{key}", Mapping if kind is dict else kind, check=check)
        if value is not None:
            user[key] = value
    if "capabilities" in user:
        caps = r.mapping(given, "capabilities", f"{path}.capabilities", {"add", "drop"})
        for part in ("add", "drop"):
            names = r.value(caps, part, f"{path}.capabilities.{part}", list, default=[])
            for i, name in enumerate(names):
                if not isinstance(name, str) or not re.fullmatch(r"^[A-Z_]{1,64}$", name):
                    r.error(f"{path}.capabilities.{part}[{i}]", name, "must be a capability name such as NET_ADMIN")
        user["capabilities"] = {k: list(caps[k]) for k in ("add", "drop") if caps.get(k)}
    if "seccompProfile" in user:
        profile = r.mapping(given, "seccompProfile", f"{path}.seccompProfile", {"type", "localhostProfile"})
        kind = r.value(profile, "type", f"{path}.seccompProfile.type", str, required=True,
                       check=lambda v: None if v in SECCOMP_TYPES else f"must be one of {', '.join(SECCOMP_TYPES)}")
        local = r.value(profile, "localhostProfile", f"{path}.seccompProfile.localhostProfile", str, check=string(253))
        if (kind == "Localhost") != bool(local):
            r.error(f"{path}.seccompProfile.localhostProfile", local, "must be set exactly when type is Localhost")
        user["seccompProfile"] = dict(profile)
    merged = {**DEFAULT_SECURITY_CONTEXT, **user}
    escalates = user.get("privileged") or bool(SYS_ADMIN & set((user.get("capabilities") or {}).get("add", [])))
    if escalates and user.get("allowPrivilegeEscalation") is False:
        r.error(f"{path}.allowPrivilegeEscalation", False, "must not be false with privileged or CAP_SYS_ADMIN")
    elif escalates and "allowPrivilegeEscalation" not in user:
        del merged["allowPrivilegeEscalation"]  # the Pod API refuses false together with them
    if merged.get("runAsUser") == 0:
        if user.get("runAsNonRoot") is True:
            r.error(f"{path}.runAsNonRoot", True, "must not be true with runAsUser 0")
        elif "runAsNonRoot" not in user:
            merged.pop("runAsNonRoot")
    return merged


TPU_FIELDS = {"accelerator", "topology", "slices", "chipsPerWorker", "chipsPerHost", "spot", "reservation"}
# The blocks both kinds have, parsed by one function.
COMMON_FIELDS = {
    "tpu", "image", "rayVersion", "runtimeEnv", "env", "head", "worker", "tolerations",
    "serviceAccountName", "nodeSelector", "queueName", "priorityClassName", "volumes", "gcsFuseSidecar",
    "securityContext", "automountServiceAccountToken",
}
RESOURCE_FIELDS = {"cpu", "memory", "ephemeralStorage"}
HEAD_FIELDS = RESOURCE_FIELDS | {"nodeSelector"}


@dataclass(frozen=True)
class TPU:
    slice: Slice | None
    chips_per_worker: int
    spot: bool
    reservation: str | None


def parse_tpu(r: Reader, spec: Mapping, allowed: set[str], slices_reason: str) -> TPU:
    tpu = r.mapping(spec, "tpu", "spec.tpu", allowed)
    if spec.get("tpu") is None:
        r.error("spec.tpu", None, "is required")
    spot = r.value(tpu, "spot", "spec.tpu.spot", bool, default=DEFAULTS["tpu.spot"])
    reservation = r.value(tpu, "reservation", "spec.tpu.reservation", str, check=string(63, LABEL_VALUE, "a label value (the reservation's name)"))
    if reservation and spot:
        r.error("spec.tpu.reservation", reservation, "must not be set together with spec.tpu.spot: a slice is either reserved or spot capacity")
    given = isinstance(spec.get("tpu"), Mapping)  # not an object: that error is reported already
    accelerator = r.value(tpu, "accelerator", "spec.tpu.accelerator", str, required=given)
    topo = r.value(tpu, "topology", "spec.tpu.topology", str, required=given)
    r.value(tpu, "slices", "spec.tpu.slices", int, default=1, check=lambda v: None if v == 1 else slices_reason)
    chips_per_worker = DEFAULTS["tpu.chipsPerWorker"]
    if "chipsPerWorker" in allowed:
        chips_per_worker = r.value(
            tpu, "chipsPerWorker", "spec.tpu.chipsPerWorker", int, default=DEFAULTS["tpu.chipsPerWorker"],
            check=lambda v: None if v in topology.VALID_CHIPS_PER_WORKER
            else f"must be one of {', '.join(map(str, topology.VALID_CHIPS_PER_WORKER))}",
        )
    chips_per_host = r.value(tpu, "chipsPerHost", "spec.tpu.chipsPerHost", int)
    try:
        if accelerator is not None:
            topology.normalize_accelerator(accelerator)
        if accelerator is None or topo is None:
            return TPU(None, chips_per_worker, spot, reservation)
        tpu_slice = topology.resolve(accelerator, topo, chips_per_host)
    except TopologyError as err:
        r.error(f"spec.tpu.{err.field}", err.value, err.message)
        return TPU(None, chips_per_worker, spot, reservation)
    if tpu_slice.chips_per_host % chips_per_worker:
        r.error(
            "spec.tpu.chipsPerWorker", chips_per_worker,
            f"must divide the {tpu_slice.chips_per_host} chips of each host of a "
            f"{tpu_slice.generation.name} {tpu_slice.topology} slice",
        )
    return TPU(tpu_slice, chips_per_worker, spot, reservation)


# Each env source's fields, the required ones first (as the Pod API validates them).
ENV_SOURCE_FIELDS = {
    "configMapKeyRef": (("name", "key"), ("optional",)),
    "secretKeyRef": (("name", "key"), ("optional",)),
    "fieldRef": (("fieldPath",), ("apiVersion",)),
    "resourceFieldRef": (("resource",), ("containerName", "divisor")),
}


def _parse_env_source(r: Reader, source: Mapping, path: str) -> None:
    if len(source) != 1 or next(iter(source)) not in ENV_SOURCES:
        # The RayJob's schema would prune anything else and the pods could never be created.
        r.error(path, dict(source), f"must have exactly one of {', '.join(ENV_SOURCES)}")
        return
    kind, ref = next(iter(source.items()))
    required, optional = ENV_SOURCE_FIELDS[kind]
    ref = r.mapping(source, kind, f"{path}.{kind}", set(required) | set(optional))
    for key in required:
        r.value(ref, key, f"{path}.{kind}.{key}", str, required=True, check=string(253))
    for key in optional:
        r.value(ref, key, f"{path}.{kind}.{key}", bool if key == "optional" else str,
                check=None if key == "optional" else string(253))


def parse_env(r: Reader, spec: Mapping, operator_env: Mapping[str, str], where: str = "spec.env",
              allowed: frozenset[str] = frozenset()) -> tuple:
    """The ``env`` list of ``spec`` (at ``where``): Kubernetes EnvVars with neither a name the
    operator sets nor one of FORBIDDEN_ENV but those ``allowed`` here."""
    env = r.value(spec, "env", where, list, default=[],
                  check=lambda v: None if len(v) <= MAX_ENV else f"must have at most {MAX_ENV} entries")
    seen: set[str] = set()
    for i, item in enumerate(env):
        path = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            r.error(path, item, "must be an object with name and value (or valueFrom)")
            continue
        for unknown in sorted(set(map(str, item)) - {"name", "value", "valueFrom"}):
            r.error(f"{path}.{unknown}", item[unknown], "is not a known field; known: name, value, valueFrom")
        name = r.value(item, "name", f"{path}.name", str, required=True, check=string(256, ENV_NAME, "a C-style identifier such as MY_VAR"))
        value = r.value(item, "value", f"{path}.value", str, check=lambda v: None if len(v) <= MAX_ENV_VALUE
                        else f"must be at most {MAX_ENV_VALUE} characters (put large data in a ConfigMap or the image)")
        source = r.value(item, "valueFrom", f"{path}.valueFrom", Mapping)
        if source is not None:
            _parse_env_source(r, source, f"{path}.valueFrom")
            if value is not None:
                r.error(f"{path}.value", value, "must not be set together with valueFrom")
        if name is None:
            continue
        problem = env_name_problem(name, operator_env, allowed)
        if problem:
            r.error(f"{path}.name", name, problem)
        if name in seen:
            r.error(f"{path}.name", name, f"must be unique within {where}")
        seen.add(name)
    return tuple(dict(item) for item in env if isinstance(item, Mapping))


def parse_runtime_env(r: Reader, spec: Mapping, operator_env: Mapping[str, str]) -> dict:
    runtime_env = r.mapping(spec, "runtimeEnv", "spec.runtimeEnv")
    if not freeform(r, runtime_env, "spec.runtimeEnv"):
        return {}
    if "env_vars" in runtime_env:
        env_vars = string_map(r, runtime_env, "env_vars", "spec.runtimeEnv.env_vars")
        if len(env_vars) > MAX_PROPERTIES:
            r.error("spec.runtimeEnv.env_vars", None, f"must have at most {MAX_PROPERTIES} entries")
        for name, value in env_vars.items():
            if len(value) > MAX_ENV_VALUE:
                r.error(f"spec.runtimeEnv.env_vars.{name}", value, f"must be at most {MAX_ENV_VALUE} characters")
        for name in env_vars:
            problem = env_name_problem(name, operator_env)
            if problem:
                r.error(f"spec.runtimeEnv.env_vars.{name}", env_vars[name], problem)
    return runtime_env


def parse_resources(r: Reader, spec: Mapping, key: str, allowed: set[str]) -> tuple[Resources, dict]:
    block = r.mapping(spec, key, f"spec.{key}", allowed)
    cpu = r.value(block, "cpu", f"spec.{key}.cpu", (str, int), default=DEFAULTS[f"{key}.cpu"], check=RESOURCE_RULES["cpu"])
    memory = r.value(block, "memory", f"spec.{key}.memory", (str, int), default=DEFAULTS[f"{key}.memory"], check=RESOURCE_RULES["memory"])
    disk = r.value(block, "ephemeralStorage", f"spec.{key}.ephemeralStorage", (str, int), check=quantity)
    return Resources(str(cpu), str(memory), None if disk is None else str(disk)), block


TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}
TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_tolerations(r: Reader, spec: Mapping) -> tuple:
    """Kubernetes tolerations, with the Pod API's own rules (a pod refused later never runs)."""
    tolerations = r.value(spec, "tolerations", "spec.tolerations", list, default=[],
                          check=lambda v: None if len(v) <= MAX_TOLERATIONS else f"must have at most {MAX_TOLERATIONS} entries")
    for i, tol in enumerate(tolerations):
        path = f"spec.tolerations[{i}]"
        if not isinstance(tol, Mapping):
            r.error(path, tol, "must be an object (a Kubernetes toleration)")
            continue
        r.mapping({"t": tol}, "t", path, TOLERATION_FIELDS)
        key = r.value(tol, "key", f"{path}.key", str, check=lambda v: None if v == "" or label_key_ok(v)
                      else "must be a label name ([prefix/]name, name at most 63 characters of [-A-Za-z0-9_.])")
        value = r.value(tol, "value", f"{path}.value", str, check=lambda v: None if len(v) <= 63 and LABEL_VALUE.fullmatch(v)
                        else "must be a label value (at most 63 characters of [-A-Za-z0-9_.])")
        operator = r.value(tol, "operator", f"{path}.operator", str, default="Equal",
                           check=lambda v: None if v in TOLERATION_OPERATORS else "must be Exists or Equal")
        effect = r.value(tol, "effect", f"{path}.effect", str,
                         check=lambda v: None if v in TAINT_EFFECTS else "must be NoSchedule, PreferNoSchedule or NoExecute")
        seconds = r.value(tol, "tolerationSeconds", f"{path}.tolerationSeconds", int)
        if operator == "Exists" and value:
            r.error(f"{path}.value", value, "must be empty when operator is Exists")
        if not key and operator != "Exists":
            r.error(f"{path}.operator", operator, "must be Exists when key is empty (a toleration of every taint)")
        if seconds is not None and effect != "NoExecute":
            r.error(f"{path}.tolerationSeconds", seconds, "must only be set when effect is NoExecute")
    return tuple(dict(t) for t in tolerations if isinstance(t, Mapping))


def label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.fullmatch(name))


def parse_node_selector(r: Reader, spec: Mapping, key: str, path: str) -> dict[str, str]:
    selector = string_map(r, spec, key, path)
    if len(selector) > MAX_PROPERTIES:
        r.error(path, None, f"must have at most {MAX_PROPERTIES} entries")
    for k, v in selector.items():
        # Label syntax: the RayJob's schema does not check it, so the pods would be refused later.
        if not label_key_ok(k):
            r.error(f"{path}", k, "keys must be label names ([prefix/]name, name at most 63 characters of [-A-Za-z0-9_.])")
        if len(v) > 63 or not LABEL_VALUE.fullmatch(v):
            r.error(f"{path}.{k}", v, "must be a label value (at most 63 characters of [-A-Za-z0-9_.])")
    for label in topology.SLICE_LABELS:
        if label in selector:
            r.error(f"{path}.{label}", selector[label], "must not be set: the operator derives it from spec.tpu")
    return selector


def parse_metadata(r: Reader, body: Mapping, max_len: int, child: str) -> tuple[str, str, dict]:
    metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    dns = string(MAX_STRING, DNS1035, f"a DNS-1035 label (lowercase letters, digits, '-', starting with a letter) of at most {max_len} characters, since the {child} takes this name")

    def check(v: str) -> str | None:
        if len(v) > max_len:
            return f"must be at most {max_len} characters, since the {child} takes this name (KubeRay's limit)"
        return dns(v)

    name = r.value(metadata, "name", "metadata.name", str, required=True, default="", check=check)
    namespace = r.value(metadata, "namespace", "metadata.namespace", str, default="default")
    labels = metadata.get("labels") if isinstance(metadata.get("labels"), Mapping) else {}
    return name, namespace or "default", {str(k): str(v) for k, v in labels.items()}


@dataclass(frozen=True)
class KindRules:
    """What differs between the kinds in their common blocks."""

    name: str
    spec_fields: set[str]
    tpu_fields: set[str]
    slices_reason: str
    name_max: int
    child: str  # the KubeRay object that takes the name
    min_ray: tuple[int, int, int]
    min_ray_why: str



def parse_common(r: Reader, body: Any, kind: KindRules, operator_env: Mapping[str, str]) -> tuple[dict, dict, TPU]:
    """The blocks both kinds share; errors go to ``r``. Returns the CommonSpec fields (complete only
    when ``r`` has no errors), the raw spec block for the kind's own fields, and the TPU block."""
    name, namespace, labels = parse_metadata(r, body, kind.name_max, kind.child)
    spec = r.mapping(body, "spec", "spec", kind.spec_fields)
    if body.get("spec") is None:
        r.error("spec", None, "is required")
    tpu = parse_tpu(r, spec, kind.tpu_fields, kind.slices_reason)
    image = r.value(spec, "image", "spec.image", str, required=True, check=image_reference)
    ray_version = r.value(spec, "rayVersion", "spec.rayVersion", str, default=DEFAULTS["rayVersion"], check=ray_version_check(kind.min_ray, kind.min_ray_why))
    runtime_env = parse_runtime_env(r, spec, operator_env)
    env = parse_env(r, spec, operator_env)
    head, head_block = parse_resources(r, spec, "head", HEAD_FIELDS)
    worker, _ = parse_resources(r, spec, "worker", RESOURCE_FIELDS)
    head_selector = parse_node_selector(r, head_block, "nodeSelector", "spec.head.nodeSelector")
    tolerations = parse_tolerations(r, spec)
    service_account = r.value(spec, "serviceAccountName", "spec.serviceAccountName", str, check=string(253, re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"), "a DNS subdomain name"))
    node_selector = parse_node_selector(r, spec, "nodeSelector", "spec.nodeSelector")
    queue_name = r.value(spec, "queueName", "spec.queueName", str, check=string(63, LABEL_VALUE, "a label value (the Kueue LocalQueue's name)"))
    priority = r.value(spec, "priorityClassName", "spec.priorityClassName", str,
                       check=string(63, LABEL_VALUE, "a label value (the Kueue WorkloadPriorityClass's name)"))
    if priority is not None and queue_name is None:
        r.error("spec.priorityClassName", priority, "must not be set without spec.queueName: Kueue orders and "
                "preempts only the work it queues")
    volumes = storage.parse_volumes(r, spec)
    sidecar = storage.parse_sidecar(r, spec, volumes)
    for role, resources in (("head", head), ("worker", worker)):
        disk = storage.node_disk(volumes, role)
        if problem := storage.ephemeral_storage_problem(resources.ephemeral_storage, disk, role):
            r.error(f"spec.{role}.ephemeralStorage", resources.ephemeral_storage, problem)
        if storage.has_sidecar(volumes, role) and (
                problem := storage.sidecar_limit_problem(sidecar, resources.ephemeral_storage, disk, role)):
            r.error("spec.gcsFuseSidecar.ephemeralStorageLimit", sidecar[storage.SIDECAR_DISK_LIMIT], problem)
    security_context = parse_security_context(r, spec)
    automount = r.value(spec, "automountServiceAccountToken", "spec.automountServiceAccountToken", bool)
    if automount is None:
        automount = mounts_token_by_default(service_account)
    fields = dict(
        name=name, namespace=namespace, labels=labels, image=image, ray_version=ray_version,
        runtime_env=runtime_env, env=env, head=head, worker=worker, head_node_selector=head_selector,
        tolerations=tolerations, service_account_name=service_account, node_selector=node_selector,
        queue_name=queue_name, priority_class_name=priority, volumes=volumes, gcs_fuse_sidecar=sidecar,
        security_context=security_context, automount_service_account_token=automount,
        identity_warning=identity.missing_identity(spec) if isinstance(spec, dict) else None,
        gcs_buckets=identity.buckets(spec) if isinstance(spec, dict) else (),
    )
    return fields, spec, tpu


def mounts_token_by_default(service_account: str | None) -> bool:
    """Whether the Ray pods get their ServiceAccount's token when spec.automountServiceAccountToken is
    not given: only when the spec names a ServiceAccount, the one case a token is of use to them
    (Workload Identity: its Google Cloud credentials). Whether the GKE metadata server needs the
    token in the pod is not documented by GKE and cannot be checked here (the GCS FUSE CSI driver
    does not: kubelet hands it a token of its own, CSIDriver.spec.tokenRequests), and a pod without
    it would fail only on GKE, so it is mounted (the admission plugin's projected, expiring
    token); ``automountServiceAccountToken: false`` keeps it out. The account's RBAC is what the
    token grants: a Workload Identity account needs none. Without a named account the pods run as
    the namespace's ``default`` and need no token."""
    return service_account is not None


def common_fields(fields: dict, tpu: TPU) -> dict:
    """The CommonSpec keyword arguments, once the parse found no error."""
    assert tpu.slice is not None  # no errors means the slice resolved
    return {**fields, "slice": tpu.slice, "spot": tpu.spot, "reservation": tpu.reservation}
