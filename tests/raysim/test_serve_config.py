"""Ray 2.60 accepts what a TPUTorchService renders, and Ray's own code reserves exactly its slice.

No Ray cluster and no vLLM: Ray Serve's ServeDeploySchema validates each golden serveConfigV2,
Ray Serve LLM's LLMConfig (pydantic, unknown keys refused) validates each llm_config, and the TPU
accelerator backend LLMConfig resolves to computes the placement bundles a replica reserves.
"""

from __future__ import annotations

import inspect
import pathlib
import types

import pytest
import yaml
from ray._private.accelerators.tpu import TPUAcceleratorManager
from ray.llm._internal.serve.core.configs.accelerators import TPUAccelerator, TPUConfig
from ray.llm._internal.serve.core.configs.llm_config import LLMConfig
from ray import serve
from ray.serve.schema import ServeDeploySchema
from ray.util.tpu import get_tpu_version_from_type

import raysource
from tputorch import render
from tputorch.render.serveconfig import REQUEST_ROUTERS
from tputorch.api import service as service_api, spec, topology

pytestmark = pytest.mark.ray

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "unit" / "render" / "golden"
GOLDEN_SERVICES = sorted(GOLDEN.glob("service-*.yaml"))


def service(accelerator: str, topology_: str, chips_per_host: int | None = None, **engine) -> spec.ServiceSpec:
    tpu = {"accelerator": accelerator, "topology": topology_}
    if chips_per_host:
        tpu["chipsPerHost"] = chips_per_host
    return spec.parse_service({
        "kind": "TPUTorchService",
        "metadata": {"name": "svc", "namespace": "default"},
        "spec": {"tpu": tpu, "image": "example.invalid/vllm:1", "model": {"source": "Qwen/Qwen3-0.6B"}, "engine": engine},
    })


def llm_configs(rayservice: dict, with_router: bool = False) -> list[dict]:
    """The LLMConfigs of a rendered RayService; without `with_router`, their request router left
    out: Serve imports a router to validate it, and Ray Serve LLM's routers import vLLM, which this
    environment lacks (PrefixAware's router is validated by the real serving chain instead:
    tests/cluster/test_real_serving.py runs it)."""
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    configs = [cfg for app in config["applications"] for cfg in app["args"]["llm_configs"]]
    if not with_router:
        for cfg in configs:
            cfg["deployment_config"].pop("request_router_config", None)
    return configs


def rays_deployment_name(llm: LLMConfig) -> str:
    """Ray Serve LLM's own _get_deployment_name (core/server/builder.py), the function alone: the
    module imports vLLM, which this environment does not have."""
    return raysource.function("llm/_internal/serve/core/server/builder.py", "_get_deployment_name",
                              {"LLMConfig": LLMConfig})(llm)


def bundles(cfg: dict) -> tuple[LLMConfig, list[dict]]:
    """The placement bundles of one replica, as Ray computes them for the config: the placement
    group Serve creates before the replica (a multi-host slice: the rendered placement_group_config),
    or the one the replica reserves once started (Serve LLM's TPU topology path)."""
    llm = LLMConfig(**cfg)
    assert isinstance(llm.accelerator_config, TPUConfig)
    options = raysource.deployment_options(cfg)
    if "placement_group_bundles" in options:
        assert not llm.accelerator_config.topology  # else Serve LLM defers the group to the replica
        return llm, options["placement_group_bundles"]
    # Ray's VLLMEngineConfig.num_devices (importing it needs vLLM): tp x pp of the engine kwargs.
    devices = llm.engine_kwargs.get("tensor_parallel_size", 1) * llm.engine_kwargs.get("pipeline_parallel_size", 1)
    return llm, TPUAccelerator(llm.accelerator_config).default_bundles(num_devices=devices, accelerator_type_str=llm.accelerator_type)


def test_goldens_are_there():
    assert {p.stem for p in GOLDEN_SERVICES} >= {"service-v6e-4x4-qwen3-moe", "service-v6e-2x2-single-host", "service-v5p-2x2x2"}


@pytest.mark.parametrize("path", GOLDEN_SERVICES, ids=lambda p: p.stem)
def test_golden_serve_config_validates_with_rays_own_schemas(path):
    rayservice = yaml.safe_load(path.read_text())
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    schema = ServeDeploySchema(**config)
    (app,) = schema.applications
    assert (app.route_prefix, app.import_path) == ("/", "ray.serve.llm:build_openai_app")
    (cfg,) = llm_configs(rayservice)
    (raw,) = llm_configs(rayservice, with_router=True)
    router = raw["deployment_config"].get("request_router_config")
    assert router is None or router["request_router_class"] == REQUEST_ROUTERS["PrefixAware"], router
    llm = LLMConfig(**cfg)  # unknown or wrongly typed keys raise here
    # ... but not in deployment_config: Serve's DeploymentConfig ignores a key it does not know (a
    # misspelt graceful_shutdown_timeout_s would be dropped silently); every key must be an option
    # of serve.deployment
    known = set(inspect.signature(serve.deployment).parameters) - {"_func_or_class"}
    assert set(llm.deployment_config) | ({"request_router_config"} if router else set()) <= known, sorted(
        set(llm.deployment_config) - known)
    assert llm.accelerator_type == cfg["accelerator_type"]
    group = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    # Serve LLM's topology path on a single host; on a multi-host slice the replica's own placement group.
    assert llm.accelerator_config.topology == (
        group["template"]["spec"]["nodeSelector"][topology.GKE_TOPOLOGY_LABEL] if group["numOfHosts"] == 1 else None)
    # The replica count is the app's deployments override (a lightweight update when edited), and
    # it names the LLMServer deployment Ray Serve LLM builds from this llm_config (Serve refuses an
    # override of a deployment the application does not have).
    assert "autoscaling_config" not in llm.deployment_config
    overrides = {d.name: d for d in app.deployments}
    assert set(overrides) - {"OpenAiIngress"} == {"LLMServer:" + rays_deployment_name(llm)}, sorted(overrides)
    scaling = overrides["LLMServer:" + rays_deployment_name(llm)].autoscaling_config
    assert (scaling["min_replicas"], scaling["max_replicas"]) == (group["minReplicas"], group["maxReplicas"])


@pytest.mark.parametrize("path", GOLDEN_SERVICES, ids=lambda p: p.stem)
def test_golden_bundles_cover_exactly_the_slice(path):
    rayservice = yaml.safe_load(path.read_text())
    group = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    per_host = int(group["template"]["spec"]["containers"][0]["resources"]["limits"][topology.TPU_RESOURCE])
    (cfg,) = llm_configs(rayservice)
    llm, reserved = bundles(cfg)
    assert len(reserved) == group["numOfHosts"]
    assert all(b["TPU"] == per_host for b in reserved)
    assert all(b[f"accelerator_type:{llm.accelerator_type}"] > 0 for b in reserved)


def test_reference_v6e_4x4_reserves_four_hosts_of_four_chips():
    (cfg,) = llm_configs(yaml.safe_load((GOLDEN / "service-v6e-4x4-qwen3-moe.yaml").read_text()))
    _, reserved = bundles(cfg)
    assert [b["TPU"] for b in reserved] == [4, 4, 4, 4]


# The slices a service accepts, from the one predicate the parser asks (TPU7x and non-default layouts refused).
SERVICE_SLICES = [s for s in topology.all_slices() if service_api.serving_problem(s) is None]


@pytest.mark.parametrize("s", SERVICE_SLICES, ids=lambda s: f"{s.generation.name}-{s.topology}")
def test_every_slice_a_service_accepts_is_reserved_host_for_host(s):
    rs = render.rayservice(service(s.generation.name, s.topology))
    (cfg,) = llm_configs(rs)
    llm, reserved = bundles(cfg)
    assert len(reserved) == s.hosts and all(b["TPU"] == s.chips_per_host for b in reserved)
    assert sum(b["TPU"] for b in reserved) == s.chips
    # The slice placement group Ray creates at replica start checks the topology against its table.
    assert TPUAcceleratorManager.is_valid_tpu_accelerator_topology(get_tpu_version_from_type(llm.accelerator_type), s.topology)
    if s.hosts > 1:  # one bundle per host, the replica on worker 0 (its slice's head resource)
        assert reserved[0][f"TPU-{s.ray_pod_type}-head"] == 1 and not any("-head" in k for b in reserved[1:] for k in b)


def test_pipeline_parallel_still_reserves_the_whole_slice():
    (cfg,) = llm_configs(render.rayservice(service("v6e", "4x4", pipelineParallelSize=2)))
    assert cfg["engine_kwargs"]["tensor_parallel_size"] == 8
    _, reserved = bundles(cfg)
    assert [b["TPU"] for b in reserved] == [4, 4, 4, 4]


def test_why_two_host_2x4_is_refused_for_services():
    """Ray maps a v6e 2x4 topology to one 8-chip host: on two 4-chip hosts the replica's one
    8-chip bundle would never be placed, so parse_service refuses chipsPerHost 4 there."""
    (cfg,) = llm_configs(render.rayservice(service("v6e", "2x4")))
    _, reserved = bundles(cfg)
    assert [b["TPU"] for b in reserved] == [8]
    with pytest.raises(spec.InvalidSpec) as err:
        service("v6e", "2x4", chips_per_host=4)
    assert [e.path for e in err.value.errors] == ["spec.tpu.chipsPerHost"]


@pytest.mark.parametrize("wrong", ["v6e", "TPU-V6E-16"])
def test_ray_refuses_other_accelerator_spellings(wrong):
    """Why the operator writes TPU-V6E."""
    (cfg,) = llm_configs(render.rayservice(service("v6e", "4x4")))
    assert cfg["accelerator_type"] == "TPU-V6E"
    with pytest.raises(ValueError):
        LLMConfig(**{**cfg, "accelerator_type": wrong})


def test_ray_refuses_an_unknown_llm_config_key():
    """LLMConfig is strict, so the validation above can fail: a key Ray does not know is refused."""
    (cfg,) = llm_configs(render.rayservice(service("v6e", "4x4")))
    with pytest.raises(ValueError):
        LLMConfig(**{**cfg, "topology": "4x4"})


@pytest.mark.parametrize("model_name", ["qwen3", "Qwen/Qwen3-0.6B", "org/a.b/c_d-1.5"])
def test_the_replicas_override_names_the_deployment_ray_serve_llm_builds(model_name):
    svc = spec.parse_service({
        "kind": "TPUTorchService", "metadata": {"name": "svc", "namespace": "default"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.invalid/vllm:1",
                 "model": {"source": "Qwen/Qwen3-0.6B", "name": model_name}}})
    (app,) = ServeDeploySchema(**yaml.safe_load(render.rayservice(svc)["spec"]["serveConfigV2"])).applications
    (cfg,) = app.args["llm_configs"]
    override, ingress = app.deployments  # the ingress: on the head (issue 56)
    assert override.name == "LLMServer:" + rays_deployment_name(LLMConfig(**cfg)), override.name
    assert ingress.name == "OpenAiIngress"


def test_prefix_aware_routing_kwargs_are_the_routers_own_and_bound_the_tree():
    """Issue 56: the rendered request_router_config has only fields of Serve's RequestRouterConfig,
    and its kwargs bind to Ray 2.60's PrefixCacheAffinityRouter.initialize_state with a finite
    imbalance threshold and eviction on (Ray's defaults: inf and off)."""
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
    from ray.serve.config import RequestRouterConfig

    rs = render.rayservice(spec.parse_service({
        "kind": "TPUTorchService", "metadata": {"name": "svc", "namespace": "default"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "example.invalid/vllm:1",
                 "model": {"source": "Qwen/Qwen3-0.6B"}, "serve": {"routing": "PrefixAware"}}}))
    (cfg,) = llm_configs(rs, with_router=True)
    router = cfg["deployment_config"]["request_router_config"]
    # Serve's RequestRouterConfig fields (building one imports the class, whose public path imports
    # vLLM, absent here); the public class is a plain subclass of the one read here.
    assert set(router) <= set(RequestRouterConfig.model_fields), router
    assert router["request_router_class"].rsplit(":", 1)[1] == PrefixCacheAffinityRouter.__name__
    public = (pathlib.Path(serve.__file__).parent / "llm" / "request_router.py").read_text()
    assert "prefix_aware_router import" in public and "def initialize_state" not in public
    bound = inspect.signature(PrefixCacheAffinityRouter.initialize_state).bind(None, **router["request_router_kwargs"])
    defaults = inspect.signature(PrefixCacheAffinityRouter.initialize_state).parameters
    assert defaults["imbalanced_threshold"].default == float("inf") and defaults["do_eviction"].default is False
    assert bound.arguments["imbalanced_threshold"] == service_api.SERVICE_DEFAULTS["serve.targetOngoingRequests"]
    assert bound.arguments["do_eviction"] is True


def reserved_slice_bundles(cfg: dict, monkeypatch) -> list[dict]:
    """The bundles of the slice placement group a replica reserves once started, as Ray 2.60's code
    makes them: TPUAccelerator.create_placement_group on the LLMConfig's bundles (an explicit
    placement_group_config's, with the accelerator hint Ray adds, else the backend's defaults), then
    SlicePlacementGroup's get_tpu_worker_resources (stopped there: no Ray cluster here)."""
    from ray.llm._internal.serve.core.configs import accelerators
    from ray.util.tpu import get_tpu_worker_resources

    llm, defaults = bundles(cfg)
    asked = ([{f"accelerator_type:{llm.accelerator_type}": 0.001, **b} for b in cfg["placement_group_config"]["bundles"]]
             if cfg.get("placement_group_config") else defaults)
    made = {}

    def slice_placement_group(**kwargs):
        made.update(kwargs)
        return types.SimpleNamespace(placement_group=None)
    monkeypatch.setattr(accelerators, "slice_placement_group", slice_placement_group)
    TPUAccelerator(llm.accelerator_config).create_placement_group(
        bundles=asked, strategy="PACK", name="", accelerator_type_str=llm.accelerator_type)
    count, resources = get_tpu_worker_resources(topology=made["topology"], accelerator_type=made["accelerator_version"],
                                                resources_per_worker=made["resources_per_bundle"], num_slices=1,
                                                tpu_resource_per_chip=1)
    return [resources] * count


@pytest.mark.parametrize("s", [s for s in SERVICE_SLICES if s.hosts == 1], ids=lambda s: f"{s.generation.name}-{s.topology}")
def test_a_single_host_prefix_aware_replica_reserves_its_slice_without_a_cpu(s, monkeypatch):
    """Issue 56: a PrefixAware service's TPU hosts have no Ray CPU (the prefix tree's actor can only
    go to the head), and Ray's slice placement group asks 1 CPU per bundle unless the bundle names
    CPU: the replica's own slice would never be placed. Its bundle asks none, and the same chips."""
    def rendered(routing: str) -> dict:
        rs = render.rayservice(spec.parse_service({
            "kind": "TPUTorchService", "metadata": {"name": "svc", "namespace": "default"},
            "spec": {"tpu": {"accelerator": s.generation.name, "topology": s.topology}, "image": "example.invalid/vllm:1",
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "serve": {"routing": routing}}}))
        group = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
        return llm_configs(rs)[0], (group.get("resources") or {}).get("CPU")

    cfg, host_cpus = rendered("PrefixAware")
    assert host_cpus == "0"
    (reserved,) = reserved_slice_bundles(cfg, monkeypatch)
    assert reserved.get("CPU") == 0 and reserved["TPU"] == s.chips_per_host
    # Serve's own routing: the hosts keep their CPUs, and Ray's slice what it asked before
    cfg, host_cpus = rendered("PowerOfTwo")
    assert host_cpus is None and cfg.get("placement_group_config") is None
    (reserved,) = reserved_slice_bundles(cfg, monkeypatch)
    assert reserved["CPU"] == 1 and reserved["TPU"] == s.chips_per_host
