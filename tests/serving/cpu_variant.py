"""The operator's own serveConfigV2 for a TPUTorchService, made a CPU one by the one function that
lists what the CPU chain changes (hack/fakedash/cpu_serving.py, which the stand-in dashboard also
applies to what KubeRay sends a real Ray head)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))

from fakedash import cpu_serving  # noqa: E402
from tputorch.render import serveconfig  # noqa: E402
from tputorch.api import spec  # noqa: E402

# The simulated TPU host advertises what Ray gives a v6e 2x2 host: its 4 chips (the slice the
# replica reserves, cpu_serving point 4) and the generation's resource, so the operator's pin
# (ray_actor_options.resources accelerator_type:TPU-V6E) is honoured as on GKE.
HOST_RESOURCES = {"TPU": 4, "accelerator_type:TPU-V6E": 1}
# What the CPU chain's services set in their spec: a short context and a small KV cache, no CUDA graphs.
ENGINE = {"maxModelLen": 256, "args": {"enforce_eager": True, "kv_cache_memory_bytes": 64 * 2**20}}


def service_body(model_source: str, name: str = "tiny", namespace: str = "serving") -> dict:
    return {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-vllm:2.60.0",
                     "model": {"source": model_source, "name": name}, "engine": ENGINE}}


def service(model_source: str, name: str = "tiny") -> spec.ServiceSpec:
    return spec.parse_service(service_body(model_source, name))


def serve_config(model_source: str, http_port: int = 8000) -> dict:
    cfg = cpu_serving.to_cpu(serveconfig.serve_config(service(model_source)))
    # A head started by the config itself (tests/serving/record_serve.py): Serve's HTTP port on
    # loopback, chosen free. The cluster chain's head starts Serve with these options instead.
    cfg["http_options"] = {**cfg.get("http_options", {}), "host": "127.0.0.1", "port": http_port}
    return cfg
