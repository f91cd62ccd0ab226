"""Property-based: whatever a user writes, parse raises only InvalidSpec whose errors name a field,
and whatever parses renders into a RayJob that keeps the slice rules."""

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tputorch import render, spec, topology

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40), st.floats(allow_nan=True),
    st.text(max_size=20), st.text(alphabet=string.digits + "x", max_size=8),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)

accelerators = st.one_of(st.sampled_from(sorted(topology.ACCELERATOR_ALIASES)), st.text(max_size=12), json_values)
topologies = st.one_of(st.sampled_from(sorted({t for g in topology.GENERATIONS.values() for t in g.topologies})), st.text(alphabet="0123456789x", max_size=9), json_values)
small_ints = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 8, 16, -1]), json_values)

tpu_blocks = st.fixed_dictionaries(
    {"accelerator": accelerators, "topology": topologies},
    optional={"slices": small_ints, "chipsPerWorker": small_ints, "chipsPerHost": small_ints, "spot": st.one_of(st.booleans(), json_values),
              "reservation": st.one_of(st.text(max_size=70), json_values)},
)
env_items = st.one_of(
    st.fixed_dictionaries({"name": st.one_of(st.sampled_from(["A", "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS", "TPUTORCH_X", "TPU_VISIBLE_CHIPS", "1x"]), st.text(max_size=10), json_values)},
                          optional={"value": json_values, "valueFrom": json_values}),
    json_values,
)
specs = st.fixed_dictionaries(
    {},
    optional={
        "tpu": st.one_of(tpu_blocks, json_values),
        "image": st.one_of(st.just("example.com/img:1"), json_values),
        "entrypoint": st.one_of(st.just("python train.py"), json_values),
        "rayVersion": st.one_of(st.sampled_from(["2.60.0", "2.59.1", "2.9.0", "x"]), json_values),
        "runtimeEnv": json_values,
        "env": st.one_of(st.lists(env_items, max_size=3), json_values),
        "head": st.one_of(st.fixed_dictionaries({}, optional={"cpu": json_values, "memory": json_values, "nodeSelector": json_values}), json_values),
        "worker": st.one_of(st.fixed_dictionaries({}, optional={"cpu": st.one_of(st.sampled_from(["4", "500m", 8]), json_values), "memory": json_values}), json_values),
        "tolerations": json_values,
        "serviceAccountName": json_values,
        "nodeSelector": json_values,
        "suspend": json_values,
        "queueName": json_values,
        "activeDeadlineSeconds": small_ints,
        "backoffLimit": small_ints,
        "ttlSecondsAfterFinished": small_ints,
        "shutdownAfterJobFinishes": json_values,
        "unknownField": json_values,
    },
)
bodies = st.fixed_dictionaries(
    {"metadata": st.one_of(st.fixed_dictionaries({"name": st.one_of(st.from_regex(r"[a-z][a-z0-9-]{0,50}", fullmatch=True), json_values)},
                                                  optional={"namespace": st.text(max_size=10)}), json_values)},
    optional={"spec": st.one_of(specs, json_values), "kind": st.just("TPUTorchJob")},
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_parse_and_render_never_crash_and_errors_name_their_field(body):
    try:
        job = spec.parse(body)
    except spec.InvalidSpec as err:
        assert err.errors
        for e in err.errors:
            assert e.path.startswith(("spec", "metadata")), e
            assert e.message
            assert str(e).startswith(e.path + ": ")
        return
    rayjob = render.rayjob(job)
    (group,) = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    per_pod = int(group["template"]["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"])
    assert group["numOfHosts"] * per_pod == job.slice.chips
    assert job.slice.chips_per_host % job.chips_per_worker == 0
    names = [e["name"] for e in group["template"]["spec"]["containers"][0]["env"]]
    assert "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS" not in names and "TPU_VISIBLE_CHIPS" not in names


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(topology.all_slices()), st.sampled_from(topology.VALID_CHIPS_PER_WORKER))
def test_every_valid_shape_renders_a_consistent_worker_count(s, per_worker):
    body = {"metadata": {"name": "p"}, "spec": {"tpu": {"accelerator": s.generation.name, "topology": s.topology,
            "chipsPerHost": s.chips_per_host, "chipsPerWorker": per_worker}, "image": "i", "entrypoint": "e"}}
    try:
        job = spec.parse(body)
    except spec.InvalidSpec as err:
        assert [e.path for e in err.errors] == ["spec.tpu.chipsPerWorker"]
        assert s.chips_per_host % per_worker != 0
        return
    env = {e["name"]: e["value"] for e in render.rayjob(job)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert int(env["TPUTORCH_NUM_WORKERS"]) * per_worker == s.chips
