"""The local cluster keeps its fake nodes and their pods Ready on a busy machine.

Named to run last among the cluster tests: the session's readiness watcher (conftest
`health_watch`) has then watched every test before it, real Ray jobs included. Alone, or after a
short session, this test keeps the machine busy (both cores) and pods running until the watch has
lasted HEALTH_WATCH_S.
"""

from __future__ import annotations

import multiprocessing
import os
import time

HEALTH_WATCH_S = float(os.environ.get("TPUTORCH_HEALTH_WATCH_S", "180"))


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_nodes_and_pods_stay_ready_on_a_busy_machine(kube, namespace, health_watch):
    from kubernetes import client

    watch = health_watch(kube)
    # Pods on every kind of node pool, held Running while the watch goes on.
    for i, pool in enumerate(("cpu-pool", "tpu-v6e-2x2", "tpu-v5p-2x2x2")):
        kube.core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"hold-{i}"),
            spec=client.V1PodSpec(node_selector={"cloud.google.com/gke-nodepool": pool},
                                  tolerations=[client.V1Toleration(key="google.com/tpu", operator="Exists")],
                                  containers=[client.V1Container(name="c", image="example.com/hold")])))
    kube.wait(lambda: all(p.status.phase == "Running" for p in kube.core.list_namespaced_pod(namespace).items)
              and len(kube.core.list_namespaced_pod(namespace).items) == 3, 60, "3 pods Running")

    remaining = HEALTH_WATCH_S - watch.watched_s
    if remaining > 0:
        burners = [multiprocessing.Process(target=_burn, args=(remaining,)) for _ in range(os.cpu_count() or 2)]
        for b in burners:
            b.start()
        for b in burners:
            b.join()
        time.sleep(2 * watch.interval)
    assert watch.watched_s >= HEALTH_WATCH_S
    assert watch.polls > 0.5 * watch.watched_s / watch.interval, (watch.polls, watch.errors)
    assert not watch.lapses, f"readiness lost during {watch.watched_s:.0f}s: {watch.lapses[:20]}"


def test_what_counts_as_a_lapse():
    """The watch's rules on objects as the API returns them: a node the lifecycle controller
    marked Unknown or False is a lapse; a node that has just registered (no Ready yet) is not."""
    from types import SimpleNamespace as O

    from node_health import node_lapse, pod_lapse

    def node(*conditions):
        return O(metadata=O(name="n"), status=O(conditions=[O(type="Ready", status=s, reason=r) for s, r in conditions]))

    assert node_lapse(node(("True", "KubeletReady"))) is None
    assert node_lapse(node()) is None
    assert node_lapse(node(("Unknown", "NodeStatusUnknown"))) == "node n Ready=Unknown (NodeStatusUnknown)"
    assert node_lapse(node(("False", "KubeletNotReady"))) == "node n Ready=False (KubeletNotReady)"

    def pod(status, reason, phase="Running"):
        return O(metadata=O(namespace="ns", name="p", deletion_timestamp=None),
                 status=O(phase=phase, conditions=[O(type="Ready", status=status, reason=reason, message="m")]))

    assert pod_lapse(pod("False", "ContainersNotReady")) is None
    assert pod_lapse(pod("False", "PodCompleted", phase="Succeeded")) is None
    assert pod_lapse(pod("False", None)) == "pod ns/p Ready=False (None: m)"
