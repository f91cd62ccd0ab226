"""What the local cluster's stand-in TPU webhook (hack/tpu_webhook.py) costs per pod create: N TPU
pods of KubeRay's shape created one by one in a namespace the webhook sees and in one it leaves out
(tputorch.io/tpu-webhook=off), side by side, rounds alternated. The pods select no node (they stay
Pending: no KWOK work). Prints per-create medians and their ratio.

Usage: eval "$(hack/cluster.sh env)"; .venv/bin/python bench/webhook_admission.py [N] [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

from kubernetes import client, config


def pod(i: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"bench-{i}", "labels": {"app.kubernetes.io/name": "kuberay", "ray.io/cluster": "bench",
                                                          "ray.io/replica-host-index": str(i % 4)}},
            "spec": {"nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                      "cloud.google.com/gke-tpu-topology": "4x4", "bench": "nowhere"},
                     "containers": [{"name": "ray-worker", "image": "example.com/x",
                                     "resources": {"limits": {"google.com/tpu": "4"}}}]}}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    config.load_kube_config()
    core = client.CoreV1Api()
    times = {"webhook": [], "off": []}
    names = {}
    for which in times:
        ns = f"whbench-{which}-{uuid.uuid4().hex[:5]}"
        labels = {"tputorch.io/tpu-webhook": "off"} if which == "off" else {}
        core.create_namespace({"metadata": {"name": ns, "labels": labels}})
        names[which] = ns
    try:
        for r in range(rounds):
            for which in (("webhook", "off") if r % 2 == 0 else ("off", "webhook")):
                ns = names[which]
                for i in range(n):
                    t = time.perf_counter()
                    made = core.create_namespaced_pod(ns, pod(r * n + i))
                    times[which].append(time.perf_counter() - t)
                    has_env = bool(made.spec.containers[0].env)
                    assert has_env == (which == "webhook"), (which, made.spec.containers[0].env)
    finally:
        for ns in names.values():
            core.delete_namespace(ns)
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:8s} creates {len(v):4d}  median {med[k]:6.1f} ms  p90 {sorted(v)[int(len(v) * 0.9)] * 1000:6.1f} ms")
    print(f"ratio webhook/off (medians) {med['webhook'] / med['off']:.2f}; added per create {med['webhook'] - med['off']:.1f} ms")


if __name__ == "__main__":
    main()
