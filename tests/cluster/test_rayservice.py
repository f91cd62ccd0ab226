"""KubeRay's real RayService controller against the stand-in dashboard's Ray Serve REST API.

A hand-written minimal RayService (CPU-only head, no worker group): KubeRay creates its RayCluster,
puts the Serve config through `PUT /api/serve/applications/`, reads the applications back, checks
the head's Serve proxy (`/-/healthz`), labels the head pod `ray.io/serve=true` and, once
`<name>-serve-svc` has an endpoint, marks the RayService Ready.
"""

from __future__ import annotations

import json
import time

import yaml

RAY_IMAGE = "rayproject/ray:2.60.0-py311"  # never pulled: KWOK fakes the kubelet
SERVE_CONFIG = {"applications": [{"name": "echo", "route_prefix": "/", "import_path": "echo:app",
                                  "deployments": [{"name": "Echo", "num_replicas": 1}]}]}


def rayservice(name: str) -> dict:
    resources = {"cpu": "1", "memory": "2Gi"}
    return {
        "apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": name},
        "spec": {
            "serveConfigV2": yaml.safe_dump(SERVE_CONFIG),
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{
                    "name": "ray-head", "image": RAY_IMAGE,
                    "ports": [{"containerPort": 8265, "name": "dashboard"}, {"containerPort": 8000, "name": "serve"}],
                    "resources": {"requests": resources, "limits": resources},
                }]}}},
            },
        },
    }


def get(kube, ns, name) -> dict:
    return kube.custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayservices", name)


def ready(kube, ns, name):
    st = get(kube, ns, name).get("status") or {}
    cond = next((c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
    return st if cond.get("status") == "True" and st.get("serviceStatus") == "Running" else None


def test_a_minimal_rayservice_becomes_ready(kube, namespace, dashboard):
    name = "echo"
    kube.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", rayservice(name))
    t0 = time.monotonic()

    # While the applications deploy, the RayService is not Ready.
    state = kube.wait(lambda: dashboard.serve(namespace, name), 120, "KubeRay to put the Serve config")
    assert state["config"] == SERVE_CONFIG, state["config"]
    assert state["cluster"].startswith(f"{name}-")

    st = kube.wait(lambda: ready(kube, namespace, name), 180, "RayService Ready")
    elapsed = time.monotonic() - t0
    app = st["activeServiceStatus"]["applicationStatuses"]["echo"]
    assert app["status"] == "RUNNING" and app["serveDeploymentStatuses"]["Echo"]["status"] == "HEALTHY", app
    assert st["activeServiceStatus"]["rayClusterName"] == state["cluster"]
    assert st["numServeEndpoints"] >= 1

    svc = kube.core.read_namespaced_service(f"{name}-serve-svc", namespace)
    assert {p.port for p in svc.spec.ports} == {8000}
    head = kube.core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={state['cluster']},ray.io/node-type=head").items
    assert len(head) == 1 and head[0].metadata.labels.get("ray.io/serve") == "true"
    endpoints = kube.core.read_namespaced_endpoints(f"{name}-serve-svc", namespace)
    assert [a.ip for s in endpoints.subsets for a in s.addresses] == [head[0].status.pod_ip]

    # KubeRay went through the Serve API of this RayCluster's dashboard, and the proxy health check.
    seen = dashboard.requests(namespace=namespace, cluster=state["cluster"])
    assert {(r["method"], r["path"]) for r in seen} >= {("PUT", "/api/serve/applications/"),
                                                       ("GET", "/api/serve/applications/"), ("GET", "/-/healthz")}
    assert elapsed < 120, elapsed


def test_a_failed_deploy_is_reported_and_the_rayservice_stays_not_ready(kube, namespace, dashboard):
    name = "broken"
    kube.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", rayservice(name))
    kube.wait(lambda: dashboard.serve(namespace, name), 120, "KubeRay to put the Serve config")
    dashboard.set_serve_status(namespace, name, "DEPLOY_FAILED", message="import echo failed")

    def failed():
        st = get(kube, namespace, name).get("status") or {}
        apps = (st.get("pendingServiceStatus") or {}).get("applicationStatuses") or \
            (st.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
        return st if (apps.get("echo") or {}).get("status") == "DEPLOY_FAILED" else None

    st = kube.wait(failed, 120, "DEPLOY_FAILED in the RayService status")
    assert st.get("serviceStatus") != "Running", json.dumps(st)
    time.sleep(5)  # KubeRay keeps polling: still not Ready
    assert ready(kube, namespace, name) is None


def test_kuberays_autoscaler_alone_holds_the_api_token_of_a_service_head(kube, namespace):
    """The operator's rendered RayService, at the real KubeRay: the head pod KubeRay makes has no
    pod-wide token (the ServiceAccount admission plugin adds none), its autoscaler container mounts
    the projected token volume where in-cluster clients read it, and the Ray container does not."""
    from tputorch import render
    from tputorch.render.cluster import AUTOSCALER_TOKEN_VOLUME
    from tputorch.api import spec

    body = {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService", "metadata": {"name": "tok", "namespace": namespace},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": RAY_IMAGE,
                     "model": {"source": "Qwen/Qwen3-0.6B"}, "replicas": {"min": 1, "max": 2}}}
    child = render.rayservice(spec.parse_service(body))
    kube.custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", child)

    def head():
        pods = kube.core.list_namespaced_pod(namespace, label_selector="ray.io/node-type=head").items
        return pods[0] if pods else None
    pod = kube.wait(head, 120, "KubeRay to create the service's head pod")
    assert pod.spec.automount_service_account_token is False
    containers = {c.name: c for c in pod.spec.containers}
    assert set(containers) == {"ray-head", "autoscaler"}, set(containers)
    token_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    mounts = {name: {m.mount_path: m.name for m in c.volume_mounts or []} for name, c in containers.items()}
    assert mounts["autoscaler"].get(token_dir) == AUTOSCALER_TOKEN_VOLUME, mounts["autoscaler"]
    assert token_dir not in mounts["ray-head"] and AUTOSCALER_TOKEN_VOLUME not in mounts["ray-head"].values()
    (volume,) = [v for v in pod.spec.volumes if v.name == AUTOSCALER_TOKEN_VOLUME]
    assert volume.projected.sources[0].service_account_token.path == "token"
    assert not [v for v in pod.spec.volumes if v.name.startswith("kube-api-access")]  # no injected token volume
