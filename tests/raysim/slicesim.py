"""Simulate the TPU slice of a rendered RayJob as a local multi-node Ray cluster (CPU only).

Each pod of the rendered worker group becomes one Ray node, started with what that pod would
have on GKE:

- the Ray resource ``TPU`` = the container's ``google.com/tpu`` limit (KubeRay >= 1.3 does this),
- the container's env (the TPUTORCH_* slice shape written by render/env.py),
- what the GKE Ray TPU webhook adds (``TPU_WORKER_ID``, ``TPU_NAME``, ``TPU_WORKER_HOSTNAMES`` on
  multi-host slices) and what the TPU device plugin adds (``TPU_ACCELERATOR_TYPE`` as a pod type
  such as ``v6e-16``, ``TPU_TOPOLOGY``).

Ray then derives the rest itself, with its own code: the ``accelerator_type:TPU-V6E`` resource, the
``TPU-<podtype>-head`` resource on worker 0, and the ``ray.io/tpu-*`` node labels.

Ray reads a node's TPU env when the node starts (in this process, for the resource/label spec)
and the raylet hands its environment to its worker processes, so per-node env is set by
temporarily changing ``os.environ`` around ``Cluster.add_node``.

What the simulation cannot reproduce: Ray counts a host's chips from ``/dev/accel*``. Here there
are none, so Ray's "this worker holds every chip of the host" branch (which removes
``TPU_VISIBLE_CHIPS`` instead of listing all chips) is never taken; ``expected_worker_env`` models
both branches and the tests pass it the value Ray detects on this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Iterator, Mapping

# Every Ray process of these tests stays on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
LOOPBACK = "127.0.0.1"
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB

TPU_RESOURCE = "google.com/tpu"
ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"

# The GKE side, written down independently of tputorch.topology so the tests check render/
# against a second source: node-label value -> (pod-type prefix the device plugin reports,
# TensorCores per chip; the pod type counts cores).
GKE_DEVICE_PLUGIN = {
    "tpu-v4-podslice": ("v4", 2),
    "tpu-v5-lite-podslice": ("v5litepod", 1),
    "tpu-v5p-slice": ("v5p", 2),
    "tpu-v6e-slice": ("v6e", 1),
    "tpu7x": ("tpu7x", 2),
}

RECORDED_ENV = (
    "TPU_VISIBLE_CHIPS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_HOST_BOUNDS",
    "TPU_NAME",
    "TPU_WORKER_ID",
    "TPU_ACCELERATOR_TYPE",
    "TPU_TOPOLOGY",
    "MEGASCALE_NUM_SLICES",
    "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS",
)


@dataclass(frozen=True)
class SimHost:
    index: int
    chips: int
    env: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)  # Ray node labels of this host alone


@dataclass
class SimSlice:
    name: str
    topology: str
    pod_type: str
    chips_per_host: int
    hosts: list[SimHost]
    head_env: dict[str, str]
    node_ids: dict[int, str] = field(default_factory=dict)  # host index -> Ray node id
    # What a worker group of spec.groups adds (KubeRay's top-level labels/resources, which it passes
    # to `ray start --labels/--resources`), and a GPU group's GPUs (nvidia.com/gpu -> num-gpus).
    labels: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)
    gpus_per_host: int = 0
    cpus_per_host: int | None = None  # default: one per chip

    @property
    def chips(self) -> int:
        return self.chips_per_host * len(self.hosts)


def _container(pod_template: Mapping) -> Mapping:
    containers = pod_template["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def _plain_env(container: Mapping) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _group(cluster_spec: Mapping, group_name: str | None) -> Mapping:
    groups = cluster_spec["workerGroupSpecs"]
    if group_name is None:  # the training slice: the only group, or the one named tpu-slice
        if len(groups) == 1:
            return groups[0]
        group_name = "tpu-slice"
    (group,) = [g for g in groups if g["groupName"] == group_name]
    return group


def _group_extras(group: Mapping) -> dict:
    """The group's Ray labels and custom resources (its resources but CPU, which is ray start's --num-cpus)."""
    return {"labels": dict(group.get("labels") or {}),
            "resources": {k: float(v) for k, v in (group.get("resources") or {}).items() if k != "CPU"}}


def slice_from_rayjob(rayjob: Mapping, slice_name: str | None = None, group_name: str | None = None) -> SimSlice:
    """The hosts that GKE would give the rendered RayJob's TPU worker group (the training slice, or
    the TPU group ``group_name`` of spec.groups)."""
    cluster_spec = rayjob["spec"]["rayClusterSpec"]
    group = _group(cluster_spec, group_name)
    assert group["replicas"] == 1, "one replica is one slice; the operator renders one"
    container = _container(group["template"])
    limits = container["resources"]["limits"]
    chips_per_host = int(limits[TPU_RESOURCE])
    assert int(container["resources"]["requests"][TPU_RESOURCE]) == chips_per_host
    selector = group["template"]["spec"]["nodeSelector"]
    prefix, cores_per_chip = GKE_DEVICE_PLUGIN[selector[ACCELERATOR_LABEL]]
    topology = selector[TOPOLOGY_LABEL]
    chips = prod(int(d) for d in topology.split("x"))
    pod_type = f"{prefix}-{chips * cores_per_chip}"
    num_hosts = int(group["numOfHosts"])
    # The GKE webhook's admission rule (facts §3): hosts * chips per host covers the topology.
    assert num_hosts == max(chips // chips_per_host, 1), (num_hosts, chips, chips_per_host)

    name = slice_name or f"{rayjob['metadata']['name']}-{group['groupName']}-0"
    container_env = _plain_env(container)
    hostnames = ",".join(f"{name}-{i}.headless" for i in range(num_hosts))
    hosts = []
    for i in range(num_hosts):
        env = dict(container_env)
        env.update(TPU_NAME=name, TPU_WORKER_ID=str(i), TPU_ACCELERATOR_TYPE=pod_type, TPU_TOPOLOGY=topology)
        if num_hosts > 1:
            env["TPU_WORKER_HOSTNAMES"] = hostnames
        hosts.append(SimHost(index=i, chips=chips_per_host, env=env))
    head_env = _plain_env(_container(cluster_spec["headGroupSpec"]["template"]))
    # KubeRay passes the group's resources' CPU to `ray start` as --num-cpus: the hosts' Ray CPUs (a
    # PrefixAware service's TPU hosts have none; issue 56), else one per chip here.
    cpus = (group.get("resources") or {}).get("CPU")
    return SimSlice(name, topology, pod_type, chips_per_host, hosts, head_env,
                    cpus_per_host=None if cpus is None else int(cpus), **_group_extras(group))


def nodes_from_group(rayjob: Mapping, group_name: str, cpus_per_host: int = 1) -> SimSlice:
    """The pods of a GPU or CPU group of spec.groups as Ray nodes (one per replica): the container's
    env, the group's Ray labels and, for a GPU group, its nvidia.com/gpu limit as GPUs."""
    cluster_spec = rayjob["spec"]["rayClusterSpec"]
    group = _group(cluster_spec, group_name)
    container = _container(group["template"])
    gpus = int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
    env = _plain_env(container)
    hosts = [SimHost(index=i, chips=0, env=dict(env)) for i in range(int(group["replicas"]))]
    head_env = _plain_env(_container(cluster_spec["headGroupSpec"]["template"]))
    return SimSlice(f"{rayjob['metadata']['name']}-{group_name}", "", "", 0, hosts, head_env,
                    gpus_per_host=gpus, cpus_per_host=cpus_per_host, **_group_extras(group))


@contextlib.contextmanager
def _environ(overrides: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(overrides)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def start_head():
    """A Ray head without TPUs (the RayJob's head pod); the test process connects as driver."""
    import ray
    from ray._private import ray_constants, services
    from ray.cluster_utils import Cluster

    if ray_constants.ENABLE_RAY_CLUSTER:
        # Ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set (it reads the
        # variable once, at import): switch it off here too, or "127.0.0.1" resolves off loopback.
        ray_constants.ENABLE_RAY_CLUSTER = False
    assert services.get_node_ip_address() == LOOPBACK, services.get_node_ip_address()

    cluster = Cluster(
        initialize_head=True,
        head_node_args=dict(
            num_cpus=1,
            node_ip_address=LOOPBACK,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
        ),
    )
    assert cluster.address.startswith(LOOPBACK + ":"), cluster.address
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    return cluster


def add_host(cluster, sim: SimSlice, host: SimHost):
    """Start one host of the slice as a Ray node (not waited for: see record_node_ids)."""
    with _environ(host.env):
        extra = {"num_gpus": sim.gpus_per_host} if sim.gpus_per_host else {}
        if sim.labels or host.labels:
            extra["labels"] = {**sim.labels, **host.labels}
        return cluster.add_node(
            wait=False,
            node_ip_address=LOOPBACK,
            # Enough CPUs for one Ray Train worker per chip (Ray adds CPU: 1 per bundle).
            num_cpus=sim.cpus_per_host if sim.cpus_per_host is not None else host.chips,
            resources={**({"TPU": host.chips} if host.chips else {}), **sim.resources},
            object_store_memory=OBJECT_STORE_BYTES,
            **extra,
        )


def record_node_ids(cluster, sim: SimSlice, nodes: Mapping[int, object]) -> None:
    """Wait for the nodes just added ({host index: node}) and record their Ray node ids."""
    import ray

    cluster.wait_for_nodes(timeout=120)
    by_id = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    for i, node in nodes.items():
        labels = by_id[node.node_id]["Labels"]
        sim.node_ids[int(labels.get("ray.io/tpu-worker-id", i))] = node.node_id


def remove_if_present(cluster, node) -> None:
    """Remove a node of the cluster unless it was removed already (a host killed by a test)."""
    if node in cluster.worker_nodes:
        cluster.remove_node(node)


@contextlib.contextmanager
def attached(cluster, sim: SimSlice) -> Iterator[SimSlice]:
    """Add the slice's hosts as Ray nodes; remove them afterwards."""
    nodes = {}
    try:
        for host in sim.hosts:
            nodes[host.index] = add_host(cluster, sim, host)
        record_node_ids(cluster, sim, nodes)
        yield sim
    finally:
        for node in nodes.values():
            remove_if_present(cluster, node)
        sim.node_ids.clear()


def record_worker(config: dict) -> None:
    """Ray Train worker loop: write what this worker process sees to ``config['out']``."""
    import ray
    import ray.train

    ctx = ray.train.get_context()
    runtime = ray.get_runtime_context()
    record = {name: os.environ.get(name) for name in RECORDED_ENV}
    record.update(
        world_rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        node_id=runtime.get_node_id(),
        assigned_tpu_ids=runtime.get_accelerator_ids().get("TPU", []),
        pid=os.getpid(),
    )
    path = Path(config["out"]) / f"rank-{record['world_rank']}.json"
    path.write_text(json.dumps(record, sort_keys=True))
    ray.train.report({"world_rank": record["world_rank"]})


def run_recording_trainer(scaling_config, out_dir: Path, storage: Path, name: str) -> list[dict]:
    """Run a real Ray Train V2 DataParallelTrainer and return one record per worker, by rank."""
    from ray import cloudpickle
    from ray.train import RunConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    import slicesim

    cloudpickle.register_pickle_by_value(slicesim)  # workers cannot import this test helper
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = DataParallelTrainer(
        record_worker,
        train_loop_config={"out": str(out_dir)},
        scaling_config=scaling_config,
        run_config=RunConfig(storage_path=str(storage), name=name),
    )
    result = trainer.fit()
    assert result.error is None, result.error
    records = [json.loads(p.read_text()) for p in out_dir.glob("rank-*.json")]
    return sorted(records, key=lambda r: r["world_rank"])


def visible_chips(record: Mapping, chips_per_host: int) -> set[int]:
    """The chips a worker process can open: TPU_VISIBLE_CHIPS, or every chip when unset."""
    value = record["TPU_VISIBLE_CHIPS"]
    if value is None:
        return set(range(chips_per_host))
    return {int(c) for c in value.split(",") if c}


def expected_worker_env(chips: list[int], chips_per_host: int, host_chips_detected: int) -> dict:
    """What Ray 2.60 sets for a process that owns ``chips`` of a host (facts §4), on a host whose
    TPU bounds variables were not preset.

    1 chip: its id, per-host bounds 1,1,1, host bounds 1,1,1; 2 chips: its ids, 1,2,1 and 1,1,1;
    4 or 8 chips that are part of the host: the ids and no bounds; every chip of the host (as Ray
    counts them from /dev/accel*): no TPU_VISIBLE_CHIPS at all.
    """
    if len(chips) == host_chips_detected:
        return {"TPU_VISIBLE_CHIPS": None, "TPU_CHIPS_PER_HOST_BOUNDS": None, "TPU_HOST_BOUNDS": None}
    ids = ",".join(str(c) for c in sorted(chips))
    per_host = {1: "1,1,1", 2: "1,2,1"}.get(len(chips))
    host = "1,1,1" if per_host else None
    return {"TPU_VISIBLE_CHIPS": ids, "TPU_CHIPS_PER_HOST_BOUNDS": per_host, "TPU_HOST_BOUNDS": host}


def descendants(pid: int | None = None) -> list[tuple[int, str]]:
    """(pid, command) of every live process below ``pid`` (this process by default), from /proc."""
    root = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may hold spaces and parentheses
        comm_end = stat.rindex(")")
        fields = stat[comm_end + 2 :].split()
        if fields[0] == "Z":
            continue
        parents[int(entry)] = int(fields[1])
        names[int(entry)] = stat[stat.index("(") + 1 : comm_end]
    found = []
    for p in parents:
        q = parents.get(p)
        while q is not None and q != root:
            q = parents.get(q)
        if q == root:
            found.append((p, names[p]))
    return found


def remove_placement_groups(ids) -> None:
    """Remove placement groups by their hex ids: those a test's ended driver or killed actor left,
    which Ray removes with their owner only in its own time."""
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    for pid in ids:
        ray.util.remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(pid)))


def wait_until(predicate, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
