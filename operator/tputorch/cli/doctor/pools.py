"""`tputorch doctor`'s TPU node pools: the slices that can run, pools short of a whole slice or
with ambiguous labels, and with --for where each job or service would land.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ...api import spec, storage, topology
from ...api.quantity import bytes_quantity
from .result import DOC_POOLS, DOC_QUOTA, FAIL, OK, UNKNOWN, WARN, Result, Unread, _unknown, quantity
from .kueue import QuotaCheck, queue_problems, requested_resources
from ... import render
from ...render import volumes
from ...render.cluster import worker_node_selector


GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
GKE_FLEX_START_LABEL = "cloud.google.com/gke-flex-start"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


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
    disk: float | None = None  # the least allocatable ephemeral-storage of its Ready nodes, in bytes (None: unknown)

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


def _least_disk(nodes: list[dict]) -> float | None:
    """The least allocatable ephemeral-storage among the nodes (what the scheduler fits requests
    into: the boot disk less GKE's reservations), None when no node reports it."""
    found = [quantity(a) for n in nodes
             if (a := ((n.get("status") or {}).get("allocatable") or {}).get("ephemeral-storage")) is not None]
    return min(found) if found else None


def _gi_down(n: float) -> str:
    """Bytes in Gi to one decimal, rounded down: what a node allocates is never overstated
    (47093746742 bytes is 43.86Gi: 43.8, not 43.9)."""
    return f"{math.floor(n * 10 / 2**30) / 10:.1f}"


def host_disk_request(s) -> tuple[float, str] | None:
    """The ephemeral-storage each TPU host pod of a job or service requests, in bytes, and what it is
    made of: the Ray container's (storage.ephemeral_storage) and GKE's Cloud Storage FUSE sidecar's
    (storage.sidecar_disk_request), which the scheduler adds up. None when it requests none."""
    requests, _ = volumes.ephemeral_storage(s.worker.ephemeral_storage, storage.node_disk(s.volumes, "worker"))
    parts = [(q, what) for q, what in ((requests.get("ephemeral-storage"), "Ray"),
                                        (storage.sidecar_disk_request(s.volumes, s.gcs_fuse_sidecar, "worker"),
                                         "GKE's Cloud Storage FUSE sidecar")) if q]
    if not parts:
        return None
    total = sum(quantity(q) for q, _ in parts)
    return total, " + ".join(f"{q} for {what}" for q, what in parts)


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
                          len(members) - len(ready), chips, _capacity(labels), shape, problem, _least_disk(ready)))
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
                      "" if usable else "create a TPU node pool per slice (docs/tasks/tpu-capacity.md)",
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
                    local_queues: dict[str, list[dict] | Unread], cluster_queues: list[dict] | Unread | None = None,
                    flavors: list[dict] | Unread | None = None, quota_check: QuotaCheck = QuotaCheck()) -> list[Result]:
    """Which pool each job or service of a file would land on, or why none fits: its shape and
    capacity, whole slices ready, the namespace's ResourceQuota, and for a queued one whether Kueue
    could ever admit it (kueue.queue_problems; `cluster_queues` None: Kueue not installed;
    `quota_check`: what Kueue's config leaves out of quota)."""
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
        asked = host_disk_request(s)
        short = [p for p in fits if asked and p.disk is not None and p.disk < asked[0]]
        if short and len(short) == len(fits):
            problems.append(f"each host asks for {bytes_quantity(asked[0])} ephemeral-storage ({asked[1]}); the nodes of " + ", ".join(
                f"{p.name} allocate {_gi_down(p.disk)}Gi" for p in short)
                + " (create the pool with a larger --disk-size, or shrink the host's disk volumes)")
        fits = [p for p in fits if p not in short] or fits
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
        unread = []
        if s.queue_name:
            lqs = local_queues.get(s.namespace)
            if isinstance(lqs, Unread):
                unread.append(f"LocalQueue {s.queue_name!r} unreadable ({lqs.reason})")
            else:
                never, cannot_tell = queue_problems(
                    s.queue_name, s.namespace, lqs or [], cluster_queues, flavors,
                    requested_resources(render.render_any(s)), worker_node_selector(s), topology.TPU_RESOURCE,
                    sl.chips * wanted, quota_check)
                problems += never
                unread += cannot_tell
        names = ", ".join(p.name for p in fits)
        if problems:
            results.append(Result(check, FAIL, f"{what}: pool {names}, but " + "; ".join(problems + unread),
                                  "add nodes (or slices) to the pool, raise the namespace's ResourceQuota, create "
                                  "the LocalQueue, or give its ClusterQueue the resources and TPU quota the slice needs",
                                  DOC_QUOTA))
        elif unread:
            results.append(Result(check, UNKNOWN, f"{what}: pool {names} ({slices} slice(s)); Kueue's side not checked: "
                                  + "; ".join(unread)))
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
