"""The CPU chain serves the operator's own serveConfigV2: only what a TPU needs and CPU cannot give
differs, each difference listed in cpu_variant.py. This pins that list."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_variant  # noqa: E402
from tputorch import render  # noqa: E402
from tputorch.render.serveconfig import serve_config


def test_the_cpu_config_is_the_operators_but_for_the_listed_differences():
    ours = serve_config(cpu_variant.service("/models/tiny"))
    cpu = cpu_variant.serve_config("/models/tiny", 18000)
    (o,), (c,) = ours["applications"][0]["args"]["llm_configs"], cpu["applications"][0]["args"]["llm_configs"]
    assert {k for k in o if o.get(k) != c.get(k)} | {k for k in c if k not in o} == {
        "accelerator_type", "accelerator_config", "engine_kwargs", "runtime_env", "placement_group_config"}
    # The replica still reserves its slice: the v6e 2x2's one host with its 4 chips.
    assert c["placement_group_config"] == {"bundles": [{"TPU": 4}], "strategy": "STRICT_SPREAD"}
    # pipeline_parallel_size is 1 on both (the TPU config's tensor parallelism spans the slice's 4 chips).
    assert {k for k in o["engine_kwargs"] if o["engine_kwargs"][k] != c["engine_kwargs"][k]} == {"tensor_parallel_size"}
    # The deployment options (autoscaling, request limits, health checks, the TPU-host pin) are the operator's.
    assert c["deployment_config"] == o["deployment_config"]
    assert c["deployment_config"]["ray_actor_options"]["resources"].keys() <= cpu_variant.HOST_RESOURCES.keys()
    app_o = {k: v for k, v in ours["applications"][0].items() if k != "args"}
    app_c = {k: v for k, v in cpu["applications"][0].items() if k != "args"}
    assert app_o == app_c and set(cpu) == set(ours)
    # Only where the proxy listens differs; its keep-alive (above a Google load balancer's 600 s) is the operator's.
    assert cpu["http_options"] == {**ours["http_options"], "host": "127.0.0.1", "port": 18000}


def test_the_slice_a_cpu_replica_reserves_is_rays_tpu_slice():
    """cpu_serving's rule (the stand-in runs without Ray) against Ray 2.60's own chips per host."""
    import math

    from fakedash import cpu_serving
    from ray._private.accelerators.tpu import get_chips_per_host
    from ray.util.tpu import get_tpu_version_from_type

    cases = [("TPU-V6E", t) for t in ("1x1", "2x2", "2x4", "4x4", "16x16")] + [
        ("TPU-V5LITEPOD", t) for t in ("2x4", "4x8")] + [(g, t) for g in ("TPU-V5P", "TPU-V4", "TPU-V7X")
                                                          for t in ("2x2x1", "2x2x2", "4x4x4")]
    for accelerator_type, topology in cases:
        per_host = get_chips_per_host(topology, get_tpu_version_from_type(accelerator_type))
        chips = math.prod(int(d) for d in topology.split("x"))
        expected = [{"TPU": min(chips, per_host)}] * max(1, chips // per_host)
        assert cpu_serving.slice_bundles(accelerator_type, topology) == expected, (accelerator_type, topology)


def cached_service(claim: str = "tiny-models"):
    body = cpu_variant.service_body("tputorch/tiny")
    body["spec"]["volumes"] = [{"name": "models", "mountPath": "/models", "pvc": {"claimName": claim}}]
    body["spec"]["model"]["cacheVolume"] = "models"
    from tputorch.api import spec

    return spec.parse_service(body)


def test_the_replicas_cache_env_is_the_pods_with_the_pvc_made_a_local_directory():
    """cpu_serving 5.: the model cache env of the TPU host pods the operator renders (HF_HOME,
    VLLM_CACHE_ROOT and TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT under spec.model.cacheVolume's mountPath), the PVC's mountPath replaced by the
    local directory that stands for it."""
    import pytest

    from fakedash import cpu_serving

    rayservice = render.rayservice(cached_service())
    env = cpu_serving.pod_cache_env(rayservice, {"tiny-models": "/tmp/pvc/"})
    assert env == {"HF_HOME": "/tmp/pvc/huggingface", "VLLM_CACHE_ROOT": "/tmp/pvc/vllm/v6e-2x2",
                   "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": "/tmp/pvc/torch-tpu/v6e-2x2"}
    # The pods do carry them (under /models), and a path on no listed PVC is refused, not guessed.
    (group,) = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    pod_env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
    assert (pod_env["HF_HOME"], pod_env["VLLM_CACHE_ROOT"]) == ("/models/huggingface", "/models/vllm/v6e-2x2")
    with pytest.raises(ValueError, match="not on a PVC"):
        cpu_serving.pod_cache_env(rayservice, {"other-claim": "/tmp/pvc"})
    with pytest.raises(ValueError, match="sets \\[\\]"):
        cpu_serving.pod_cache_env(render.rayservice(cpu_variant.service("tputorch/tiny")), {"tiny-models": "/tmp/pvc"})


def test_a_serve_env_with_a_hub_turns_offline_mode_off_and_adds_only_itself():
    from fakedash import cpu_serving

    ours = serve_config(cached_service())
    serve_env = {"HF_HOME": "/tmp/pvc/huggingface", "VLLM_CACHE_ROOT": "/tmp/pvc/vllm/v6e-2x2",
                 "HF_ENDPOINT": "http://127.0.0.1:18080"}
    (plain,) = cpu_serving.to_cpu(ours)["applications"][0]["args"]["llm_configs"]
    (hub,) = cpu_serving.to_cpu(ours, serve_env)["applications"][0]["args"]["llm_configs"]
    assert plain["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"
    # "0", not absent: the local head runs with HF_HUB_OFFLINE=1 and its workers inherit it.
    assert hub["runtime_env"]["env_vars"] == {**plain["runtime_env"]["env_vars"], **serve_env, "HF_HUB_OFFLINE": "0"}
    assert {k: v for k, v in hub.items() if k != "runtime_env"} == {k: v for k, v in plain.items() if k != "runtime_env"}
    # Cache env alone (a local-path model on a cache volume) stays offline.
    (cache_only,) = cpu_serving.to_cpu(ours, {"HF_HOME": "/tmp/pvc/huggingface"})["applications"][0]["args"]["llm_configs"]
    assert cache_only["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"


def test_the_stand_in_keeps_a_backends_serve_env_only_for_the_cpu_variant():
    from fakedash import control
    from fakedash.state import State

    state = State()
    backend = {"url": "http://127.0.0.1:8265", "serve_url": "http://127.0.0.1:18000", "serve_variant": "cpu",
               "serve_env": {"HF_ENDPOINT": "http://127.0.0.1:18080"}}
    assert control.handle(state, "PUT", ["backends", "ns"], {}, backend, 0)[0] == 200
    assert state.serve_backend("ns", "any")["env"] == backend["serve_env"]
    assert control.handle(state, "GET", ["backends", "ns"], {}, {}, 0)[1]["serve_env"] == backend["serve_env"]
    for bad in ({**backend, "serve_variant": None}, {**backend, "serve_env": {"1X": "y"}},
                {**backend, "serve_env": {"X": 1}}, {**backend, "serve_env": ["X=y"]}):
        code, answer = control.handle(state, "PUT", ["backends", "ns"], {}, bad, 0)
        assert code == 400 and "serve_env" in answer["error"], (bad, answer)
    # Registered again without it: the replica gets the CPU env alone.
    control.handle(state, "PUT", ["backends", "ns"], {}, {k: v for k, v in backend.items() if k != "serve_env"}, 0)
    assert state.serve_backend("ns", "any")["env"] is None
