"""The local cluster's stand-in GKE Ray TPU webhook (hack/tpu_webhook.py): the variables it sets and,
on a multi-host slice, the pod affinity that keeps the slice's hosts in one node pool, as GKE's does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HACK = Path(__file__).resolve().parents[2] / "hack" / "tpu_webhook.py"
_spec = importlib.util.spec_from_file_location("tpu_webhook", HACK)
webhook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(webhook)

ONE_POOL = {"labelSelector": {"matchLabels": {"ray.io/worker-group-replica-name": "svc-tpu-slice-ab12c"}},
            "topologyKey": "cloud.google.com/gke-nodepool"}


def tpu_pod(topology: str, host: str = "1", affinity: dict | None = None) -> dict:
    spec = {"nodeSelector": {"cloud.google.com/gke-tpu-topology": topology},
            "containers": [{"name": "ray-worker", "env": [], "resources": {"limits": {"google.com/tpu": "4"}}}]}
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"labels": {"ray.io/cluster": "svc", "ray.io/group": "tpu-slice",
                                    "ray.io/worker-group-replica-name": "svc-tpu-slice-ab12c",
                                    "ray.io/replica-host-index": host}}, "spec": spec}


def affinity_ops(ops: list[dict]) -> list[dict]:
    return [op for op in ops if op["path"].startswith("/spec/affinity")]


def test_a_multi_host_slices_pod_is_kept_in_its_replicas_node_pool():
    ops = webhook.patch_for(tpu_pod("4x4"))
    assert affinity_ops(ops) == [{"op": "add", "path": "/spec/affinity", "value": {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [ONE_POOL]}}}]
    # and the variables as before
    assert {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "TPU_WORKER_ID", "value": "1"}} in ops


def test_an_affinity_the_pod_has_is_kept_and_the_term_added_to_it():
    node = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    assert affinity_ops(webhook.patch_for(tpu_pod("2x4", affinity=node))) == [
        {"op": "add", "path": "/spec/affinity/podAffinity",
         "value": {"requiredDuringSchedulingIgnoredDuringExecution": [ONE_POOL]}}]
    other = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
    held = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [other]}}
    assert affinity_ops(webhook.patch_for(tpu_pod("2x4", affinity=held))) == [
        {"op": "add", "path": "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/-",
         "value": ONE_POOL}]


def test_a_single_host_slice_and_a_cpu_pod_get_no_affinity():
    assert affinity_ops(webhook.patch_for(tpu_pod("2x2"))) == []  # 4 chips on one host
    cpu = {"metadata": {"labels": {"ray.io/worker-group-replica-name": "r"}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}}
    assert webhook.patch_for(cpu) == []
