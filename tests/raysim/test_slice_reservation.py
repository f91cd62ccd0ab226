"""Issue 35, item 6, on Ray 2.60's own code: how a multi-host TPUTorchService's LLM replica reserves
its slice while the slice's hosts are still joining, one by one, in any order.

Ray Serve LLM defers a TPU replica's placement group to the replica: once started, the replica
calls its TPU backend's create_placement_group (TPUAccelerator), which reserves the slice through
its worker 0 (ray.util.tpu.SlicePlacementGroup: a placement group on the TPU-<pod type>-head
resource only worker 0 has, given up after 100 s) and then places one bundle on every host. Here a
replica is an actor started with the operator's rendered ray_actor_options that makes exactly that
call with the rendered llm_config, on simulated TPU hosts (tests/raysim/slicesim.py).

Not run here: vLLM's engine on that placement group. With a TPU backend Ray Serve LLM gives vLLM
the Ray executor, and vLLM's CPU build has none (vllm/v1/executor/ray_utils.py: "current platform
cpu does not support ray"); tests/cluster/test_real_serving.py runs the engine with the CPU backend.
"""

from __future__ import annotations

import sys

import pytest
import ray
import yaml
from ray import cloudpickle
from ray.llm._internal.serve.core.configs.accelerators import TPUAccelerator
from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
from ray.util.tpu import get_tpu_version_from_type, slice_placement_group

import slicesim
from tputorch import render
from tputorch.render.serveconfig import TPU_WORKER_ID_LABEL
from tputorch.api import spec

pytestmark = pytest.mark.ray
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module


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


@ray.remote
class Replica:
    """Where an LLMServer replica runs, and its slice reservation."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def reserve_as_serve_llm(self, cfg: dict, ready_s: float) -> list[str]:
        """Ray Serve LLM's call (VLLMEngineConfig.get_or_create_pg for a deferred TPU group): the
        backend's bundles and strategy, then the slice; the node of each bundle once placed."""
        llm = LLMConfig(**cfg)
        backend = TPUAccelerator(llm.accelerator_config)
        devices = llm.engine_kwargs.get("tensor_parallel_size", 1) * llm.engine_kwargs.get("pipeline_parallel_size", 1)
        bundles = backend.default_bundles(num_devices=devices, accelerator_type_str=llm.accelerator_type)
        strategy = (llm.placement_group_config or {}).get("strategy", "PACK")
        pg = backend.create_placement_group(bundles=bundles, strategy=strategy, name="svc-replica",
                                            accelerator_type_str=llm.accelerator_type)
        ray.get(pg.ready(), timeout=ready_s)
        return bundle_nodes(pg)

    def reserve_with_timeout(self, cfg: dict, head_timeout_s: float) -> str:
        """The same reservation (SlicePlacementGroup) with a short head timeout instead of 100 s."""
        llm = LLMConfig(**cfg)
        try:
            slice_placement_group(topology=llm.accelerator_config.topology,
                                  accelerator_version=get_tpu_version_from_type(llm.accelerator_type),
                                  head_reservation_timeout_s=head_timeout_s)
        except Exception as exc:  # what Ray raises when the head is not reserved in time
            return f"{type(exc).__name__}: {exc}"
        return "reserved"


def bundle_nodes(pg) -> list[str]:
    table = ray.util.placement_group_table(pg)
    return [table["bundles_to_node_id"][i] for i in range(len(table["bundles"]))]


def replica(options: dict, **override):
    """An actor placed as Serve places the replica: its ray_actor_options (Serve's 1 CPU default)."""
    opts = {"num_cpus": options.get("num_cpus", 1), "resources": dict(options.get("resources") or {}),
            "label_selector": dict(options.get("label_selector") or {}), **override}
    return Replica.options(**{k: v for k, v in opts.items() if v != {}}).remote()


def groups() -> set[str]:
    return {pid for pid, g in ray.util.placement_group_table().items() if g["state"] != "REMOVED"}


def test_the_pinned_replica_starts_on_worker_0_and_reserves_the_slice_however_hosts_join(ray_cluster, slice_hosts):
    slice_hosts.detach()  # this test adds its slice's hosts one at a time
    cfg, options, sim = rendered("v5p", "2x2x2")
    assert options["label_selector"] == {TPU_WORKER_ID_LABEL: "0"} and len(sim.hosts) == 2
    before = groups()
    nodes, actors = {}, []
    try:
        # Worker 1 joins first.
        nodes[1] = slicesim.add_host(ray_cluster, sim, sim.hosts[1])
        slicesim.record_node_ids(ray_cluster, sim, {1: nodes[1]})
        # Without the pin a replica starts there, waits for worker 0's head resource and fails when
        # the head timeout passes (100 s in Ray Serve LLM, 3 s here): three such starts fail the deploy.
        free = replica(options, label_selector={})
        actors.append(free)
        assert ray.get(free.node.remote(), timeout=120) == sim.node_ids[1]
        said = ray.get(free.reserve_with_timeout.remote(cfg, 3), timeout=120)
        assert said != "reserved" and "TPU" in said, said
        # With the operator's pin the replica is not started on worker 1.
        pinned = replica(options)
        actors.append(pinned)
        where = pinned.node.remote()
        assert ray.wait([where], timeout=5)[0] == [], "the pinned replica started without worker 0"
        # Worker 0 joins: the replica starts there and has the whole slice at once.
        nodes[0] = slicesim.add_host(ray_cluster, sim, sim.hosts[0])
        slicesim.record_node_ids(ray_cluster, sim, {0: nodes[0]})
        assert ray.get(where, timeout=120) == sim.node_ids[0]
        placed = ray.get(pinned.reserve_as_serve_llm.remote(cfg, 30), timeout=180)
        assert sorted(placed) == sorted(sim.node_ids.values()), (placed, sim.node_ids)
    finally:
        for a in actors:
            ray.kill(a)
        # A killed replica's groups: Ray removes them with their creator in its own time (seen: still
        # there 10 s after the kill), and the session's other tests share these nodes.
        slicesim.remove_placement_groups(groups() - before)
        for node in nodes.values():
            slicesim.remove_if_present(ray_cluster, node)
        sim.node_ids.clear()
