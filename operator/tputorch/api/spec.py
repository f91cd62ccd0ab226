"""TPUTorchJob / TPUTorchService body -> validated JobSpec / ServiceSpec, or every error at once.

This module holds every validation rule. Both kinds share one parser for their common blocks (tpu,
image, env, head, worker, ...); each adds only its own block. The CRD (crd.py) repeats the subset that the API server
can check at admission; the two are kept in agreement by tests. ``parse`` never raises anything
but ``InvalidSpec``, whatever it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import Any

from . import topology
from .topology import Slice, TopologyError

RAYJOB_NAME_MAX = 47  # KubeRay: the RayCluster name <rayjob>-<5 chars> must stay a valid label
# KubeRay's limit for a RayService name (its RayCluster is <name>-<5 chars> too); the Serve
# Service <name>-serve-svc (10 more characters) stays within a 63-character label below it.
RAYSERVICE_NAME_MAX = 47
JOB_KIND = "TPUTorchJob"
SERVICE_KIND = "TPUTorchService"
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
RAY_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
ENV_SOURCES = ("configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef")
MIN_RAY_VERSION = (2, 59, 0)  # first Ray whose TorchTrainer runs on TPU (tpu_dist backend)
# The LLMConfig a service renders (accelerator_config with a TPU topology) is checked against 2.60.
SERVICE_MIN_RAY_VERSION = (2, 60, 0)
MAX_STRING = 4096
INT32_MAX = 2**31 - 1  # KubeRay's int32 fields
MAX_ENTRYPOINT = 65536

# Environment variables a user may not set: they would undo chip isolation or the slice shape.
FORBIDDEN_ENV = {
    "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS": "it switches Ray's per-worker chip isolation off",
    "TPU_VISIBLE_CHIPS": "Ray sets it per worker to the chips that worker was given",
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

SINGLE_SLICE_REASON = (
    "must be 1: a TPUTorchJob runs on one slice. Ray 2.59's PyTorch backend raises for training "
    "across slices, and multi-slice PyTorch on TPU is not verified on hardware in Ray 2.60"
)
SERVICE_SINGLE_SLICE_REASON = (
    "must be 1: each model replica of a TPUTorchService is one whole slice; "
    "serve more with spec.replicas (one slice per replica)"
)


@dataclass(frozen=True)
class FieldError:
    path: str
    value: Any
    message: str

    def __str__(self) -> str:
        shown = "" if self.value is None else f"{_show(self.value)} "
        return f"{self.path}: {shown}{self.message}"


class InvalidSpec(ValueError):
    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str


@dataclass(frozen=True)
class JobSpec:
    name: str
    namespace: str
    slice: Slice
    chips_per_worker: int
    spot: bool
    reservation: str | None
    image: str
    ray_version: str
    entrypoint: str
    runtime_env: dict
    env: tuple
    head: Resources
    worker: Resources
    tolerations: tuple
    service_account_name: str | None
    node_selector: dict
    head_node_selector: dict
    suspend: bool
    queue_name: str | None
    active_deadline_seconds: int | None
    backoff_limit: int
    ttl_seconds_after_finished: int | None
    shutdown_after_job_finishes: bool
    labels: dict = field(default_factory=dict)

    @property
    def workers(self) -> int:
        return self.slice.workers(self.chips_per_worker)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_MISSING = object()


class _Reader:
    """Reads typed values out of a nested mapping, recording a FieldError per bad value."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def error(self, path: str, value: Any, message: str) -> None:
        self.errors.append(FieldError(path, value, message))

    def mapping(self, obj: Mapping, key: str, path: str, allowed: set[str] | None = None) -> dict:
        value = obj.get(key, _MISSING) if isinstance(obj, Mapping) else _MISSING
        if value is _MISSING or value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, value, "must be an object")
            return {}
        if allowed is not None:
            for unknown in sorted(set(map(str, value)) - allowed):
                self.error(f"{path}.{unknown}", value[unknown], f"is not a known field; known: {', '.join(sorted(allowed))}")
        return dict(value)

    def value(
        self,
        obj: Mapping,
        key: str,
        path: str,
        kind: type | tuple,
        *,
        required: bool = False,
        default: Any = None,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        value = obj.get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                self.error(path, None, "is required")
            return default
        # bool is an int in Python; never accept it where a number is asked.
        wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
        if wrong_bool or not isinstance(value, kind):
            self.error(path, value, f"must be {_type_name(kind)}")
            return default
        if check is not None:
            problem = check(value)
            if problem:
                self.error(path, value, problem)
                return default
        return value


def _type_name(kind: type | tuple) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", list: "a list", dict: "an object"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _between(low: int, high: int | None = None) -> Callable[[int], str | None]:
    def check(v: int) -> str | None:
        if v < low or (high is not None and v > high):
            if high is None or (high == INT32_MAX and v < low):
                return f"must be at least {low}"
            return f"must be between {low} and {high}"
        return None

    return check


def _string(max_len: int = MAX_STRING, pattern: re.Pattern | None = None, what: str = "") -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        if not v.strip():
            return "must not be empty"
        if len(v) > max_len:
            return f"must be at most {max_len} characters"
        if pattern is not None and not pattern.match(v):
            return f"must be {what}"
        return None

    return check


def _quantity(v: Any) -> str | None:
    return None if QUANTITY.match(str(v)) else "must be a Kubernetes quantity such as 4, 500m, 16Gi"


def _ray_version(minimum: tuple[int, int, int], why: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        m = RAY_VERSION.match(v)
        if not m:
            return "must be a Ray release such as 2.60.0"
        if tuple(int(x) for x in m.groups()) < minimum:
            return f"must be {'.'.join(map(str, minimum))} or newer: {why}"
        return None

    return check


def _string_map(r: _Reader, obj: Mapping, key: str, path: str) -> dict[str, str]:
    raw = r.mapping(obj, key, path)
    result = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not isinstance(v, str):
            r.error(f"{path}.{k}", v, "must map strings to strings")
        else:
            result[k] = v
    return result


def _env_name_problem(name: str, operator_env: Mapping[str, str]) -> str | None:
    if name in FORBIDDEN_ENV:
        return f"must not be set: {FORBIDDEN_ENV[name]}"
    if name.startswith(RESERVED_ENV_PREFIX):
        return f"must not start with {RESERVED_ENV_PREFIX}: the operator sets those from spec.tpu"
    if name in operator_env:
        return f"must not be set: {operator_env[name]}"
    return None


TPU_FIELDS = {"accelerator", "topology", "slices", "chipsPerWorker", "chipsPerHost", "spot", "reservation"}
# The blocks both kinds have, parsed by one function.
COMMON_FIELDS = {
    "tpu", "image", "rayVersion", "runtimeEnv", "env", "head", "worker", "tolerations",
    "serviceAccountName", "nodeSelector", "queueName",
}
SPEC_FIELDS = COMMON_FIELDS | {
    "entrypoint", "suspend", "activeDeadlineSeconds", "backoffLimit", "ttlSecondsAfterFinished",
    "shutdownAfterJobFinishes",
}
RESOURCE_FIELDS = {"cpu", "memory"}
HEAD_FIELDS = RESOURCE_FIELDS | {"nodeSelector"}

# TPUTorchService: vLLM picks its own device split from tensor/pipeline parallelism, so there is no
# chipsPerWorker.
SERVICE_TPU_FIELDS = TPU_FIELDS - {"chipsPerWorker"}
SERVICE_SPEC_FIELDS = COMMON_FIELDS | {"model", "engine", "replicas"}
MODEL_FIELDS = {"source", "name", "hfTokenSecret"}
SECRET_REF_FIELDS = {"name", "key"}
ENGINE_FIELDS = {"tensorParallelSize", "pipelineParallelSize", "enableExpertParallel", "maxModelLen", "args"}
REPLICA_FIELDS = {"min", "max"}
# engine.args keys the operator owns: the first-class fields (in vLLM's spelling), what Ray Serve
# LLM sets itself (model, served_model_name from spec.model) and the executor, which Ray forces
# to "ray" on TPU.
ENGINE_FIELD_ARGS = {
    "tensor_parallel_size": "spec.engine.tensorParallelSize",
    "pipeline_parallel_size": "spec.engine.pipelineParallelSize",
    "enable_expert_parallel": "spec.engine.enableExpertParallel",
    "max_model_len": "spec.engine.maxModelLen",
}
ENGINE_OWNED_ARGS = {
    "model": "Ray Serve LLM sets it from spec.model.source; use that",
    "served_model_name": "Ray Serve LLM sets it from spec.model.name; use that",
    "distributed_executor_backend": "Ray forces the ray executor on TPU",
}
SERVICE_DEFAULTS: dict[str, Any] = {
    "engine.pipelineParallelSize": 1,
    "engine.enableExpertParallel": False,
    "replicas.min": 1,
}
# Environment the operator sets on a service's pods (render.py), never the user's to repeat.
SERVICE_ENV = {
    "TPU_MULTIHOST_BACKEND": "the operator sets it to ray on multi-host slices, as Ray's TPU serving needs",
}
HF_TOKEN_ENV = "HF_TOKEN"


@dataclass(frozen=True)
class _TPU:
    slice: Slice | None
    chips_per_worker: int
    spot: bool
    reservation: str | None


def _parse_tpu(r: _Reader, spec: Mapping, allowed: set[str], slices_reason: str) -> _TPU:
    tpu = r.mapping(spec, "tpu", "spec.tpu", allowed)
    if spec.get("tpu") is None:
        r.error("spec.tpu", None, "is required")
    spot = r.value(tpu, "spot", "spec.tpu.spot", bool, default=DEFAULTS["tpu.spot"])
    reservation = r.value(tpu, "reservation", "spec.tpu.reservation", str, check=_string(63, LABEL_VALUE, "a label value (the reservation's name)"))
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
            return _TPU(None, chips_per_worker, spot, reservation)
        tpu_slice = topology.resolve(accelerator, topo, chips_per_host)
    except TopologyError as err:
        r.error(f"spec.tpu.{err.field}", err.value, err.message)
        return _TPU(None, chips_per_worker, spot, reservation)
    if tpu_slice.chips_per_host % chips_per_worker:
        r.error(
            "spec.tpu.chipsPerWorker", chips_per_worker,
            f"must divide the {tpu_slice.chips_per_host} chips of each host of a "
            f"{tpu_slice.generation.name} {tpu_slice.topology} slice",
        )
    return _TPU(tpu_slice, chips_per_worker, spot, reservation)


def _parse_env(r: _Reader, spec: Mapping, operator_env: Mapping[str, str]) -> tuple:
    env = r.value(spec, "env", "spec.env", list, default=[])
    seen: set[str] = set()
    for i, item in enumerate(env):
        path = f"spec.env[{i}]"
        if not isinstance(item, Mapping):
            r.error(path, item, "must be an object with name and value (or valueFrom)")
            continue
        for unknown in sorted(set(map(str, item)) - {"name", "value", "valueFrom"}):
            r.error(f"{path}.{unknown}", item[unknown], "is not a known field; known: name, value, valueFrom")
        name = r.value(item, "name", f"{path}.name", str, required=True, check=_string(256, ENV_NAME, "a C-style identifier such as MY_VAR"))
        r.value(item, "value", f"{path}.value", str)
        source = r.value(item, "valueFrom", f"{path}.valueFrom", Mapping)
        if source is not None and (len(source) != 1 or next(iter(source)) not in ENV_SOURCES):
            # The RayJob's schema would prune anything else and the pods could never be created.
            r.error(f"{path}.valueFrom", dict(source), f"must have exactly one of {', '.join(ENV_SOURCES)}")
        if name is None:
            continue
        problem = _env_name_problem(name, operator_env)
        if problem:
            r.error(f"{path}.name", name, problem)
        if name in seen:
            r.error(f"{path}.name", name, "must be unique within spec.env")
        seen.add(name)
    return tuple(dict(item) for item in env if isinstance(item, Mapping))


def _parse_runtime_env(r: _Reader, spec: Mapping, operator_env: Mapping[str, str]) -> dict:
    runtime_env = r.mapping(spec, "runtimeEnv", "spec.runtimeEnv")
    if "env_vars" in runtime_env:
        env_vars = _string_map(r, runtime_env, "env_vars", "spec.runtimeEnv.env_vars")
        for name in env_vars:
            problem = _env_name_problem(name, operator_env)
            if problem:
                r.error(f"spec.runtimeEnv.env_vars.{name}", env_vars[name], problem)
    return runtime_env


def _parse_resources(r: _Reader, spec: Mapping, key: str, allowed: set[str]) -> tuple[Resources, dict]:
    block = r.mapping(spec, key, f"spec.{key}", allowed)
    cpu = r.value(block, "cpu", f"spec.{key}.cpu", (str, int), default=DEFAULTS[f"{key}.cpu"], check=_quantity)
    memory = r.value(block, "memory", f"spec.{key}.memory", (str, int), default=DEFAULTS[f"{key}.memory"], check=_quantity)
    return Resources(str(cpu), str(memory)), block


def _parse_tolerations(r: _Reader, spec: Mapping) -> tuple:
    tolerations = r.value(spec, "tolerations", "spec.tolerations", list, default=[])
    for i, tol in enumerate(tolerations):
        path = f"spec.tolerations[{i}]"
        if not isinstance(tol, Mapping):
            r.error(path, tol, "must be an object (a Kubernetes toleration)")
            continue
        r.value(tol, "key", f"{path}.key", str)
        r.value(tol, "value", f"{path}.value", str)
        r.value(tol, "operator", f"{path}.operator", str, check=lambda v: None if v in ("Exists", "Equal") else "must be Exists or Equal")
        r.value(tol, "effect", f"{path}.effect", str, check=lambda v: None if v in ("NoSchedule", "PreferNoSchedule", "NoExecute") else "must be NoSchedule, PreferNoSchedule or NoExecute")
        r.value(tol, "tolerationSeconds", f"{path}.tolerationSeconds", int)
    return tuple(dict(t) for t in tolerations if isinstance(t, Mapping))


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


def _parse_node_selector(r: _Reader, spec: Mapping, key: str, path: str) -> dict[str, str]:
    selector = _string_map(r, spec, key, path)
    for k, v in selector.items():
        # Label syntax: the RayJob's schema does not check it, so the pods would be refused later.
        if not _label_key_ok(k):
            r.error(f"{path}", k, "keys must be label names ([prefix/]name, name at most 63 characters of [-A-Za-z0-9_.])")
        if len(v) > 63 or not LABEL_VALUE.match(v):
            r.error(f"{path}.{k}", v, "must be a label value (at most 63 characters of [-A-Za-z0-9_.])")
    for label in (topology.GKE_ACCELERATOR_LABEL, topology.GKE_TOPOLOGY_LABEL):
        if label in selector:
            r.error(f"{path}.{label}", selector[label], "must not be set: the operator derives it from spec.tpu")
    return selector


def _parse_metadata(r: _Reader, body: Mapping, max_len: int, child: str) -> tuple[str, str, dict]:
    metadata = body.get("metadata") if isinstance(body.get("metadata"), Mapping) else {}
    dns = _string(MAX_STRING, DNS1035, f"a DNS-1035 label (lowercase letters, digits, '-', starting with a letter) of at most {max_len} characters, since the {child} takes this name")

    def check(v: str) -> str | None:
        if len(v) > max_len:
            return f"must be at most {max_len} characters, since the {child} takes this name (KubeRay's limit)"
        return dns(v)

    name = r.value(metadata, "name", "metadata.name", str, required=True, default="", check=check)
    namespace = r.value(metadata, "namespace", "metadata.namespace", str, default="default")
    labels = metadata.get("labels") if isinstance(metadata.get("labels"), Mapping) else {}
    return name, namespace or "default", {str(k): str(v) for k, v in labels.items()}


@dataclass(frozen=True)
class _Kind:
    """What differs between the kinds in their common blocks."""

    name: str
    spec_fields: set[str]
    tpu_fields: set[str]
    slices_reason: str
    name_max: int
    child: str  # the KubeRay object that takes the name
    min_ray: tuple[int, int, int]
    min_ray_why: str


JOB = _Kind(JOB_KIND, SPEC_FIELDS, TPU_FIELDS, SINGLE_SLICE_REASON, RAYJOB_NAME_MAX, "RayJob", MIN_RAY_VERSION,
            "older Ray cannot run PyTorch on TPU")
SERVICE = _Kind(SERVICE_KIND, SERVICE_SPEC_FIELDS, SERVICE_TPU_FIELDS, SERVICE_SINGLE_SLICE_REASON, RAYSERVICE_NAME_MAX,
                "RayService", SERVICE_MIN_RAY_VERSION, "the TPU LLMConfig the operator writes is checked against Ray 2.60")


@dataclass(frozen=True)
class _Common:
    name: str
    namespace: str
    labels: dict
    spec: dict  # the raw spec block, for the kind's own fields
    tpu: _TPU
    image: str
    ray_version: str
    runtime_env: dict
    env: tuple
    head: Resources
    worker: Resources
    head_node_selector: dict
    tolerations: tuple
    service_account_name: str | None
    node_selector: dict
    queue_name: str | None


def _parse_common(r: _Reader, body: Any, kind: _Kind, operator_env: Mapping[str, str]) -> _Common:
    """The blocks both kinds share; errors go to ``r``."""
    name, namespace, labels = _parse_metadata(r, body, kind.name_max, kind.child)
    spec = r.mapping(body, "spec", "spec", kind.spec_fields)
    if body.get("spec") is None:
        r.error("spec", None, "is required")
    tpu = _parse_tpu(r, spec, kind.tpu_fields, kind.slices_reason)
    image = r.value(spec, "image", "spec.image", str, required=True, check=_string(what="an image reference"))
    ray_version = r.value(spec, "rayVersion", "spec.rayVersion", str, default=DEFAULTS["rayVersion"], check=_ray_version(kind.min_ray, kind.min_ray_why))
    runtime_env = _parse_runtime_env(r, spec, operator_env)
    env = _parse_env(r, spec, operator_env)
    head, head_block = _parse_resources(r, spec, "head", HEAD_FIELDS)
    worker, _ = _parse_resources(r, spec, "worker", RESOURCE_FIELDS)
    head_selector = _parse_node_selector(r, head_block, "nodeSelector", "spec.head.nodeSelector")
    tolerations = _parse_tolerations(r, spec)
    service_account = r.value(spec, "serviceAccountName", "spec.serviceAccountName", str, check=_string(253, re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"), "a DNS subdomain name"))
    node_selector = _parse_node_selector(r, spec, "nodeSelector", "spec.nodeSelector")
    queue_name = r.value(spec, "queueName", "spec.queueName", str, check=_string(63, LABEL_VALUE, "a label value (the Kueue LocalQueue's name)"))
    return _Common(
        name=name, namespace=namespace, labels=labels, spec=spec, tpu=tpu, image=image, ray_version=ray_version,
        runtime_env=runtime_env, env=env, head=head, worker=worker, head_node_selector=head_selector,
        tolerations=tolerations, service_account_name=service_account, node_selector=node_selector,
        queue_name=queue_name,
    )


def _common_fields(c: _Common) -> dict:
    """The shared attributes both spec classes carry under the same names."""
    assert c.tpu.slice is not None  # no errors means the slice resolved
    return dict(
        name=c.name, namespace=c.namespace, labels=c.labels, slice=c.tpu.slice, spot=c.tpu.spot,
        reservation=c.tpu.reservation, image=c.image, ray_version=c.ray_version, runtime_env=c.runtime_env,
        env=c.env, head=c.head, worker=c.worker, head_node_selector=c.head_node_selector,
        tolerations=c.tolerations, service_account_name=c.service_account_name, node_selector=c.node_selector,
        queue_name=c.queue_name,
    )


def parse(body: Any) -> JobSpec:
    """Validate a TPUTorchJob object (as a dict) and return its JobSpec; InvalidSpec lists every error."""
    r = _Reader()
    if not isinstance(body, Mapping):
        raise InvalidSpec([FieldError("", body, "must be a TPUTorchJob object")])
    c = _parse_common(r, body, JOB, {})
    spec = c.spec
    entrypoint = r.value(spec, "entrypoint", "spec.entrypoint", str, required=True, check=_string(MAX_ENTRYPOINT))
    shutdown = r.value(spec, "shutdownAfterJobFinishes", "spec.shutdownAfterJobFinishes", bool, default=DEFAULTS["shutdownAfterJobFinishes"])
    suspend = r.value(spec, "suspend", "spec.suspend", bool, default=DEFAULTS["suspend"])
    deadline = r.value(spec, "activeDeadlineSeconds", "spec.activeDeadlineSeconds", int, check=_between(1, INT32_MAX))
    backoff = r.value(spec, "backoffLimit", "spec.backoffLimit", int, default=DEFAULTS["backoffLimit"], check=_between(0, 100))
    ttl = r.value(spec, "ttlSecondsAfterFinished", "spec.ttlSecondsAfterFinished", int, check=_between(0, INT32_MAX))
    # KubeRay's own rules: both only make sense when the RayCluster is deleted after the job.
    if ttl is not None and not shutdown:
        r.error("spec.ttlSecondsAfterFinished", ttl, "must not be set unless spec.shutdownAfterJobFinishes is true")
    if suspend and not shutdown:
        r.error("spec.suspend", suspend, "must not be true unless spec.shutdownAfterJobFinishes is true")

    if r.errors:
        raise InvalidSpec(r.errors)
    return JobSpec(
        **_common_fields(c),
        chips_per_worker=c.tpu.chips_per_worker,
        entrypoint=entrypoint,
        suspend=suspend,
        active_deadline_seconds=deadline,
        backoff_limit=backoff,
        ttl_seconds_after_finished=ttl,
        shutdown_after_job_finishes=shutdown,
    )


@dataclass(frozen=True)
class ServiceSpec:
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
    model_source: str
    model_name: str
    hf_token_secret: tuple[str, str] | None  # (Secret name, key)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    enable_expert_parallel: bool
    max_model_len: int | None
    engine_args: dict
    min_replicas: int
    max_replicas: int
    labels: dict = field(default_factory=dict)

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas > self.min_replicas


def _arg_key(key: str) -> str:
    """One spelling for every way a vLLM argument is written: tensor_parallel_size,
    tensorParallelSize and tensor-parallel-size are the same argument."""
    return re.sub(r"[-_]", "", key).lower()


_FIELD_ARG_KEYS = {_arg_key(k): (k, where) for k, where in ENGINE_FIELD_ARGS.items()}
_OWNED_ARG_KEYS = {_arg_key(k): (k, why) for k, why in ENGINE_OWNED_ARGS.items()}


def _parse_engine_args(r: _Reader, engine: Mapping) -> dict:
    args = r.mapping(engine, "args", "spec.engine.args")
    for key, value in args.items():
        path = f"spec.engine.args.{key}"
        if not isinstance(key, str) or not key:
            r.error("spec.engine.args", key, "keys must be non-empty strings (vLLM engine argument names)")
            continue
        normal = _arg_key(key)
        if normal in _FIELD_ARG_KEYS:
            name, where = _FIELD_ARG_KEYS[normal]
            r.error(path, value, f"must not be set in spec.engine.args: {name} is {where}; set it there")
        elif normal in _OWNED_ARG_KEYS:
            name, why = _OWNED_ARG_KEYS[normal]
            r.error(path, value, f"must not be set: {why}")
    return args


def _secret_key(v: str) -> str | None:
    if not re.match(r"^[-._a-zA-Z0-9]+$", v) or len(v) > 253:
        return "must be a Secret key (at most 253 characters of [-._a-zA-Z0-9])"
    return None


def parse_service(body: Any) -> ServiceSpec:
    """Validate a TPUTorchService object (as a dict) and return its ServiceSpec; InvalidSpec lists every error."""
    r = _Reader()
    if not isinstance(body, Mapping):
        raise InvalidSpec([FieldError("", body, "must be a TPUTorchService object")])
    model = body.get("spec", {}).get("model") if isinstance(body.get("spec"), Mapping) else None
    token_secret_set = isinstance(model, Mapping) and model.get("hfTokenSecret") is not None
    operator_env = dict(SERVICE_ENV)
    if token_secret_set:
        operator_env[HF_TOKEN_ENV] = "the operator sets it from spec.model.hfTokenSecret"
    c = _parse_common(r, body, SERVICE, operator_env)
    spec = c.spec

    model = r.mapping(spec, "model", "spec.model", MODEL_FIELDS)
    if spec.get("model") is None:
        r.error("spec.model", None, "is required")
    source = r.value(model, "source", "spec.model.source", str, required=isinstance(spec.get("model"), Mapping),
                     check=_string(what="a Hugging Face repo id, a gs:// path or a path on the hosts"))
    model_name = r.value(model, "name", "spec.model.name", str, default=c.name, check=_string(253))
    secret = r.mapping(model, "hfTokenSecret", "spec.model.hfTokenSecret", SECRET_REF_FIELDS)
    hf_token_secret = None
    if secret:
        secret_name = r.value(secret, "name", "spec.model.hfTokenSecret.name", str, required=True,
                              check=_string(253, DNS1123_SUBDOMAIN, "a Secret name (a DNS subdomain)"))
        secret_key = r.value(secret, "key", "spec.model.hfTokenSecret.key", str, required=True, check=_secret_key)
        if secret_name and secret_key:
            hf_token_secret = (secret_name, secret_key)

    engine = r.mapping(spec, "engine", "spec.engine", ENGINE_FIELDS)
    chips = c.tpu.slice.chips if c.tpu.slice else None
    tp = r.value(engine, "tensorParallelSize", "spec.engine.tensorParallelSize", int, check=_between(1, INT32_MAX))
    pp = r.value(engine, "pipelineParallelSize", "spec.engine.pipelineParallelSize", int,
                 default=SERVICE_DEFAULTS["engine.pipelineParallelSize"], check=_between(1, INT32_MAX))
    expert = r.value(engine, "enableExpertParallel", "spec.engine.enableExpertParallel", bool,
                     default=SERVICE_DEFAULTS["engine.enableExpertParallel"])
    max_model_len = r.value(engine, "maxModelLen", "spec.engine.maxModelLen", int, check=_between(1, INT32_MAX))
    engine_args = _parse_engine_args(r, engine)
    if tp is None and chips is not None and pp is not None:
        tp = chips // pp if chips % pp == 0 else None
        if tp is None:
            r.error("spec.engine.pipelineParallelSize", pp,
                    f"must divide the {chips} chips of the slice (tensorParallelSize defaults to chips / pipelineParallelSize)")
    elif tp is not None and pp is not None and chips is not None and tp * pp != chips:
        s = c.tpu.slice
        r.error("spec.engine.tensorParallelSize", tp,
                f"x spec.engine.pipelineParallelSize {pp} = {tp * pp} chips, but one replica is one whole "
                f"{s.generation.name} {s.topology} slice: tensorParallelSize x pipelineParallelSize must be {chips}")
    if c.tpu.slice is not None:
        s = c.tpu.slice
        default_layout = topology.host_layouts(s.generation, s.topology)[0]
        if s.chips_per_host != default_layout:
            # Ray Serve LLM reserves the slice from its topology alone (slice_placement_group), and
            # Ray maps this topology to hosts of default_layout chips: other hosts never match.
            r.error("spec.tpu.chipsPerHost", s.chips_per_host,
                    f"must be {default_layout} for a TPUTorchService on a {s.generation.name} {s.topology} slice: "
                    f"Ray Serve LLM reserves the slice by its topology, which Ray maps to {default_layout}-chip hosts")

    replicas = r.mapping(spec, "replicas", "spec.replicas", REPLICA_FIELDS)
    min_replicas = r.value(replicas, "min", "spec.replicas.min", int, default=SERVICE_DEFAULTS["replicas.min"], check=_between(1, INT32_MAX))
    max_replicas = r.value(replicas, "max", "spec.replicas.max", int, default=min_replicas, check=_between(1, INT32_MAX))
    if min_replicas is not None and max_replicas is not None and max_replicas < min_replicas:
        r.error("spec.replicas.max", max_replicas, f"must be at least spec.replicas.min ({min_replicas})")

    if r.errors:
        raise InvalidSpec(r.errors)
    return ServiceSpec(
        **_common_fields(c),
        model_source=source,
        model_name=model_name,
        hf_token_secret=hf_token_secret,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        enable_expert_parallel=expert,
        max_model_len=max_model_len,
        engine_args=engine_args,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
    )


PARSERS: dict[str, Callable[[Any], Any]] = {JOB_KIND: parse, SERVICE_KIND: parse_service}


def parse_any(body: Any) -> JobSpec | ServiceSpec:
    """Parse a body of either kind, chosen by its ``kind``."""
    kind = body.get("kind") if isinstance(body, Mapping) else None
    if not isinstance(kind, str) or kind not in PARSERS:
        raise InvalidSpec([FieldError("kind", kind, f"must be {' or '.join(PARSERS)}")])
    return PARSERS[kind](body)
