"""Whether each replica's placement group holds one whole slice (status/slices.py), from state-API
answers shaped as Ray 2.60's (/api/v0/placement_groups and /api/v0/nodes with detail=1): the
expected messages are written out here."""

from tputorch.status import slices

HOSTS = 4


def node(node_id, slice_name=None, worker=None):
    labels = {"ray.io/node-id": node_id}
    if slice_name is not None:
        labels.update({"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": str(worker)})
    return {"node_id": node_id, "is_head_node": False, "state": "ALIVE", "labels": labels,
            "resources_total": {"CPU": 8.0, "TPU": 4.0} if slice_name else {"CPU": 1.0}}


NODES = [node("head0", None), *(node(f"a{i}", "slice-a", i) for i in range(4)),
         *(node(f"b{i}", "slice-b", i) for i in range(4)), node("cpu0")]


def group(pg_id, nodes, state="CREATED", tpu=4.0, name=""):
    return {"placement_group_id": pg_id, "name": name, "state": state,
            "bundles": [{"bundle_id": {"placement_group_id": pg_id, "bundle_index": i}, "node_id": n,
                         "unit_resources": {"TPU": tpu, **({"TPU-v5p-16-head": 1.0} if i == 0 else {})}}
                        for i, n in enumerate(nodes)]}


def test_two_replicas_each_on_its_own_whole_slice_are_whole():
    found = slices.check([group("pg1", ["a0", "a1", "a2", "a3"]), group("pg2", ["b1", "b0", "b3", "b2"])], NODES, HOSTS)
    assert found == slices.SliceCheck(2, ())
    cond = slices.whole_slices_condition(True, found, {}, 3)
    assert (cond["type"], cond["status"], cond["reason"], cond["observedGeneration"]) == (
        "ReplicasOnWholeSlices", "True", "OneSlicePerReplica", 3)
    assert cond["message"] == ("each of the 2 LLM replica(s) Ray placed has its bundles on the hosts of one slice, "
                               "one per host (ray.io/tpu-slice-name)")


def test_a_replica_across_two_slices_is_named_with_its_slices_and_nodes():
    found = slices.check([group("pg1", ["a0", "a1", "b2", "b3"], name="SERVE_REPLICA::llm#x"),
                          group("pg2", ["a2", "a3", "b0", "b1"])], NODES, HOSTS)
    assert found == slices.SliceCheck(2, (
        "placement group pg1 (SERVE_REPLICA::llm#x): its bundles are on slices slice-a (node a0, a1), slice-b (node b2, b3)",
        "placement group pg2: its bundles are on slices slice-a (node a2, a3), slice-b (node b0, b1)"))
    cond = slices.whole_slices_condition(True, found, {}, 1)
    assert (cond["status"], cond["reason"]) == ("False", "ReplicaSplitAcrossSlices")
    assert cond["message"] == (
        "2 of 2 LLM replica(s) are not on one whole slice, so their tensor parallelism cannot run over ICI (the replica "
        "hangs or fails): placement group pg1 (SERVE_REPLICA::llm#x): its bundles are on slices slice-a (node a0, a1), "
        "slice-b (node b2, b3); placement group pg2: its bundles are on slices slice-a (node a2, a3), slice-b (node b0, b1)")


def test_two_bundles_on_one_node_are_not_a_whole_slice():
    found = slices.check([group("pg1", ["a0", "a1", "a1", "a3"])], NODES, HOSTS)
    assert found == slices.SliceCheck(1, ("placement group pg1: bundles 1, 2 are on one node a1",))


def test_a_bundle_on_a_node_without_a_slice_name_is_not_a_whole_slice():
    found = slices.check([group("pg1", ["a0", "a1", "a2", "cpu0"]), group("pg2", ["b0", "b1", "b2", "gone"])],
                         NODES, HOSTS)
    assert found == slices.SliceCheck(2, (
        "placement group pg1: bundle 3 is on node cpu0, which has no ray.io/tpu-slice-name",
        "placement group pg2: bundle 3 is on node gone, which has no ray.io/tpu-slice-name"))


def test_pending_groups_and_groups_of_another_shape_are_not_judged():
    groups = [group("pending", ["", "", "", ""], state="PENDING"),
              group("removed", ["a0", "b0", "a1", "b1"], state="REMOVED"),
              group("cpu", ["a0", "b0", "a1", "b1"], tpu=0.0),  # no TPU asked: not a replica's
              group("other", ["a0", "b0"]),  # 2 bundles: not a replica of 4 hosts
              group("pg1", ["b0", "b1", "b2", "b3"])]
    assert slices.check(groups, NODES, HOSTS) == slices.SliceCheck(1, ())
    assert slices.check(groups[:4], NODES, HOSTS) == slices.SliceCheck(0, ())


def test_without_a_read_the_previous_condition_holds_and_a_single_host_service_has_none():
    before = {"type": "ReplicasOnWholeSlices", "status": "False", "reason": "ReplicaSplitAcrossSlices",
              "message": "m", "observedGeneration": 1, "lastTransitionTime": "2026-12-01T10:00:00Z"}
    previous = {"conditions": [{"type": "Ready", "status": "True"}, before]}
    assert slices.whole_slices_condition(True, None, previous, 2) is before
    assert slices.whole_slices_condition(True, slices.SliceCheck(0, ()), previous, 2) is before
    assert slices.whole_slices_condition(True, None, {}, 2) is None
    assert slices.whole_slices_condition(False, slices.SliceCheck(1, ("x",)), previous, 2) is None


def test_a_service_scaled_to_zero_has_no_verdict_on_slices_it_gave_back():
    previous = {"conditions": [slices.whole_slices_condition(True, slices.SliceCheck(1, ("split",)), {}, 1)]}
    assert slices.whole_slices_condition(True, slices.SliceCheck(1, ("split",)), previous, 2, scaled_to_zero=True) is None
    assert slices.whole_slices_condition(True, None, previous, 2, scaled_to_zero=True) is None
    assert slices.whole_slices_condition(True, None, previous, 2)["status"] == "False"  # kept while replicas are wanted
