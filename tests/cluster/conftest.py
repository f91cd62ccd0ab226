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
  dashboard  function DashboardClient for the fake Ray dashboard (skips if the cluster has none)
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


@pytest.fixture
def namespace(kube, request):
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:40].strip("-")
    name = make_namespace(kube, f"{base}-{uuid.uuid4().hex[:5]}")
    yield name
    delete_namespace(kube, name)


@pytest.fixture
def dashboard(kube_env) -> DashboardClient:
    if not kube_env["dashboard_url"]:
        pytest.skip("this cluster has no fake Ray dashboard (TPUTORCH_DASHBOARD_URL unset)")
    return DashboardClient(kube_env["dashboard_url"])
