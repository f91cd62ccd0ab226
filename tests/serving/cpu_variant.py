"""The operator's own serveConfigV2 for a TPUTorchService, and the one place that lists what the
CPU chain changes in it because a TPU needs it and CPU cannot give it. Everything else (the
application, import path, model loading config, deployment_config with autoscaling, request limits,
health checks and the replica's pin to a TPU host) is the operator's, byte for byte."""

from __future__ import annotations

import copy

from tputorch import render
from tputorch.api import spec

# The simulated TPU host advertises the resource Ray gives every v6e host, so the operator's pin
# (ray_actor_options.resources accelerator_type:TPU-V6E) is honoured as on GKE.
HOST_RESOURCES = {"accelerator_type:TPU-V6E": 1}


def service(model_source: str, name: str = "tiny") -> spec.ServiceSpec:
    return spec.parse_service({
        "kind": "TPUTorchService", "metadata": {"name": name, "namespace": "serving"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm:2.60.0",
                 "model": {"source": model_source, "name": name},
                 "engine": {"maxModelLen": 256, "args": {"enforce_eager": True, "kv_cache_memory_bytes": 64 * 2**20}}}})


def serve_config(model_source: str, http_port: int = 8000) -> dict:
    cfg = copy.deepcopy(render.serve_config(service(model_source)))
    (llm,) = cfg["applications"][0]["args"]["llm_configs"]
    # 1. No TPU: vLLM's CPU platform, not the TPU one (accelerator_type names a TPU generation).
    llm.pop("accelerator_type")
    llm["accelerator_config"] = {"kind": "cpu"}
    # 2. One CPU process instead of tensor parallelism over the slice's 4 chips.
    llm["engine_kwargs"].update(tensor_parallel_size=1, pipeline_parallel_size=1)
    # 3. No hub, one loopback host, and vLLM's CPU KV cache kept small (it takes 90 % of RAM otherwise).
    llm["runtime_env"] = {"env_vars": {"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1"}}
    # 4. Serve's HTTP port on loopback, chosen free (KubeRay's pods use 8000 on their own IP).
    cfg["http_options"] = {"host": "127.0.0.1", "port": http_port}
    return cfg
