"""spec.groups of a TPUTorchJob: worker groups that join the job's Ray cluster beside the training
slice (rollout engines, reward models, verifiers), each a TPU slice group, a GPU group or a CPU group.

The training stays on the job's own slice (spec.tpu, KubeRay group ``tpu-slice``); a group is
something the script places work on by its Ray node label ``tputorch.io/group: <name>``. The
rules here are the operator's; ``schema()`` is the CRD's admission-time subset, from the same tables.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import topology
from .common import DEFAULTS, DNS1035, IMAGE, LABEL_VALUE, RESOURCE_RULES, image_reference, label_key_ok, parse_env, resource_schema
from .reader import MAX_STRING, FieldError, Reader, between, string, string_map
from .topology import Slice, TopologyError

# Under Kueue a RayJob is one Workload whose spec.podSets hold the head, one per worker group and,
# in K8sJobMode (what the operator renders), the submitter Job (Kueue's rayjob PodSets()); the
# Workload CRD caps that list (spec.podSets maxItems): 8 in Kueue 0.17, 18 in 0.19. So a queued job
# may have that cap minus 3 groups (head, submitter, the training slice). Kueue's own RayJob webhook
# does not count the submitter (0.19: worker groups + 1 <= 18), so a job past this cap would pass it
# and then never get its Workload. The operator reads the installed cap (controller/) and applies
# this rule before it creates a queued RayJob; a cap it cannot read is taken as the smallest of the
# Kueue versions known (KUEUE_SAFE_PODSETS).
PODSETS_BESIDE_GROUPS = 3  # head, submitter, the training slice
KUEUE_SAFE_PODSETS = 8  # Kueue 0.17's cap, the smallest known
# The CRD's own bound, Kueue or not: not below what the newest Kueue known admits (0.19: 15), so that
# a queued job meets the installed Kueue's cap, not this one; bounded, as every list of the CRD is.
MAX_GROUPS = 16


@dataclass(frozen=True)
class KueuePodSets:
    """The installed Kueue's cap on pod sets per Workload, and where the operator learnt it."""
    max_podsets: int
    source: str  # for the refusal: "the installed Kueue's Workload CRD", or why that could not be read


def max_groups_under_kueue(max_podsets: int) -> int:
    """spec.groups a queued TPUTorchJob may have when Kueue's Workloads take ``max_podsets`` pod sets."""
    return max(0, max_podsets - PODSETS_BESIDE_GROUPS)


def kueue_groups_error(groups: int, kueue: KueuePodSets) -> FieldError | None:
    """The refusal of a queued job with more groups than the installed Kueue admits, or None."""
    cap = max_groups_under_kueue(kueue.max_podsets)
    if groups <= cap:
        return None
    return FieldError("spec.groups", f"{groups} groups",
                      f"must hold at most {cap} groups while spec.queueName is set: Kueue admits a RayJob as one "
                      f"Workload of at most {kueue.max_podsets} pod sets ({kueue.source}), and the head, the "
                      f"submitter and the training slice take {PODSETS_BESIDE_GROUPS}")


from ..train import TRAIN_GROUP  # the KubeRay worker group of the training slice (render/names.py WORKER_GROUP)
# Kueue reserves "head" (its head podSet) and "submitter"; the training slice's group is ours.
RESERVED_NAMES = {TRAIN_GROUP: "the training slice's worker group", "head": "Kueue's head podSet",
                  "submitter": "Kueue's submitter podSet"}
NAME_MAX = 20  # KubeRay names each pod <rayjob>-<5>-<group>-worker-<5>; keep it short and readable
MAX_REPLICAS = 64
MAX_TPU_REPLICAS = 16  # slices per TPU group

# GPUs on GKE: node label cloud.google.com/gke-accelerator -> GPUs per node of the machine shapes GKE
# offers for it (GKE's GPU docs: N1 for T4/V100/P100/P4, G2 for L4, A2 for A100, A3 for H100/H200,
# A4/A4X for B200/GB200, G4 for RTX PRO 6000).
GPU_TYPES: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-p4": (1, 2, 4),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-l4": (1, 2, 4, 8),
    "nvidia-tesla-a100": (1, 2, 4, 8, 16),
    "nvidia-a100-80gb": (1, 2, 4, 8),
    "nvidia-h100-80gb": (1, 2, 4, 8),
    "nvidia-h100-mega-80gb": (8,),
    "nvidia-h200-141gb": (8,),
    "nvidia-b200": (8,),
    "nvidia-gb200": (4,),
    "nvidia-rtx-pro-6000": (1, 2, 4, 8),
}
GPU_RESOURCE = "nvidia.com/gpu"
GKE_GPU_LABEL = "cloud.google.com/gke-accelerator"

GROUP_FIELDS = {"name", "tpu", "gpu", "replicas", "image", "cpu", "memory", "nodeSelector", "env"}
# Ray sets TPU_VISIBLE_CHIPS per worker to the chips it was given; with this set it does not, and
# every process of the host sees all its chips. verl's TPU recipe sets it for the rollout engines
# (vLLM places itself on the host's chips, one engine per host). A group's env may set it, never
# spec.env (the training slice's workers would share chips): the status warns of it (status/job.py).
NOSET_VISIBLE_CHIPS = "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS"
GROUP_ENV_ALLOWED = frozenset({NOSET_VISIBLE_CHIPS})
GROUP_TPU_FIELDS = {"accelerator", "topology", "chipsPerHost", "spot", "reservation"}
GPU_FIELDS = {"type", "count"}


@dataclass(frozen=True)
class Group:
    name: str
    kind: str  # "tpu", "gpu" or "cpu"
    replicas: int  # slices for a TPU group, pods (one Ray node each) otherwise
    image: str
    cpu: str
    memory: str
    node_selector: dict
    slice: Slice | None = None  # TPU
    spot: bool = False
    reservation: str | None = None
    gpu_type: str | None = None  # GPU
    gpus: int = 0
    env: tuple[dict, ...] = ()  # the group's own, after spec.env in its containers

    @property
    def manages_own_chips(self) -> bool:
        """Its env switches Ray's per-worker chip isolation off (NOSET_VISIBLE_CHIPS)."""
        return any(e.get("name") == NOSET_VISIBLE_CHIPS for e in self.env)

    @property
    def hosts(self) -> int:
        """Pods (Ray nodes) per replica: a TPU slice's hosts, one otherwise."""
        return self.slice.hosts if self.slice else 1


def _parse_tpu(r: Reader, block: Mapping, path: str) -> tuple[Slice | None, bool, str | None]:
    spot = r.value(block, "spot", f"{path}.spot", bool, default=False)
    reservation = r.value(block, "reservation", f"{path}.reservation", str, check=string(63, LABEL_VALUE, "a label value (the reservation's name)"))
    if reservation and spot:
        r.error(f"{path}.reservation", reservation, f"must not be set together with {path}.spot: a slice is either reserved or spot capacity")
    accelerator = r.value(block, "accelerator", f"{path}.accelerator", str, required=True)
    topo = r.value(block, "topology", f"{path}.topology", str, required=True)
    chips_per_host = r.value(block, "chipsPerHost", f"{path}.chipsPerHost", int)
    if accelerator is None or topo is None:
        return None, spot, reservation
    try:
        return topology.resolve(accelerator, topo, chips_per_host), spot, reservation
    except TopologyError as err:
        r.error(f"{path}.{err.field}", err.value, err.message)
        return None, spot, reservation


def _parse_gpu(r: Reader, block: Mapping, path: str) -> tuple[str | None, int]:
    gpu_type = r.value(block, "type", f"{path}.type", str, required=True,
                       check=lambda v: None if v in GPU_TYPES else f"must be a GPU type GKE offers (its {GKE_GPU_LABEL} label): {', '.join(GPU_TYPES)}")
    count = r.value(block, "count", f"{path}.count", int, default=1, check=between(1, 16))
    if gpu_type and count and count not in GPU_TYPES[gpu_type]:
        r.error(f"{path}.count", count, f"must be one of {', '.join(map(str, GPU_TYPES[gpu_type]))}: the GPUs per node of GKE's {gpu_type} machine shapes")
    return gpu_type, count or 0


def _parse_group(r: Reader, item: Any, path: str, job_image: str | None, operator_env: Mapping[str, str]) -> Group | None:
    if not isinstance(item, Mapping):
        r.error(path, item, "must be an object with name and, for an accelerator group, tpu or gpu")
        return None
    for unknown in sorted(set(map(str, item)) - GROUP_FIELDS):
        r.error(f"{path}.{unknown}", item[unknown], f"is not a known field; known: {', '.join(sorted(GROUP_FIELDS))}")

    def name_check(v: str) -> str | None:
        if v in RESERVED_NAMES:
            return f"is reserved ({RESERVED_NAMES[v]}); choose another name"
        if len(v) > NAME_MAX or not DNS1035.fullmatch(v):
            return f"must be a DNS-1035 label (lowercase letters, digits, '-', starting with a letter) of at most {NAME_MAX} characters"
        return None

    name = r.value(item, "name", f"{path}.name", str, required=True, check=name_check)
    tpu_block = r.mapping(item, "tpu", f"{path}.tpu", GROUP_TPU_FIELDS)
    gpu_block = r.mapping(item, "gpu", f"{path}.gpu", GPU_FIELDS)
    kind = "tpu" if item.get("tpu") is not None else "gpu" if item.get("gpu") is not None else "cpu"
    if item.get("tpu") is not None and item.get("gpu") is not None:
        r.error(f"{path}.gpu", item.get("gpu"), f"must not be set together with {path}.tpu: a group is a TPU slice, GPUs or CPUs only")
    tpu_slice, spot, reservation, gpu_type, gpus = None, False, None, None, 0
    if isinstance(item.get("tpu"), Mapping):
        tpu_slice, spot, reservation = _parse_tpu(r, tpu_block, f"{path}.tpu")
    if isinstance(item.get("gpu"), Mapping):  # both given: that is an error, and each block's own too
        gpu_type, gpus = _parse_gpu(r, gpu_block, f"{path}.gpu")
    high = MAX_TPU_REPLICAS if kind == "tpu" else MAX_REPLICAS
    replicas = r.value(item, "replicas", f"{path}.replicas", int, default=1, check=between(1, high))
    image = r.value(item, "image", f"{path}.image", str, default=job_image, check=image_reference)
    cpu = r.value(item, "cpu", f"{path}.cpu", (str, int), default=DEFAULTS["worker.cpu"], check=RESOURCE_RULES["cpu"])
    memory = r.value(item, "memory", f"{path}.memory", (str, int), default=DEFAULTS["worker.memory"], check=RESOURCE_RULES["memory"])
    selector = string_map(r, item, "nodeSelector", f"{path}.nodeSelector")
    for k, v in selector.items():
        if not label_key_ok(k):
            r.error(f"{path}.nodeSelector", k, "keys must be label names ([prefix/]name, name at most 63 characters of [-A-Za-z0-9_.])")
        if len(v) > 63 or not LABEL_VALUE.fullmatch(v):
            r.error(f"{path}.nodeSelector.{k}", v, "must be a label value (at most 63 characters of [-A-Za-z0-9_.])")
    for label in (*topology.SLICE_LABELS, GKE_GPU_LABEL):
        if label in selector:
            r.error(f"{path}.nodeSelector.{label}", selector[label], f"must not be set: the operator derives it from {path}.tpu / {path}.gpu")
    env = parse_env(r, item, operator_env, f"{path}.env", GROUP_ENV_ALLOWED)
    if name is None or replicas is None or (kind == "tpu" and tpu_slice is None) or (kind == "gpu" and gpu_type is None):
        return None
    return Group(name=name, kind=kind, replicas=replicas, image=image or "", cpu=str(cpu), memory=str(memory),
                 node_selector=selector, slice=tpu_slice, spot=spot, reservation=reservation, gpu_type=gpu_type, gpus=gpus,
                 env=env)


def describe(group: Group) -> str:
    """One group in a line, for tputorch validate."""
    n = group.replicas
    if group.slice is not None:
        s = group.slice
        what = f"{n} {s.generation.name} {s.topology} slice(s) of {s.hosts} host(s) x {s.chips_per_host} chips"
    elif group.gpu_type is not None:
        what = f"{n} pod(s) x {group.gpus} {group.gpu_type}"
    else:
        what = f"{n} CPU pod(s)"
    return f"{group.name} ({what})"


def parse_groups(r: Reader, spec: Mapping, job_image: str | None, operator_env: Mapping[str, str]) -> tuple[Group, ...]:
    """spec.groups; every error goes to ``r``. ``operator_env``: the names the operator sets (refused in a group's env)."""
    items = r.value(spec, "groups", "spec.groups", list, default=[])
    if len(items) > MAX_GROUPS:
        r.error("spec.groups", f"{len(items)} groups",
                f"must hold at most {MAX_GROUPS} groups (the operator's bound; with spec.queueName, Kueue's cap on pod "
                f"sets per Workload minus {PODSETS_BESIDE_GROUPS}: 5 on Kueue 0.17, 15 on 0.19)")
    groups, seen = [], set()
    for i, item in enumerate(items):
        group = _parse_group(r, item, f"spec.groups[{i}]", job_image, operator_env)
        name = item.get("name") if isinstance(item, Mapping) else None
        if isinstance(name, str) and name in seen:
            r.error(f"spec.groups[{i}].name", name, "must be unique within spec.groups")
        seen.add(name)
        if group is not None:
            groups.append(group)
    return tuple(groups)


# -- the CRD's subset ----------------------------------------------------------------------------

def schema(tpu_topology_rule: dict, env_schema: dict) -> dict:
    """spec.groups in the TPUTorchJob CRD. ``tpu_topology_rule`` is the job's own topology rule
    (schema.topology_rule), reused for a group's tpu block; ``env_schema`` spec.env's
    (schema.env_schema), for a group's env."""
    gpu_counts = json.dumps({t: list(c) for t, c in GPU_TYPES.items()}, separators=(",", ":"))
    allowed_counts = json.dumps({t: ", ".join(map(str, c)) for t, c in GPU_TYPES.items()}, separators=(",", ":"))
    accelerators = sorted(topology.ACCELERATOR_ALIASES)
    return {
        "description": (
            "Worker groups that join the job's Ray cluster beside the training slice (rollout engines, "
            "reward models, verifiers): a TPU slice group (tpu), a GPU group (gpu) or, with neither, CPUs "
            "only. Each group's Ray nodes carry the Ray label tputorch.io/group=<name>. "
            f"At most {MAX_GROUPS}; with queueName, the installed Kueue's cap on pod sets per Workload minus "
            f"{PODSETS_BESIDE_GROUPS} (5 on Kueue 0.17, 15 on 0.19)."
        ),
        "type": "array",
        "maxItems": MAX_GROUPS,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "description": "Group name: the Ray label tputorch.io/group and KubeRay's groupName.",
                         "minLength": 1, "maxLength": NAME_MAX, "pattern": DNS1035.pattern},
                "tpu": {
                    "type": "object",
                    "description": "A TPU slice group: each replica is one whole slice (its own node pool).",
                    "required": ["accelerator", "topology"],
                    "properties": {
                        "accelerator": {"type": "string", "enum": accelerators, "maxLength": max(map(len, accelerators))},
                        "topology": {"type": "string", "maxLength": 12,
                                     "pattern": r"^[1-9][0-9]{0,2}x[1-9][0-9]{0,2}(x[1-9][0-9]{0,2})?$"},
                        "chipsPerHost": {"type": "integer", "format": "int32",
                                         "enum": sorted({c for g in topology.GENERATIONS.values() for t in g.topologies for c in topology.host_layouts(g, t)})},
                        "spot": {"type": "boolean"},
                        "reservation": {"type": "string", "maxLength": 63},
                    },
                    "x-kubernetes-validations": [
                        tpu_topology_rule,
                        {"rule": "!(has(self.reservation) && has(self.spot) && self.spot)",
                         "message": "a group's tpu.reservation must not be set together with tpu.spot"},
                    ],
                },
                "gpu": {
                    "type": "object",
                    "description": "A GPU group: GPUs per pod of a GKE GPU node pool (cloud.google.com/gke-accelerator).",
                    "required": ["type"],
                    "properties": {
                        "type": {"type": "string", "enum": list(GPU_TYPES), "maxLength": max(map(len, GPU_TYPES))},
                        "count": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 16, "default": 1},
                    },
                    "x-kubernetes-validations": [{
                        "rule": f"!has(self.count) || self.count in {gpu_counts}[self.type]",
                        "messageExpression": f"'gpu.count must be one of ' + {allowed_counts}[self.type] + ' for ' + self.type",
                        "fieldPath": ".count",
                        "reason": "FieldValueInvalid",
                    }],
                },
                "replicas": {"type": "integer", "format": "int32", "minimum": 1, "maximum": MAX_REPLICAS, "default": 1,
                             "description": "Slices (TPU group) or pods (GPU, CPU group)."},
                "image": {"type": "string", "minLength": 1, "maxLength": MAX_STRING, "pattern": IMAGE.pattern,
                          "description": "Image of the group's pods (e.g. CUDA for a GPU group); default: spec.image."},
                "cpu": resource_schema("cpu", "CPU of each pod of the group.", DEFAULTS["worker.cpu"]),
                "memory": resource_schema("memory", "Memory of each pod of the group.", DEFAULTS["worker.memory"]),
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"},
                                 "description": "Extra node selector; the accelerator labels come from tpu / gpu."},
                "env": {**env_schema, "description": (
                    "Environment variables of the group's pods, after spec.env (a name in both: the group's value). "
                    f"Unlike spec.env it may set {NOSET_VISIBLE_CHIPS} (engines that manage their own chips, "
                    "verl's TPU recipe), which the status warns of.")},
            },
            "x-kubernetes-validations": [
                {"rule": "!(has(self.tpu) && has(self.gpu))",
                 "message": "a group is a TPU slice (tpu), GPUs (gpu) or CPUs only (neither), never both"},
                {"rule": f"!(self.name in {json.dumps(sorted(RESERVED_NAMES))})",
                 "message": f"a group's name must not be {', '.join(sorted(RESERVED_NAMES))} (reserved)"},
                {"rule": f"!has(self.tpu) || !has(self.replicas) || self.replicas <= {MAX_TPU_REPLICAS}",
                 "message": f"a TPU group's replicas (slices) must be at most {MAX_TPU_REPLICAS}"},
            ],
        },
    }
