"""Builders for TPUTorchJob bodies used across the unit tests."""

import copy


def body(name="demo", namespace="ml", **spec_overrides):
    spec = {
        "tpu": {"accelerator": "v6e", "topology": "4x4"},
        "image": "example.com/ray-torch-tpu:2.60.0",
        "entrypoint": "python train.py",
    }
    for key, value in spec_overrides.items():
        if key == "tpu":
            spec["tpu"] = {**spec["tpu"], **value}
        else:
            spec[key] = value
    return {
        "apiVersion": "tputorch.io/v1alpha1",
        "kind": "TPUTorchJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "0b6c1f4e-1111-2222-3333-444455556666", "generation": 1},
        "spec": copy.deepcopy(spec),
    }
