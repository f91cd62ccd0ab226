"""Watches the local cluster's nodes and pods for lost readiness (see test_zz_node_health.py).

A node whose Ready condition is not True, or a Running pod (not being deleted) whose Ready
condition turns False other than by a kubelet-style ContainersNotReady report, is a lapse: KWOK's
fake kubelets never make a pod unready by themselves, only the node lifecycle controller does, when
it believes a node is gone.
"""

from __future__ import annotations

import threading
import time


def node_lapse(node) -> str | None:
    ready = next((c for c in (node.status.conditions if node.status else None) or [] if c.type == "Ready"), None)
    # No Ready condition at all is a node that has just registered (a test re-creating a node it
    # deleted, before KWOK's first status patch): the node lifecycle controller never removes the
    # condition, it sets it to Unknown, and that is the lapse this watch is for.
    if ready is not None and ready.status != "True":
        return f"node {node.metadata.name} Ready={ready.status} ({ready.reason})"
    return None


def pod_lapse(pod) -> str | None:
    if pod.metadata.deletion_timestamp or (pod.status.phase or "") != "Running":
        return None
    ready = next((c for c in pod.status.conditions or [] if c.type == "Ready"), None)
    # ContainersNotReady is a kubelet's report about the containers, written here on purpose: by the
    # stand-in dashboard's prober (a RayService worker without a Serve replica is NotReady, as on
    # GKE) or by a test writing a kubelet's status (an image that cannot be pulled). The node
    # lifecycle controller flips Ready to False without that reason.
    if ready is not None and ready.status == "False" and ready.reason != "ContainersNotReady":
        return f"pod {pod.metadata.namespace}/{pod.metadata.name} Ready=False ({ready.reason}: {ready.message})"
    return None


class HealthWatch(threading.Thread):
    """Polls nodes and pods every `interval` seconds from start until stop()."""

    def __init__(self, core, interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.core, self.interval = core, interval
        self.started_at = time.monotonic()
        self.lapses: list[tuple[float, str]] = []
        self.polls = 0
        self.errors = 0
        self._halt = threading.Event()

    @property
    def watched_s(self) -> float:
        return time.monotonic() - self.started_at

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            try:
                found = [node_lapse(n) for n in self.core.list_node(label_selector="type=kwok").items]
                found += [pod_lapse(p) for p in self.core.list_pod_for_all_namespaces().items]
            except Exception:  # the API server may be busy; a missed poll is not a lapse
                self.errors += 1
                continue
            self.polls += 1
            t = round(self.watched_s, 1)
            self.lapses += [(t, f) for f in found if f]

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
