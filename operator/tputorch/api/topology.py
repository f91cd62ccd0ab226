"""TPU generations and slice shapes on GKE: the one table every other module asks.

Facts come from GKE's TPU node-pool documentation, KubeRay's TPU samples and Ray 2.60 (see
shared/tpu-facts.md). A shape is listed only if both GKE offers it as a node pool and Ray 2.60's
own topology table accepts it (tests/unit/api/test_topology_ray.py checks every row against the installed
Ray's functions); a shape only one of them offers is refused with the reason. A slice is one TPU node pool:
``chips`` = product of the topology's dimensions, ``hosts`` = VMs in the pool, ``chips_per_host`` =
``google.com/tpu`` per pod, ``machine_type`` = the pool's VMs (node label node.kubernetes.io/instance-type).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from math import prod

# Multi-host slices always use 4-chip VMs; single-host slices put every chip on one VM.
MULTI_HOST_CHIPS_PER_HOST = 4

# Ray gives each Train worker process this many chips (TPU_VISIBLE_CHIPS supports these counts).
VALID_CHIPS_PER_WORKER = (1, 2, 4, 8)

GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
GKE_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
GKE_SPOT_LABEL = "cloud.google.com/gke-spot"
GKE_RESERVATION_LABEL = "cloud.google.com/reservation-name"
TPU_RESOURCE = "google.com/tpu"


GKE_INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# The node labels the operator derives from a slice (Slice.node_selector); a user's nodeSelector must not set them.
SLICE_LABELS = (GKE_ACCELERATOR_LABEL, GKE_TOPOLOGY_LABEL, GKE_INSTANCE_TYPE_LABEL)

# Ray resource/label spelling of a TPU type (ray._private.accelerators.tpu.normalize_tpu_accelerator_type):
# "tpu7x-8" -> "v7x-8".
RAY_TPU_PREFIX = re.compile(r"^tpu-?v?")


@dataclass(frozen=True)
class Generation:
    name: str  # the short name users write: v6e
    gke_accelerator: str  # node label value: tpu-v6e-slice
    ray_accelerator_type: str  # Ray's accelerator_type: TPU-V6E
    pod_type_prefix: str  # TPU pod type counts cores: v6e-16, v5litepod-16, v5p-16
    cores_per_chip: int
    machine_type: str  # with {chips} for the chips per VM
    # topology -> chips per host; the first entry of a tuple is the default layout.
    single_host: dict[str, tuple[int, ...]]
    multi_host: tuple[str, ...]
    # Shapes one of GKE and Ray 2.60 offers and the other does not: topology -> why it is refused.
    refused: dict[str, str] = field(default_factory=dict)
    devices_per_chip: int = 1  # XLA devices per chip: 2 on TPU7x (v4/v5p megacore chips are one device)

    @property
    def dimensions(self) -> int:
        return len(next(iter(self.single_host)).split("x"))

    @property
    def topologies(self) -> tuple[str, ...]:
        return tuple(self.single_host) + tuple(t for t in self.multi_host if t not in self.single_host)


def _cuboids(max_ab: int, max_c: int) -> tuple[str, ...]:
    """GKE's 3D slices beyond 2x4x4: AxBxC with A <= B <= C, each a multiple of 4 (GKE's and Cloud TPU's
    rule for v4 and v5p), bounded by the largest dimensions Ray 2.60's table holds for the generation."""
    sizes = range(4, max(max_ab, max_c) + 1, 4)
    return tuple(f"{a}x{b}x{c}" for a in sizes for b in sizes for c in sizes
                 if a <= b <= c and b <= max_ab and c <= max_c)


_SMALL_3D_MULTI = ("2x2x2", "2x2x4", "2x4x4")
_2D_MULTI = ("4x4", "4x8", "8x8", "8x16", "16x16")
_NOT_A_GKE_POOL = "Ray 2.60 lists it, but GKE offers no node pool of this shape"
_NOT_IN_RAY = "GKE offers this node pool, but Ray 2.60's topology table lacks it, so Ray cannot reserve the slice"

GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            name="v4",
            gke_accelerator="tpu-v4-podslice",
            ray_accelerator_type="TPU-V4",
            pod_type_prefix="v4",
            cores_per_chip=2,
            machine_type="ct4p-hightpu-{chips}t",
            single_host={"2x2x1": (4,)},
            multi_host=_SMALL_3D_MULTI + _cuboids(12, 16),
            refused={"8x16x16": _NOT_IN_RAY},
        ),
        Generation(
            name="v5e",
            gke_accelerator="tpu-v5-lite-podslice",
            ray_accelerator_type="TPU-V5LITEPOD",
            pod_type_prefix="v5litepod",
            cores_per_chip=1,
            machine_type="ct5lp-hightpu-{chips}t",
            # 2x4 is one 8-chip VM by default, or two 4-chip VMs when chipsPerHost is 4.
            single_host={"1x1": (1,), "2x2": (4,), "2x4": (8, 4)},
            multi_host=_2D_MULTI,
            refused={"2x8": _NOT_A_GKE_POOL},
        ),
        Generation(
            name="v5p",
            gke_accelerator="tpu-v5p-slice",
            ray_accelerator_type="TPU-V5P",
            pod_type_prefix="v5p",
            cores_per_chip=2,
            machine_type="ct5p-hightpu-{chips}t",
            single_host={"2x2x1": (4,)},
            multi_host=_SMALL_3D_MULTI + _cuboids(16, 24),
        ),
        Generation(
            name="v6e",
            gke_accelerator="tpu-v6e-slice",
            ray_accelerator_type="TPU-V6E",
            pod_type_prefix="v6e",
            cores_per_chip=1,
            machine_type="ct6e-standard-{chips}t",
            single_host={"1x1": (1,), "2x2": (4,), "2x4": (8, 4)},
            multi_host=_2D_MULTI,
            refused={"2x8": _NOT_A_GKE_POOL},
        ),
        Generation(
            name="tpu7x",
            gke_accelerator="tpu7x",
            ray_accelerator_type="TPU-V7X",
            pod_type_prefix="tpu7x",
            cores_per_chip=2,
            machine_type="tpu7x-standard-{chips}t",
            single_host={"2x2x1": (4,)},
            # Ray 2.60's v7x table is exactly these: it ends at 8x16x16 and has no 1x1x1.
            multi_host=_SMALL_3D_MULTI + ("4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"),
            refused={"1x1x1": f"{_NOT_IN_RAY} (the one-chip tpu7x-standard-1t pool)",
                     "16x16x16": _NOT_IN_RAY},
            devices_per_chip=2,
        ),
    )
}

# Users may write either the short name or GKE's node-label value.
ACCELERATOR_ALIASES: dict[str, str] = {
    **{g.name: g.name for g in GENERATIONS.values()},
    **{g.gke_accelerator: g.name for g in GENERATIONS.values()},
}


class TopologyError(ValueError):
    """A slice that cannot exist; ``field`` is the spec field (relative to spec.tpu) at fault."""

    def __init__(self, field: str, value: object, message: str):
        super().__init__(message)
        self.field = field
        self.value = value
        self.message = message


@dataclass(frozen=True)
class Slice:
    generation: Generation
    topology: str
    chips: int
    chips_per_host: int

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def pod_type(self) -> str:
        """TPU pod type as the device plugin reports it (TPU_ACCELERATOR_TYPE), e.g. v6e-16."""
        return f"{self.generation.pod_type_prefix}-{self.chips * self.generation.cores_per_chip}"

    @property
    def ray_pod_type(self) -> str:
        """The pod type as Ray spells it in resources and labels (TPU-v7x-8-head, not tpu7x-8)."""
        return RAY_TPU_PREFIX.sub("v", self.pod_type)

    @property
    def machine_type(self) -> str:
        return self.generation.machine_type.format(chips=self.chips_per_host)

    @property
    def node_selector(self) -> dict[str, str]:
        """The node labels of this slice's node pool. The machine type tells a pool of two 4-chip VMs
        from one 8-chip VM of the same topology (v5e/v6e 2x4): without it both pods could land on one
        8-chip node."""
        return {
            GKE_ACCELERATOR_LABEL: self.generation.gke_accelerator,
            GKE_TOPOLOGY_LABEL: self.topology,
            GKE_INSTANCE_TYPE_LABEL: self.machine_type,
        }

    def workers(self, chips_per_worker: int) -> int:
        return self.chips // chips_per_worker


RAY_TPU_RESOURCE_PER_CHIP = "RAY_TPU_RESOURCE_PER_CHIP"
# Why a job's pods never get it: the one place that says so (spec.env refuses it with this reason).
JOB_RESOURCE_PER_CHIP_REASON = (
    "a TPUTorchJob counts its Ray Train workers in chips (chipsPerWorker; workers = chips / chipsPerWorker) and "
    "Ray isolates each worker's chips with TPU_VISIBLE_CHIPS; with more than 1 Ray TPU resource per chip a "
    "1-resource worker gets part of a chip under a whole-chip mask and two workers share one chip")


def ray_tpu_resource_per_chip(generation: Generation, serving: bool) -> int | None:
    """RAY_TPU_RESOURCE_PER_CHIP on a kind's Ray nodes, None for Ray's default of 1 TPU resource per chip.

    Services on TPU7x: one resource per device (2 per chip), as Google's TPU7x serving samples set it,
    so Ray Serve LLM's slice reservation and vLLM's engine count TPU7x's devices. Jobs: never (see
    JOB_RESOURCE_PER_CHIP_REASON); Google's TorchTPU training sample sets 2 with one process per
    device, which this project has not verified on TPU7x."""
    if serving and generation.devices_per_chip > 1:
        return generation.devices_per_chip
    return None


def normalize_accelerator(value: str) -> str:
    """Short generation name for a short name or GKE label value; TopologyError otherwise."""
    name = ACCELERATOR_ALIASES.get(value)
    if name is None:
        raise TopologyError(
            "accelerator", value, f"must be one of {', '.join(sorted(ACCELERATOR_ALIASES))}"
        )
    return name


def chip_count(topology: str) -> int:
    return prod(int(d) for d in topology.split("x"))


def host_layouts(generation: Generation, topology: str) -> tuple[int, ...]:
    """Chips per host a topology can be built from, the default first."""
    layouts = generation.single_host.get(topology, ())
    if topology in generation.multi_host:
        layouts += (MULTI_HOST_CHIPS_PER_HOST,)
    return tuple(dict.fromkeys(layouts))


def resolve(accelerator: str, topology: str, chips_per_host: int | None = None) -> Slice:
    """The slice for an accelerator and topology (and, for ambiguous shapes, chips per host)."""
    generation = GENERATIONS[normalize_accelerator(accelerator)]
    if topology in generation.refused:
        raise TopologyError(
            "topology",
            topology,
            f"{generation.name} {topology} is refused: {generation.refused[topology]}; "
            f"allowed: {', '.join(generation.topologies)}",
        )
    if topology not in generation.topologies:
        raise TopologyError(
            "topology",
            topology,
            f"is not a {generation.name} slice on GKE; allowed: {', '.join(generation.topologies)}",
        )
    layouts = host_layouts(generation, topology)
    chosen = layouts[0] if chips_per_host is None else chips_per_host
    if chosen not in layouts:
        allowed = " or ".join(str(c) for c in layouts)
        raise TopologyError(
            "chipsPerHost",
            chips_per_host,
            f"must be {allowed} for a {generation.name} {topology} slice",
        )
    return Slice(generation, topology, chip_count(topology), chosen)


def all_slices(accelerator: str | None = None) -> list[Slice]:
    """Every supported slice (each layout of an ambiguous topology), in table order."""
    names = [normalize_accelerator(accelerator)] if accelerator else list(GENERATIONS)
    slices = []
    for name in names:
        generation = GENERATIONS[name]
        for topology in generation.topologies:
            for chips_per_host in host_layouts(generation, topology):
                slices.append(resolve(name, topology, chips_per_host))
    return slices


def torch_tpu_topology(s: Slice) -> str:
    """The slice's mesh as vllm-torchtpu 0.29 reads it from TORCH_TPU_TOPOLOGY: the topology and a
    last dimension of cores per chip (1 on v5e/v6e; 2 on v4/v5p, whose megacore pair is one
    device). Unset, its Ray executor looks the mesh up by device count in a fixed table that has
    the same meshes for 4 to 256 devices and none for a v5e/v6e 1x1, a v4/v5p 2x2x1 or 8x8x8 and
    larger: set, every one of these slices starts."""
    return f"{s.topology}x{s.generation.cores_per_chip}"

