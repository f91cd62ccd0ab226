"""Smoke tests of the local cluster itself (hack/cluster.sh): API server, scheduler, KWOK fake TPU
nodes, the KubeRay operator and the fake Ray dashboard, end to end through a RayJob in K8sJobMode.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

RAY_IMAGE = "rayproject/ray:2.60.0-py311"  # never pulled: KWOK fakes the kubelet
V6E = "tpu-v6e-slice"


def rayjob(name: str, namespace: str, accelerator: str, topology: str, hosts: int, chips: int = 4) -> dict:
    """A minimal RayJob for one TPU slice: a CPU head and `hosts` TPU workers of `chips` chips."""
    tpu = {"cpu": "4", "memory": "16Gi", "google.com/tpu": str(chips)}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "entrypoint": "python -c 'print(42)'",
            "submissionMode": "K8sJobMode",
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{
                        "name": "ray-head", "image": RAY_IMAGE,
                        "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                                      "limits": {"cpu": "1", "memory": "2Gi"}},
                    }]}},
                },
                "workerGroupSpecs": [{
                    "groupName": "tpu",
                    "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                    "numOfHosts": hosts,
                    "rayStartParams": {},
                    "template": {"spec": {
                        "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": accelerator,
                                         "cloud.google.com/gke-tpu-topology": topology},
                        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "containers": [{"name": "ray-worker", "image": RAY_IMAGE,
                                        "resources": {"requests": dict(tpu), "limits": dict(tpu)}}],
                    }},
                }],
            },
        },
    }


def get_rayjob(kube, ns, name) -> dict:
    return kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayjobs", name)


def status(kube, ns, name) -> dict:
    return get_rayjob(kube, ns, name).get("status") or {}


def running_pods(kube, ns, selector):
    pods = kube.core.list_namespaced_pod(ns, label_selector=selector).items
    return [p for p in pods if p.status.phase == "Running" and p.spec.node_name]


def start_slice_job(kube, dashboard, ns, name, accelerator, topology, hosts):
    kube.custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayjobs",
                                                rayjob(name, ns, accelerator, topology, hosts))
    cluster = kube.wait(lambda: status(kube, ns, name).get("rayClusterName"), 60, "RayCluster name")
    kube.wait(lambda: kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", cluster),
              30, f"RayCluster {cluster}")

    heads = kube.wait(lambda: running_pods(kube, ns, f"ray.io/cluster={cluster},ray.io/node-type=head"),
                      90, "head pod Running")
    workers = kube.wait(lambda: (lambda w: w if len(w) == hosts else None)(
        running_pods(kube, ns, f"ray.io/cluster={cluster},ray.io/node-type=worker")),
        90, f"{hosts} worker pods Running")

    nodes = {n.metadata.name: n for n in kube.core.list_node().items}
    (head,) = heads
    head_node = nodes[head.spec.node_name]
    assert "cloud.google.com/gke-tpu-accelerator" not in head_node.metadata.labels, "head must be on a CPU node"
    worker_nodes = [nodes[p.spec.node_name] for p in workers]
    assert len({n.metadata.name for n in worker_nodes}) == hosts, "one TPU host per worker pod"
    for n in worker_nodes:
        assert n.metadata.labels["cloud.google.com/gke-tpu-accelerator"] == accelerator
        assert n.metadata.labels["cloud.google.com/gke-tpu-topology"] == topology
    pools = {n.metadata.labels["cloud.google.com/gke-nodepool"] for n in worker_nodes}
    assert len(pools) == 1, f"one slice = one node pool, got {pools}"
    for p in workers:
        c = p.spec.containers[0]
        assert c.resources.limits["google.com/tpu"] == c.resources.requests["google.com/tpu"] == "4"
    if hosts > 1:  # RayMultiHostIndexing is on: KubeRay labels each host of a multi-host slice
        assert sorted(p.metadata.labels.get("ray.io/replica-host-index") for p in workers) == \
            [str(i) for i in range(hosts)]

    s = kube.wait(lambda: (lambda s: s if s.get("jobDeploymentStatus") == "Running"
                           and s.get("jobStatus") == "RUNNING" else None)(status(kube, ns, name)),
                  90, "RayJob Running/RUNNING")
    assert s["dashboardURL"].startswith(f"{cluster}-head-svc.{ns}.svc.")
    # KubeRay asked the (fake) dashboard, through the proxy, about this job.
    seen = dashboard.requests(namespace=ns, rayjob=name)
    assert any(r["method"] == "GET" and r["path"] == f"/api/jobs/{s['jobId']}" for r in seen), seen
    return cluster


def test_v6e_4x4_rayjob_succeeds(kube, namespace, dashboard):
    name = "smoke-v6e-4x4"
    start_slice_job(kube, dashboard, namespace, name, V6E, "4x4", hosts=4)

    dashboard.set_job_status(namespace, name, "SUCCEEDED", message="all good")
    s = kube.wait(lambda: (lambda s: s if s.get("jobDeploymentStatus") in ("Complete", "Failed") else None)(
        status(kube, namespace, name)), 90, "RayJob terminal")
    assert s["jobStatus"] == "SUCCEEDED", s
    assert s["jobDeploymentStatus"] == "Complete", s


def test_v6e_2x2_rayjob_fails(kube, namespace, dashboard):
    name = "smoke-v6e-2x2"
    start_slice_job(kube, dashboard, namespace, name, V6E, "2x2", hosts=1)

    dashboard.set_job_status(namespace, name, "FAILED", message="Traceback: boom")
    s = kube.wait(lambda: (lambda s: s if s.get("jobDeploymentStatus") in ("Complete", "Failed") else None)(
        status(kube, namespace, name)), 90, "RayJob terminal")
    assert s["jobStatus"] == "FAILED", s
    assert s["jobDeploymentStatus"] == "Failed", s
    assert s.get("reason") == "AppFailed", s
    assert "boom" in s.get("message", ""), s
