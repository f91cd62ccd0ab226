"""Every row of the slice table against Ray 2.60's own TPU functions, so the table and Ray cannot drift.

Ray is imported here only (the operator never imports it); the functions are pure: no cluster starts.
"""

import re

import pytest

ray_tpu = pytest.importorskip("ray._private.accelerators.tpu", reason="needs ray (pip install -e '.[train]')")
ray_util_tpu = pytest.importorskip("ray.util.tpu")

from tputorch.api import topology  # noqa: E402

SLICES = topology.all_slices()
IDS = [f"{s.generation.name}-{s.topology}-h{s.chips_per_host}" for s in SLICES]


def ray_version(g: topology.Generation) -> str:
    """The key of Ray's topology table for a generation (v4, v5litepod, v5p, v6e, v7x)."""
    return ray_util_tpu.get_tpu_version_from_type(g.ray_accelerator_type)


def gke_shaped(g: topology.Generation, t: str) -> bool:
    """GKE's form of a topology: 2D for v5e/v6e; for the 3D generations the sub-cube shapes GKE lists
    (2x2x1, 2x2x2, 2x2x4, 2x4x4) and AxBxC with A <= B <= C, each a multiple of 4."""
    dims = [int(d) for d in t.split("x")]
    if g.dimensions == 2:
        return len(dims) == 2
    return t in ("2x2x1", "2x2x2", "2x2x4", "2x4x4") or (
        len(dims) == 3 and dims == sorted(dims) and all(d % 4 == 0 for d in dims))


@pytest.mark.parametrize("s", SLICES, ids=IDS)
def test_every_row_is_what_ray_computes_for_it(s):
    g = s.generation
    accelerator = g.ray_accelerator_type
    assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_topology(accelerator, s.topology)
    assert ray_tpu.get_num_chips_from_topology(s.topology) == s.chips
    # The pod type as Ray names it (resources TPU-<type>-head, labels) and from the device plugin's
    # spelling (TPU_ACCELERATOR_TYPE: tpu7x-8), which Ray normalises.
    assert ray_tpu.infer_tpu_pod_type_from_topology(s.topology, accelerator) == s.ray_pod_type
    assert ray_tpu.normalize_tpu_accelerator_type(s.pod_type) == s.ray_pod_type
    assert ray_tpu.get_tpu_cores_per_chip(s.ray_pod_type) == g.cores_per_chip
    assert ray_tpu.get_total_chips_from_accelerator_type(s.ray_pod_type) == s.chips
    # Hosts and chips per host: what Ray reserves for this slice with these VMs, one worker per host.
    workers, resources = ray_util_tpu.get_tpu_worker_resources(
        s.topology, accelerator, chips_per_vm=s.chips_per_host, tpu_resource_per_chip=1)
    assert (workers, resources["TPU"]) == (s.hosts, s.chips_per_host)


@pytest.mark.parametrize("s", SLICES, ids=IDS)
def test_the_default_layout_is_rays_default(s):
    g = s.generation
    default = topology.host_layouts(g, s.topology)[0]
    # Ray maps a topology to hosts of this many chips when nothing says otherwise (SlicePlacementGroup,
    # Serve LLM's reservation), and the device plugin's pod type implies the same.
    assert ray_tpu.get_chips_per_host(s.topology, ray_version(g)) == default
    assert ray_tpu.get_num_tpu_visible_chips_per_host(s.ray_pod_type) == default
    assert topology.resolve(g.name, s.topology).chips_per_host == default


@pytest.mark.parametrize("g", topology.GENERATIONS.values(), ids=lambda g: g.name)
def test_the_table_is_every_shape_both_gke_and_ray_accept(g):
    ray_topologies = ray_tpu.VALID_TPU_TOPOLOGY[ray_version(g)]
    ours = set(g.topologies)
    assert ours <= ray_topologies, ours - ray_topologies
    assert all(gke_shaped(g, t) for t in ours)
    # What Ray has and the table lacks is either not of GKE's form or refused with the reason.
    missing = {t for t in ray_topologies - ours if gke_shaped(g, t)}
    assert missing == {t for t in g.refused if t in ray_topologies}


@pytest.mark.parametrize("g,t", [(g, t) for g in topology.GENERATIONS.values() for t in g.refused],
                         ids=lambda v: getattr(v, "name", v))
def test_a_refused_shape_says_truthfully_which_side_lacks_it(g, t):
    in_ray = t in ray_tpu.VALID_TPU_TOPOLOGY[ray_version(g)]
    reason = g.refused[t]
    assert ("Ray 2.60 lists it" in reason) == in_ray
    assert ("Ray 2.60's topology table lacks it" in reason) == (not in_ray)
    with pytest.raises(topology.TopologyError) as err:
        topology.resolve(g.name, t)
    assert err.value.field == "topology" and reason in err.value.message


def test_tpu7x_1x1x1_is_refused_because_ray_cannot_reserve_it():
    assert "1x1x1" not in ray_tpu.VALID_TPU_TOPOLOGY["v7x"]
    with pytest.raises(topology.TopologyError) as err:
        topology.resolve("tpu7x", "1x1x1")
    assert "Ray 2.60's topology table lacks it" in err.value.message
    assert "tpu7x-standard-1t" in err.value.message


def test_the_missing_v4_and_v5p_shapes_are_in():
    for acc, t in (("v4", "4x4x12"), ("v4", "8x8x12"), ("v4", "12x12x16"), ("v5p", "16x16x20"),
                   ("v5p", "4x4x24"), ("v5p", "12x16x24")):
        s = topology.resolve(acc, t)
        assert (s.chips_per_host, s.hosts) == (4, s.chips // 4)


@pytest.mark.parametrize("s", SLICES, ids=IDS)
def test_the_node_selector_names_the_machine_type_of_the_pool(s):
    selector = s.node_selector
    assert selector == {
        topology.GKE_ACCELERATOR_LABEL: s.generation.gke_accelerator,
        topology.GKE_TOPOLOGY_LABEL: s.topology,
        topology.GKE_INSTANCE_TYPE_LABEL: s.machine_type,
    }
    # GKE's machine types end in the chips per VM: ct6e-standard-4t, ct5lp-hightpu-8t, tpu7x-standard-4t.
    assert re.fullmatch(r"(ct6e-standard|ct5lp-hightpu|ct5p-hightpu|ct4p-hightpu|tpu7x-standard)-(\d)t",
                        s.machine_type).group(2) == str(s.chips_per_host)


@pytest.mark.parametrize("acc,machine_8,machine_4", [("v6e", "ct6e-standard-8t", "ct6e-standard-4t"),
                                                     ("v5e", "ct5lp-hightpu-8t", "ct5lp-hightpu-4t")])
def test_a_2x4_on_two_4_chip_vms_never_selects_an_8_chip_node(acc, machine_8, machine_4):
    one_vm, two_vms = topology.resolve(acc, "2x4"), topology.resolve(acc, "2x4", 4)
    assert one_vm.node_selector[topology.GKE_INSTANCE_TYPE_LABEL] == machine_8
    assert two_vms.node_selector[topology.GKE_INSTANCE_TYPE_LABEL] == machine_4
