"""The CPU chain serves the operator's own serveConfigV2: only what a TPU needs and CPU cannot give
differs, each difference listed in cpu_variant.py. This pins that list."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_variant  # noqa: E402
from tputorch import render  # noqa: E402


def test_the_cpu_config_is_the_operators_but_for_the_listed_differences():
    ours = render.serve_config(cpu_variant.service("/models/tiny"))
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
