"""The topology table checked against the facts sheet (shared/tpu-facts.md), shape by shape."""

import pytest

from tputorch.api import topology

# (accelerator, topology, chipsPerHost or None) -> (chips, hosts, google.com/tpu per pod, pod type)
# Written from GKE's documentation and KubeRay's TPU samples, not from the code under test.
FACTS = [
    ("v6e", "1x1", None, 1, 1, 1, "v6e-1"),
    ("v6e", "2x2", None, 4, 1, 4, "v6e-4"),
    ("v6e", "2x4", None, 8, 1, 8, "v6e-8"),
    ("v6e", "2x4", 4, 8, 2, 4, "v6e-8"),
    ("v6e", "4x4", None, 16, 4, 4, "v6e-16"),
    ("v6e", "4x8", None, 32, 8, 4, "v6e-32"),
    ("v6e", "8x8", None, 64, 16, 4, "v6e-64"),
    ("v6e", "8x16", None, 128, 32, 4, "v6e-128"),
    ("v6e", "16x16", None, 256, 64, 4, "v6e-256"),
    ("v5e", "1x1", None, 1, 1, 1, "v5litepod-1"),
    ("v5e", "2x2", None, 4, 1, 4, "v5litepod-4"),
    ("v5e", "2x4", None, 8, 1, 8, "v5litepod-8"),
    ("v5e", "2x4", 4, 8, 2, 4, "v5litepod-8"),
    ("v5e", "4x4", None, 16, 4, 4, "v5litepod-16"),
    ("v5e", "16x16", None, 256, 64, 4, "v5litepod-256"),
    ("v4", "2x2x1", None, 4, 1, 4, "v4-8"),
    ("v4", "2x2x2", None, 8, 2, 4, "v4-16"),
    ("v4", "4x4x4", None, 64, 16, 4, "v4-128"),
    ("v4", "8x8x16", None, 1024, 256, 4, "v4-2048"),
    ("v5p", "2x2x1", None, 4, 1, 4, "v5p-8"),
    ("v5p", "2x2x2", None, 8, 2, 4, "v5p-16"),
    ("tpu7x", "2x2x1", None, 4, 1, 4, "tpu7x-8"),
    ("tpu7x", "2x2x2", None, 8, 2, 4, "tpu7x-16"),
]


@pytest.mark.parametrize("acc,topo,cph,chips,hosts,per_host,pod_type", FACTS)
def test_slice_shapes_match_the_facts(acc, topo, cph, chips, hosts, per_host, pod_type):
    s = topology.resolve(acc, topo, cph)
    assert (s.chips, s.hosts, s.chips_per_host, s.pod_type) == (chips, hosts, per_host, pod_type)
    assert s.multi_host == (hosts > 1)


@pytest.mark.parametrize(
    "acc,label,ray_type",
    [
        ("v4", "tpu-v4-podslice", "TPU-V4"),
        ("v5e", "tpu-v5-lite-podslice", "TPU-V5LITEPOD"),
        ("v5p", "tpu-v5p-slice", "TPU-V5P"),
        ("v6e", "tpu-v6e-slice", "TPU-V6E"),
        ("tpu7x", "tpu7x", "TPU-V7X"),
    ],
)
def test_generation_labels_and_ray_types(acc, label, ray_type):
    g = topology.GENERATIONS[acc]
    assert (g.gke_accelerator, g.ray_accelerator_type) == (label, ray_type)
    # The GKE label form is accepted and means the same generation.
    assert topology.resolve(label, g.topologies[0]).generation is g


@pytest.mark.parametrize(
    "acc,machine",
    [("v6e", "ct6e-standard-4t"), ("v5e", "ct5lp-hightpu-4t"), ("v5p", "ct5p-hightpu-4t"),
     ("v4", "ct4p-hightpu-4t"), ("tpu7x", "tpu7x-standard-4t")],
)
def test_multi_host_slices_use_4_chip_machines(acc, machine):
    multi = [s for s in topology.all_slices(acc) if s.multi_host]
    assert multi
    assert {s.machine_type for s in multi} == {machine}
    assert all(s.chips_per_host == 4 and s.hosts * 4 == s.chips for s in multi)


def test_every_slice_is_one_pool_whose_hosts_hold_all_chips():
    for s in topology.all_slices():
        dims = [int(d) for d in s.topology.split("x")]
        product = 1
        for d in dims:
            product *= d
        assert s.chips == product
        assert s.hosts * s.chips_per_host == s.chips
        # GKE's Ray TPU webhook rule for a worker group.
        assert s.hosts == max(s.chips // s.chips_per_host, 1)
        assert len(dims) == (2 if s.generation.name in ("v5e", "v6e") else 3)


def test_largest_2d_slice_is_16x16():
    for acc in ("v5e", "v6e"):
        assert max(s.chips for s in topology.all_slices(acc)) == 256


@pytest.mark.parametrize(
    "acc,topo,field,fragment",
    [
        ("v6e", "2x8", "topology", "allowed: 1x1, 2x2, 2x4, 4x4"),  # in Ray's list, not a GKE pool shape
        ("v6e", "32x32", "topology", "is not a v6e slice"),
        ("v6e", "2x2x2", "topology", "is not a v6e slice"),
        ("v5p", "4x4", "topology", "is not a v5p slice"),
        ("v7", "4x4", "accelerator", "must be one of"),
        ("V6E", "4x4", "accelerator", "must be one of"),
    ],
)
def test_impossible_slices_are_refused_with_the_allowed_values(acc, topo, field, fragment):
    with pytest.raises(topology.TopologyError) as err:
        topology.resolve(acc, topo)
    assert err.value.field == field
    assert fragment in err.value.message


def test_chips_per_host_only_where_a_topology_has_two_layouts():
    with pytest.raises(topology.TopologyError) as err:
        topology.resolve("v6e", "4x4", 8)
    assert err.value.field == "chipsPerHost" and "must be 4" in err.value.message
    with pytest.raises(topology.TopologyError) as err:
        topology.resolve("v6e", "2x4", 1)
    assert "must be 8 or 4" in err.value.message


def test_table_lists_both_layouts_of_2x4_and_no_duplicates():
    v6e = [(s.topology, s.chips_per_host) for s in topology.all_slices("v6e")]
    assert ("2x4", 8) in v6e and ("2x4", 4) in v6e
    assert len(v6e) == len(set(v6e))
