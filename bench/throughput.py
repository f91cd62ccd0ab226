"""Pure render + validate throughput on one core, with baselines measured in the same run.

Operator path: spec.parse(body) + render.rayjob(job) for one TPUTorchJob body.
Baselines: copy.deepcopy of the rendered RayJob dict, and a json.dumps/json.loads round trip of it
(the least work any controller does with an object of that size).
"""

from __future__ import annotations

import copy
import json
import time

from tputorch import render
from tputorch.api import spec


def job_body(name: str = "bench", namespace: str = "bench", suspend: bool = True, topo: str = "4x4") -> dict:
    return {
        "apiVersion": "tputorch.io/v1alpha1",
        "kind": "TPUTorchJob",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {
            "tpu": {"accelerator": "v6e", "topology": topo},
            "image": "example.com/ray-torch-tpu:2.60.0",
            "entrypoint": "python train.py --epochs 1",
            "head": {"cpu": "1", "memory": "2Gi"},
            "worker": {"cpu": "4", "memory": "16Gi"},
            "env": [{"name": "BENCH", "value": "1"}],
            "suspend": suspend,
        },
    }


def _rate(fn, seconds: float) -> tuple[float, int]:
    """Calls per second of fn over about ``seconds`` (after a short warm-up)."""
    for _ in range(50):
        fn()
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(100):
            fn()
        n += 100
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start), n


def run(seconds: float = 3.0) -> dict:
    body = job_body()
    rendered = render.rayjob(spec.parse(body))

    def operator_path():
        render.rayjob(spec.parse(body))

    results = {}
    for label, fn in (
        ("parse+render", operator_path),
        ("parse only", lambda: spec.parse(body)),
        ("render only", (lambda job: (lambda: render.rayjob(job)))(spec.parse(body))),
        ("baseline: copy.deepcopy(rayjob)", lambda: copy.deepcopy(rendered)),
        ("baseline: json round trip(rayjob)", lambda: json.loads(json.dumps(rendered))),
    ):
        rate, n = _rate(fn, seconds)
        results[label] = {"per_s": rate, "calls": n, "us_per_call": 1e6 / rate}
    op = results["parse+render"]["per_s"]
    for label in list(results):
        if label.startswith("baseline"):
            results[label]["operator_ratio"] = op / results[label]["per_s"]
    return {"rows": results, "target_per_s": 2000, "met": op >= 2000,
            "rayjob_bytes": len(json.dumps(rendered))}
