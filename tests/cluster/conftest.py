"""Shared fixtures for tests that need a real API server (+ KubeRay + fake TPU nodes).

Cluster choice (session-wide):
  * TPUTORCH_USE_EXISTING_CLUSTER=1 and KUBECONFIG set: use that cluster as it is
    (TPUTORCH_DASHBOARD_URL, if set, points at its fake Ray dashboard).
  * otherwise: `hack/cluster.sh up` (reuses a running local cluster, else starts one). A cluster
    this session started is stopped with `hack/cluster.sh down` at session end, unless
    TPUTORCH_KEEP_CLUSTER=1; a cluster that was already running is left running.

Fixtures:
  kube_env   session  dict(kubeconfig=..., dashboard_url=... or None, started=bool)
  kube       session  Kube: .api_client, .core (CoreV1Api), .batch (BatchV1Api), .apps (AppsV1Api),
                      .custom (CustomObjectsApi), .kubeconfig; plus kube.wait(fn, timeout, what)
  namespace  function a fresh namespace name; deleted after the test
  health_watch session  node/pod readiness watcher, running from the first test that uses `kube`
  dashboard  function DashboardClient for the fake Ray dashboard (skips if the cluster has none)
  real_ray   module   a real Ray 2.60 head on 127.0.0.1 (ray_backend.RealRay), started on first use,
                      warmed with a no-op job; `real_ray.attach(rayjob)` attaches a slice's hosts
  real_ray_namespace  function  `namespace`, with its dashboard calls forwarded to `real_ray`
                      (so its submitter pods really run `ray job submit` against it)
Every test under tests/cluster/ gets the `cluster` marker.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from dashboard import DashboardClient
from namespaces import delete_namespace, make_namespace

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "hack" / "cluster.sh"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


def _cluster_env() -> dict:
    out = subprocess.run([str(CLUSTER_SH), "env"], check=True, capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            env[k] = shlex.split(v)[0] if v else ""
    return env


@pytest.fixture(scope="session")
def kube_env():
    if os.environ.get("TPUTORCH_USE_EXISTING_CLUSTER") == "1" and os.environ.get("KUBECONFIG"):
        yield {"kubeconfig": os.environ["KUBECONFIG"],
               "dashboard_url": os.environ.get("TPUTORCH_DASHBOARD_URL"), "started": False}
        return
    was_running = subprocess.run([str(CLUSTER_SH), "status"], capture_output=True).returncode == 0
    subprocess.run([str(CLUSTER_SH), "up"], check=True)
    env = _cluster_env()
    yield {"kubeconfig": env["KUBECONFIG"], "dashboard_url": env["TPUTORCH_DASHBOARD_URL"],
           "started": not was_running}
    if not was_running and os.environ.get("TPUTORCH_KEEP_CLUSTER") != "1":
        subprocess.run([str(CLUSTER_SH), "down"], check=False)


@dataclass
class Kube:
    kubeconfig: str
    api_client: object
    core: object
    batch: object
    apps: object
    custom: object

    @staticmethod
    def wait(fn, timeout: float = 60.0, what: str = "condition", interval: float = 0.5):
        """Call fn until it returns something truthy; return that, or fail after timeout."""
        end = time.monotonic() + timeout
        last = None
        while True:
            try:
                last = fn()
                if last:
                    return last
            except Exception as exc:  # an API object may not exist yet
                last = exc
            if time.monotonic() > end:
                pytest.fail(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
            time.sleep(interval)


@pytest.fixture(scope="session")
def kube(kube_env) -> Kube:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kube_env["kubeconfig"])
    return Kube(kubeconfig=kube_env["kubeconfig"], api_client=api_client,
                core=client.CoreV1Api(api_client), batch=client.BatchV1Api(api_client),
                apps=client.AppsV1Api(api_client), custom=client.CustomObjectsApi(api_client))


@pytest.fixture(scope="session", autouse=True)
def health_watch(request):
    """Watches node and pod readiness for as long as the session uses the cluster (from the first
    test that needs `kube`); test_zz_node_health.py checks what it saw."""
    from node_health import HealthWatch

    watch = {}

    def begin(kube):
        if "w" not in watch:
            watch["w"] = HealthWatch(kube.core)
            watch["w"].start()
        return watch["w"]

    yield begin
    if "w" in watch:
        watch["w"].stop()


@pytest.fixture(autouse=True)
def _watch_when_the_cluster_is_used(request, health_watch):
    if "kube" in request.fixturenames:
        health_watch(request.getfixturevalue("kube"))


@pytest.fixture
def namespace(kube, request):
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:40].strip("-")
    name = make_namespace(kube, f"{base}-{uuid.uuid4().hex[:5]}")
    yield name
    delete_namespace(kube, name)


@pytest.fixture(scope="session")  # a stateless client: module fixtures take it too
def dashboard(kube_env) -> DashboardClient:
    if not kube_env["dashboard_url"]:
        pytest.skip("this cluster has no fake Ray dashboard (TPUTORCH_DASHBOARD_URL unset)")
    return DashboardClient(kube_env["dashboard_url"])


_REAL_RAY_TIMINGS: dict = {}


@pytest.fixture(scope="module")
def real_ray(tmp_path_factory):
    """Module-scoped: it is stopped before tests/raysim starts a Ray head of its own in the same session."""
    from ray_backend import RealRay

    ray = RealRay(tmp_path_factory.mktemp("real-ray")).start()
    try:
        yield ray
    finally:
        _REAL_RAY_TIMINGS.update(ray.timings, memory_mb=round(ray.memory_bytes() / 2**20))
        ray.stop()


@pytest.fixture
def real_ray_namespace(namespace, dashboard, real_ray):
    dashboard.set_backend(namespace, real_ray.url, token=real_ray.token)
    yield namespace
    dashboard.delete_backend(namespace)


def pytest_terminal_summary(terminalreporter):
    import sys

    for what, figures in getattr(sys.modules.get("ray_backend"), "REPORTED", {}).items():
        terminalreporter.write_line(f"{what}: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    if _REAL_RAY_TIMINGS:
        terminalreporter.write_line("real Ray backend: " + ", ".join(
            f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in _REAL_RAY_TIMINGS.items()))
