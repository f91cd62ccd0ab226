"""Builders for TPUTorchService bodies used across the unit tests."""

import copy


def service_body(name="qwen", namespace="ml", **spec_overrides):
    spec = {
        "tpu": {"accelerator": "v6e", "topology": "4x4"},
        "image": "example.com/ray-vllm-torchtpu:2.60.0",
        "model": {"source": "Qwen/Qwen3-30B-A3B"},
    }
    for key, value in spec_overrides.items():
        if key in ("tpu", "model", "engine", "replicas") and isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return {
        "apiVersion": "tputorch.io/v1alpha1",
        "kind": "TPUTorchService",
        "metadata": {"name": name, "namespace": namespace, "uid": "5e7a0c2d-1111-2222-3333-444455556666", "generation": 1},
        "spec": copy.deepcopy(spec),
    }


def merge_patch(target, patch):
    """A JSON merge patch (RFC 7386) applied as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out
