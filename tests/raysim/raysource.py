"""Functions of Ray's own source whose modules cannot be imported here (they import vLLM, which
this environment lacks): each compiled alone from the installed Ray's file, in a scope the caller
gives for the names it uses. Ray's code runs as written; only its module's imports are skipped."""

from __future__ import annotations

import ast
import pathlib

import ray


def function(relative_path: str, name: str, scope: dict, cls: str | None = None):
    """The function ``name`` of ray/<relative_path> (a method of class ``cls`` when given, called
    with its instance or class as the first argument: decorators are left out), compiled in ``scope``."""
    path = pathlib.Path(ray.__file__).parent / relative_path
    body = ast.parse(path.read_text()).body
    if cls is not None:
        (klass,) = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        body = klass.body
    (fn,) = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    fn.decorator_list = []
    namespace = dict(scope)
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102 (Ray's code)
    return namespace[name]


_VLLM_MODELS = "llm/_internal/serve/engines/vllm/vllm_models.py"
_LLM_SERVER = "llm/_internal/serve/core/server/llm_server.py"


def deployment_options(cfg: dict) -> dict:
    """What Ray 2.60 Serve LLM gives serve.deployment for an LLMServer built from ``cfg`` (an
    llm_config as rendered): LLMServer.get_deployment_options on Ray's VLLMEngineConfig's
    placement_bundles and placement_strategy (engines/vllm/vllm_models.py) of the validated
    LLMConfig. With placement_group_bundles, Serve creates the replica's placement group before
    the replica and starts the replica in bundle 0; without (a deferred TPU group: Serve LLM's
    topology path), the replica reserves its slice once started."""
    import copy
    import types

    from ray.llm._internal.serve import constants
    from ray.llm._internal.serve.core.configs.accelerators import (
        CPUAccelerator, GPUAccelerator, TPUAccelerator, TPUConfig, format_ray_accelerator_resource)
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    llm = LLMConfig(**cfg)
    accel = llm.accelerator_config
    kwargs = llm.engine_kwargs
    engine = types.SimpleNamespace(
        placement_group_config=llm.placement_group_config,
        accelerator_type=llm.accelerator_type,
        # VLLMEngineConfig.num_devices: tensor x pipeline parallel of the engine kwargs
        num_devices=kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1),
        accelerator=TPUAccelerator(accel) if isinstance(accel, TPUConfig) else
        (CPUAccelerator() if accel is not None and accel.kind == "cpu" else GPUAccelerator()))
    scope = {"format_ray_accelerator_resource": format_ray_accelerator_resource}
    engine.placement_bundles = function(_VLLM_MODELS, "placement_bundles", scope, cls="VLLMEngineConfig")(engine)
    engine.placement_strategy = function(_VLLM_MODELS, "placement_strategy", scope, cls="VLLMEngineConfig")(engine)
    merge = function(_LLM_SERVER, "_merge_replica_actor_and_child_actor_bundles", {"copy": copy})
    # The replica's runtime_env default is the driver's (ray.get_runtime_context()): none here.
    no_driver = types.SimpleNamespace(get_runtime_context=lambda: types.SimpleNamespace(runtime_env={}))
    get_options = function(_LLM_SERVER, "get_deployment_options", {
        "copy": copy, "ray": no_driver, "_merge_replica_actor_and_child_actor_bundles": merge,
        "ENABLE_WORKER_PROCESS_SETUP_HOOK": constants.ENABLE_WORKER_PROCESS_SETUP_HOOK}, cls="LLMServer")
    as_built = types.SimpleNamespace(deployment_config=llm.deployment_config, runtime_env=llm.runtime_env,
                                     get_engine_config=lambda: engine)
    return get_options(None, as_built)
