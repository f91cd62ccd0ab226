"""Whether each LLM replica of a multi-host service holds one whole TPU slice, judged from Ray's
state (the head's state API: ``/api/v0/placement_groups`` and ``/api/v0/nodes``, read by
controller/slicereads.py), and the ReplicasOnWholeSlices condition that says so.

A multi-host replica owns a placement group of one ``{TPU: chips per host}`` bundle per host,
SPREAD (render/serveconfig.py replica_placement). SPREAD keeps the bundles on distinct nodes where
it can, but nothing keeps them on one slice when two slices come up in one autoscaler pass: a
replica split across slices cannot run tensor parallelism over ICI (it hangs or fails), so the
status says which group Ray placed so, on which slices and nodes. Pure functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.phases import REPLICAS_ON_WHOLE_SLICES
from .conditions import ONE_SLICE_PER_REPLICA, REPLICA_SPLIT_ACROSS_SLICES, condition, condition_of

# The label Ray 2.60 gives every TPU host's node (ray/_private/accelerators/tpu.py): its slice's name.
SLICE_LABEL = "ray.io/tpu-slice-name"
PLACED = "CREATED"  # a placement group whose every bundle Ray has placed on a node


@dataclass(frozen=True)
class SliceCheck:
    """One read of Ray's state: how many replica placement groups Ray placed, and one message per
    group that is not on one whole slice."""

    groups: int
    splits: tuple[str, ...]


def _asks_for_tpu(bundle: dict) -> bool:
    resources = bundle.get("unit_resources") if isinstance(bundle, dict) else None
    return isinstance(resources, dict) and (resources.get("TPU") or 0) > 0


def replica_groups(groups: list[dict], hosts: int) -> list[dict]:
    """The placed placement groups shaped as a replica's: ``hosts`` bundles, each asking for TPU
    (any other group of the cluster is not a replica's, and one still PENDING holds no node yet)."""
    return [g for g in groups if isinstance(g, dict) and g.get("state") == PLACED
            and isinstance(g.get("bundles"), list) and len(g["bundles"]) == hosts
            and all(_asks_for_tpu(b) for b in g["bundles"])]


def _name(group: dict) -> str:
    return f"placement group {group.get('placement_group_id')}" + (f" ({group['name']})" if group.get("name") else "")


def _split(group: dict, slice_of: dict[str, str | None]) -> str | None:
    """Why the group is not on one whole slice (None: it is): a bundle on a node without a slice
    name, two bundles on one node, or bundles on nodes of different slices."""
    nodes = [b.get("node_id") or "" for b in group["bundles"]]
    problems = [f"bundle {i} is on node {n or '(none)'}, which has no {SLICE_LABEL}"
                for i, n in enumerate(nodes) if not slice_of.get(n)]
    for node in dict.fromkeys(nodes):
        shared = [str(i) for i, n in enumerate(nodes) if n == node]
        if node and len(shared) > 1:
            problems.append(f"bundles {', '.join(shared)} are on one node {node}")
    named = {}  # slice -> its bundles' nodes, in bundle order
    for n in nodes:
        if slice_of.get(n):
            named.setdefault(slice_of[n], []).append(n)
    if len(named) > 1:
        problems.append("its bundles are on slices " + ", ".join(
            f"{name} (node {', '.join(dict.fromkeys(ns))})" for name, ns in named.items()))
    return f"{_name(group)}: " + "; ".join(problems) if problems else None


def check(groups: list[dict], nodes: list[dict], hosts: int) -> SliceCheck:
    """The replicas' placement groups (of ``hosts`` TPU bundles, placed) judged against the nodes
    Ray reports: each must have its bundles on ``hosts`` distinct nodes of one slice."""
    slice_of = {n["node_id"]: (n.get("labels") or {}).get(SLICE_LABEL)
                for n in nodes if isinstance(n, dict) and n.get("node_id")}
    replicas = replica_groups(groups, hosts)
    return SliceCheck(len(replicas), tuple(s for s in (_split(g, slice_of) for g in replicas) if s))


def whole_slices_condition(multi_host: bool, found: SliceCheck | None, previous: dict, generation: int,
                           scaled_to_zero: bool = False) -> dict | None:
    """ReplicasOnWholeSlices of a multi-host service: from the last read that found replica
    placement groups; until this process has one, the previous status's (an operator restart or a
    read that failed changes nothing); absent before the first such read, while the service is
    scaled to zero (no replica holds a slice: the last read's verdict is about slices given back),
    and on a single host, where a replica is its host's slice."""
    if not multi_host or scaled_to_zero:
        return None
    if found is None or found.groups == 0:
        return condition_of(previous, REPLICAS_ON_WHOLE_SLICES) or None
    if found.splits:
        return condition(REPLICAS_ON_WHOLE_SLICES, False, REPLICA_SPLIT_ACROSS_SLICES,
                         f"{len(found.splits)} of {found.groups} LLM replica(s) are not on one whole slice, so their "
                         "tensor parallelism cannot run over ICI (the replica hangs or fails): "
                         + "; ".join(found.splits), generation)
    return condition(REPLICAS_ON_WHOLE_SLICES, True, ONE_SLICE_PER_REPLICA,
                     f"each of the {found.groups} LLM replica(s) Ray placed has its bundles on the hosts of one "
                     f"slice, one per host ({SLICE_LABEL})", generation)
