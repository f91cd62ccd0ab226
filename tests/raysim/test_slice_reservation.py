"""Issues 35 and 56, on Ray 2.60's own code: how a multi-host TPUTorchService's LLM replica gets
its slice while the slice's hosts are still joining, one by one, in any order.

The operator renders the replica's own placement group (one bundle per host, SPREAD; the replica
merged into bundle 0 with TPU-<pod type>-head, which only worker 0 has): Serve creates it before
the replica and starts the replica in bundle 0. Here that group is created as Serve creates it
from the rendered llm_config, on simulated TPU hosts (tests/raysim/slicesim.py).

Not run here: vLLM's engine on that placement group. With a TPU backend Ray Serve LLM gives vLLM
the Ray executor, and vLLM's CPU build has none (vllm/v1/executor/ray_utils.py: "current platform
cpu does not support ray"); tests/cluster/test_real_serving.py runs the engine with the CPU backend.
"""

from __future__ import annotations

import pytest
import ray
import yaml
from ray.util.placement_group import placement_group

import raysource
import slicesim
from tputorch import render
from tputorch.api import spec

pytestmark = pytest.mark.ray


def rendered(accelerator: str, topology: str) -> tuple[dict, dict, slicesim.SimSlice]:
    """(llm_config, the replica's ray_actor_options, the slice GKE gives it) of a rendered service."""
    svc = spec.parse_service({"kind": "TPUTorchService", "metadata": {"name": "svc", "namespace": "default"},
                              "spec": {"tpu": {"accelerator": accelerator, "topology": topology},
                                       "image": "example.invalid/vllm:1", "model": {"source": "Qwen/Qwen3-0.6B"}}})
    rs = render.rayservice(svc)
    (app,) = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"]
    (cfg,) = app["args"]["llm_configs"]
    cfg["deployment_config"].pop("request_router_config", None)  # imports vLLM (see test_serve_config.py)
    sim = slicesim.slice_from_rayjob({"metadata": {"name": "svc"}, "spec": {"rayClusterSpec": rs["spec"]["rayClusterConfig"]}})
    return cfg, cfg["deployment_config"]["ray_actor_options"], sim


def bundle_nodes(pg) -> list[str]:
    table = ray.util.placement_group_table(pg)
    return [table["bundles_to_node_id"][i] for i in range(len(table["bundles"]))]


def groups() -> set[str]:
    return {pid for pid, g in ray.util.placement_group_table().items() if g["state"] != "REMOVED"}


def test_the_replicas_placement_group_waits_for_every_host_and_puts_the_replica_on_worker_0(ray_cluster, slice_hosts):
    """Issue 56: a multi-host replica's placement group, as Serve creates it before the replica
    (Ray's get_deployment_options on the rendered config: one bundle per host, the replica's
    resources with TPU-<pod type>-head merged into bundle 0, SPREAD), is placed only once every
    host has joined, whatever the order, with bundle 0 on worker 0 and one bundle per host."""
    slice_hosts.detach()  # this test adds its slice's hosts one at a time
    cfg, options, sim = rendered("v5p", "2x2x2")
    built = raysource.deployment_options(cfg)
    assert "label_selector" not in options and len(sim.hosts) == 2
    before = groups()
    nodes, pg = {}, None
    try:
        nodes[1] = slicesim.add_host(ray_cluster, sim, sim.hosts[1])  # worker 1 joins first
        slicesim.record_node_ids(ray_cluster, sim, {1: nodes[1]})
        pg = placement_group([{k: v for k, v in b.items() if v} for b in built["placement_group_bundles"]],
                             strategy=built["placement_group_strategy"])
        assert ray.wait([pg.ready()], timeout=5)[0] == [], "placed without worker 0"
        nodes[0] = slicesim.add_host(ray_cluster, sim, sim.hosts[0])
        slicesim.record_node_ids(ray_cluster, sim, {0: nodes[0]})
        ray.get(pg.ready(), timeout=120)
        placed = bundle_nodes(pg)
        assert placed[0] == sim.node_ids[0] and sorted(placed) == sorted(sim.node_ids.values()), (placed, sim.node_ids)
    finally:
        slicesim.remove_placement_groups(groups() - before)
        for node in nodes.values():
            slicesim.remove_if_present(ray_cluster, node)
        sim.node_ids.clear()
