"""One local Ray head for all tests in tests/raysim; TPU hosts are attached per slice shape."""

from __future__ import annotations

import os

# Before Ray is imported anywhere in this process: Ray computes ENABLE_RAY_CLUSTER at import time
# and with it set resolves "127.0.0.1" to the host's routable address. Keep everything on loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest

ray = pytest.importorskip("ray", reason="tests/raysim need ray[train] (pip install -e '.[train,test]')")

import slicesim  # noqa: E402  (tests/raysim is on sys.path: pytest's rootdir-relative import)


def pytest_collection_modifyitems(items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.ray)


class SliceHosts:
    """Keeps one simulated slice attached at a time; a test asking for another swaps it."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._key = None
        self._ctx = None
        self.current: slicesim.SimSlice | None = None

    def attach(self, sim: slicesim.SimSlice, extra: tuple[slicesim.SimSlice, ...] = ()) -> slicesim.SimSlice:
        key = tuple((s.name, s.pod_type, s.chips_per_host, len(s.hosts)) for s in (sim, *extra))
        if key != self._key:
            self.detach()
            import contextlib

            stack = contextlib.ExitStack()
            for s in (sim, *extra):
                stack.enter_context(slicesim.attached(self.cluster, s))
            self._ctx, self._key, self.current = stack, key, sim
        # Same hardware as attached: keep the nodes, take this job's head environment.
        self.current.head_env = sim.head_env
        return self.current

    def detach(self):
        if self._ctx is not None:
            self._ctx.close()
        self._ctx = self._key = self.current = None


@pytest.fixture(scope="session")
def ray_cluster():
    cluster = slicesim.start_head()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        # Every Ray process these tests started is gone (raylets, GCS, agents, workers).
        left = slicesim.wait_until(lambda: not slicesim.descendants(), timeout=30) or slicesim.descendants()
        assert left is True, f"Ray processes still running after shutdown: {left}"


@pytest.fixture(scope="session")
def slice_hosts(ray_cluster):
    hosts = SliceHosts(ray_cluster)
    try:
        yield hosts
    finally:
        hosts.detach()
