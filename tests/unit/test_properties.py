"""Property-based: whatever a user writes, parse raises only InvalidSpec whose errors name a field,
and whatever parses renders into a child that keeps the slice rules.

The generators build mostly valid bodies (a supported slice, valid values for every optional
field) and then break at most one field with arbitrary JSON: so the render assertions run on most
examples, and each test asserts that they did.
"""

import string
from collections import Counter

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tputorch import render
from tputorch.render.serveconfig import llm_deployment_name
from tputorch.render.service import rayservice_patch
from tputorch.api import service as service_api
from tputorch.api import spec, topology

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**40), max_value=2**40), st.floats(allow_nan=True),
    st.text(max_size=20), st.text(alphabet=string.digits + "x", max_size=8),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)

names = st.from_regex(r"[a-z][a-z0-9-]{0,40}[a-z0-9]", fullmatch=True)
env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,15}", fullmatch=True).filter(
    lambda n: n not in spec.FORBIDDEN_ENV and not n.startswith(spec.RESERVED_ENV_PREFIX) and n not in spec.SERVICE_ENV and n != spec.HF_TOKEN_ENV)
quantities = st.one_of(st.sampled_from(["1", "4", "500m", "16Gi", "1.5", "32Gi"]), st.integers(min_value=1, max_value=64))
# memory has a floor (api/common.py: at least 256Mi), so a valid body draws its memory above it
memories = st.one_of(st.sampled_from(["256Mi", "512Mi", "16Gi", "32Gi", "1Ti"]), st.integers(min_value=2**28, max_value=2**36))
label_values = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)

common_optional = {
    "rayVersion": st.sampled_from(["2.60.0", "2.61.3", "3.0.0"]),
    "runtimeEnv": st.fixed_dictionaries({}, optional={"pip": st.lists(st.sampled_from(["datasets", "numpy==2.1"]), max_size=2),
                                                      "env_vars": st.dictionaries(env_names, st.text(max_size=5), max_size=2)}),
    "env": st.lists(st.fixed_dictionaries({"name": env_names, "value": st.text(max_size=8)}), max_size=3, unique_by=lambda e: e["name"]),
    "head": st.fixed_dictionaries({}, optional={"cpu": quantities, "memory": memories, "nodeSelector": st.dictionaries(st.sampled_from(["pool", "team"]), label_values, max_size=2)}),
    "worker": st.fixed_dictionaries({}, optional={"cpu": quantities, "memory": memories}),
    "tolerations": st.lists(st.fixed_dictionaries({"key": st.sampled_from(["google.com/tpu", "dedicated", "example.com/team"]), "operator": st.sampled_from(["Exists", "Equal"]),
                                                   "effect": st.sampled_from(["NoSchedule", "NoExecute"])}), max_size=2),
    "serviceAccountName": names,
    "nodeSelector": st.dictionaries(st.sampled_from(["team", "example.com/pool"]), label_values, max_size=2),
    "queueName": label_values,
}


def tpu_block(s: topology.Slice, extra: dict) -> st.SearchStrategy:
    accelerator = st.sampled_from([s.generation.name, s.generation.gke_accelerator])
    base = {"accelerator": accelerator, "topology": st.just(s.topology)}
    optional = {"spot": st.booleans(), "slices": st.just(1)}
    if s.chips_per_host != topology.host_layouts(s.generation, s.topology)[0]:
        base["chipsPerHost"] = st.just(s.chips_per_host)
    return st.fixed_dictionaries(base, optional={**optional, **extra})


def broken(valid: st.SearchStrategy) -> st.SearchStrategy:
    """A valid body, or one with a single field of spec (or the name) replaced by anything."""
    def mutate(body, data):
        body = yaml.safe_load(yaml.safe_dump(body))  # a deep copy
        targets = ["metadata.name"] + [f"spec.{k}" for k in body["spec"]] + [f"spec.tpu.{k}" for k in body["spec"]["tpu"]]
        where = data.draw(st.sampled_from(targets))
        *parents, leaf = where.split(".")
        obj = body
        for p in parents:
            obj = obj[p]
        obj[leaf] = data.draw(json_values)
        return body

    return st.tuples(valid, st.data(), st.integers(0, 9)).map(lambda t: mutate(t[0], t[1]) if t[2] in (3, 6) else t[0])


@st.composite
def job_bodies(draw):
    s = draw(st.sampled_from(topology.all_slices()))
    per_worker = draw(st.sampled_from([c for c in topology.VALID_CHIPS_PER_WORKER if s.chips_per_host % c == 0]))
    tpu = draw(tpu_block(s, {"chipsPerWorker": st.just(per_worker)}))
    spec_ = draw(st.fixed_dictionaries(
        {"tpu": st.just(tpu), "image": st.just("example.com/img:1"), "entrypoint": st.sampled_from(["python train.py", "python -m t --x 'a: b'"])},
        optional={**common_optional, "activeDeadlineSeconds": st.integers(1, 10**6), "backoffLimit": st.integers(0, 100),
                  "suspend": st.booleans()},
    ))
    return {"kind": "TPUTorchJob", "metadata": {"name": draw(names), "namespace": "ml"}, "spec": spec_}


@st.composite
def service_bodies(draw):
    s = draw(st.sampled_from([x for x in topology.all_slices()
                              if x.chips_per_host == topology.host_layouts(x.generation, x.topology)[0] and service_api.serving_problem(x) is None]))
    tpu = draw(tpu_block(s, {}))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if s.chips % p == 0]))
    engine = draw(st.fixed_dictionaries({}, optional={
        "tensorParallelSize": st.just(s.chips // pp), "pipelineParallelSize": st.just(pp), "enableExpertParallel": st.booleans(),
        "maxModelLen": st.integers(1, 131072), "args": st.dictionaries(st.sampled_from(["gpu_memory_utilization", "enable_prefix_caching", "dtype"]), scalars, max_size=2)}))
    if "tensorParallelSize" in engine and "pipelineParallelSize" not in engine:
        engine["tensorParallelSize"] = s.chips
    low = draw(st.integers(1, 4))
    replicas = draw(st.fixed_dictionaries({}, optional={"min": st.just(low), "max": st.integers(low, 8)}))
    model = draw(st.fixed_dictionaries({"source": st.sampled_from(["Qwen/Qwen3-0.6B", "gs://tiny-models/m", "/models/x"])},
                                       optional={"name": st.text(min_size=1, max_size=10).filter(str.strip),
                                                 "hfTokenSecret": st.fixed_dictionaries({"name": names, "key": st.sampled_from(["token", "hf_api_token"])})}))
    spec_ = draw(st.fixed_dictionaries(
        {"tpu": st.just(tpu), "image": st.just("example.com/vllm:1"), "model": st.just(model)},
        optional={**common_optional, "engine": st.just(engine), "replicas": st.just(replicas)},
    ))
    return {"kind": "TPUTorchService", "metadata": {"name": draw(names), "namespace": "ml"}, "spec": spec_}


def check_errors(err: spec.InvalidSpec) -> None:
    assert err.errors
    for e in err.errors:
        assert e.path.startswith(("spec", "metadata", "kind")), e
        assert e.message
        assert str(e).startswith(e.path + ": ")


def worker_group(child: dict) -> dict:
    cluster = child["spec"].get("rayClusterSpec") or child["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    return group


def check_slice(child: dict, s: topology.Slice) -> list[str]:
    group = worker_group(child)
    c = group["template"]["spec"]["containers"][0]
    assert group["numOfHosts"] * int(c["resources"]["limits"]["google.com/tpu"]) == s.chips
    assert group["template"]["spec"]["nodeSelector"][topology.GKE_TOPOLOGY_LABEL] == s.topology
    names = [e["name"] for e in c["env"]]
    assert "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS" not in names and "TPU_VISIBLE_CHIPS" not in names
    assert len(names) == len(set(names))  # never an env var twice (the user's and ours)
    return names


def test_jobs_parse_or_fail_cleanly_and_most_render():
    seen = Counter()

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(broken(job_bodies()))
    def run(body):
        try:
            job = spec.parse_any(body)
        except spec.InvalidSpec as err:
            check_errors(err)
            seen["invalid"] += 1
            return
        seen["valid"] += 1
        check_slice(render.rayjob(job), job.slice)
        assert job.slice.chips_per_host % job.chips_per_worker == 0

    run()
    assert seen["valid"] >= 0.5 * sum(seen.values()), seen
    assert seen["invalid"] > 0, seen


def test_services_parse_or_fail_cleanly_and_most_render():
    seen = Counter()

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(broken(service_bodies()))
    def run(body):
        try:
            svc = spec.parse_any(body)
        except spec.InvalidSpec as err:
            check_errors(err)
            seen["invalid"] += 1
            return
        seen["valid"] += 1
        rs = render.rayservice(svc)
        names = check_slice(rs, svc.slice)
        (app,) = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"]
        (cfg,) = app["args"]["llm_configs"]
        kwargs = cfg["engine_kwargs"]
        assert kwargs["tensor_parallel_size"] * kwargs["pipeline_parallel_size"] == svc.slice.chips
        assert "distributed_executor_backend" not in kwargs
        override, ingress = app["deployments"]
        assert override["name"] == llm_deployment_name(svc.model_name)
        assert ingress["ray_actor_options"]["resources"] == {"node:__internal_head__": 0.001}  # never a TPU host
        scaling = override["autoscaling_config"]
        group = worker_group(rs)
        assert (group["minReplicas"], group["maxReplicas"]) == (scaling["min_replicas"], scaling["max_replicas"])
        assert 1 <= scaling["min_replicas"] <= scaling["max_replicas"]
        assert "TPU_MULTIHOST_BACKEND" in names  # every slice: vllm-torchtpu's executor comes from it
        assert rayservice_patch(svc, rs) is None

    run()
    assert seen["valid"] >= 0.5 * sum(seen.values()), seen
    assert seen["invalid"] > 0, seen


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(json_values, st.dictionaries(st.sampled_from(["kind", "metadata", "spec"]), json_values)))
def test_arbitrary_json_never_crashes_either_parser(body):
    for parse in (spec.parse, spec.parse_service, spec.parse_any):
        try:
            parse(body)
        except spec.InvalidSpec as err:
            assert err.errors


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
