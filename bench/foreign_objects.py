"""Memory of the operator's stores against objects that are not its own (issue 34).

One process per case: the informers wired as the operator wires them (handlers.build), over the real
RestSource reading list pages (JSON bytes, as the API server sends them) from a stand-in API client,
for N objects of one kind that any tenant can make:
- pods: with our managed-by label, no RayCluster as their controller;
- networkpolicies: with our managed-by label, no object of ours as their controller;
- tputorchjobs: CRD-valid, refused by the parser (an entrypoint over its limit).
Each object carries ``--size`` bytes of payload. Prints the peak RSS (ru_maxrss) and the RSS kept
after the list (both above the process's RSS before it) as JSON.

    PYTHONPATH=operator python bench/foreign_objects.py            # every case, 1,000 objects of 100 KB
    PYTHONPATH=/tmp/before/operator python bench/foreign_objects.py  # the same against older code
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import subprocess
import sys

CASES = ("pods", "networkpolicies", "tputorchjobs")
LABELS = {"app.kubernetes.io/managed-by": "tputorch-operator", "tputorch.io/job": "x"}


def make(case: str, i: int, size: int) -> dict:
    meta = {"namespace": "tenant", "name": f"{case}-{i}", "uid": f"u-{i}", "resourceVersion": str(i + 10),
            "generation": 1, "labels": dict(LABELS)}
    blob = "x" * size
    if case == "pods":
        meta["annotations"] = {"blob": blob}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "B", "value": blob}]}]},
                "status": {"phase": "Running"}}
    if case == "networkpolicies":
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
                "spec": {"podSelector": {"matchLabels": {"blob": blob}}}}
    return {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob", "metadata": meta,
            "spec": {"tpu": {"generation": "v6e", "topology": "2x2"}, "image": "img",
                     "entrypoint": "python " + blob}}


class Response:
    def __init__(self, data: bytes) -> None:
        self.status, self.reason, self.data = 200, "OK", data

    def read(self) -> bytes:
        return self.data


class PagingApi:
    """The two ApiClient calls RestSource makes, answering lists page by page as the API server."""

    def __init__(self, case: str, count: int, size: int) -> None:
        self.case, self.count, self.size = case, count, size

    def param_serialize(self, method, path, query_params, header_params, body, auth_settings):
        return method, dict(query_params or []), header_params, None, None

    def call_api(self, method, url, header_params, body, _request_timeout):
        start, limit = int(url.get("continue", 0)), int(url["limit"])
        end = min(self.count, start + limit)
        meta = {"resourceVersion": "99", **({"continue": str(end)} if end < self.count else {})}
        items = [make(self.case, i, self.size) for i in range(start, end)]
        return Response(json.dumps({"items": items, "metadata": meta}).encode())


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def one(case: str, count: int, size: int) -> dict:
    from tputorch.render.network import NetworkPolicyConfig
    from tputorch.controller import handlers, kinds
    from tputorch.controller.rest import RestSource

    sys.setrecursionlimit(10_000)
    loop = asyncio.new_event_loop()
    api = PagingApi(case, count, size)
    class NoKube:  # the bench makes no call of the reconcile's
        async def post_event(self, regarding, event):
            pass
    ctl = handlers.build(NoKube(), lambda path, *selectors: RestSource(api, path, *selectors), loop, None,
                         extras=kinds.extras(NetworkPolicyConfig()))
    informer = {"pods": ctl.pods, "networkpolicies": ctl.extra_stores.get("networkpolicies"),
                "tputorchjobs": ctl.parents["TPUTorchJob"]}[case]
    informer.on_change = lambda event, obj: None  # the loop is not run: nothing reaches the controller
    gc.collect()
    base, peak_before = rss_kb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    informer.relist(None)
    gc.collect()
    kept = rss_kb() - base
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - max(base, peak_before)
    return {"case": case, "objects": count, "payload_bytes": size, "stored": len(informer.keys()),
            "peak_rss_mb": round(max(peak, 0) / 1024, 1), "kept_rss_mb": round(max(kept, 0) / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=CASES)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100_000)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one(args.case, args.count, args.size)))
        return
    for case in CASES:  # a fresh process each: the peak of one is no floor for the next
        out = subprocess.run([sys.executable, __file__, "--case", case, "--count", str(args.count),
                              "--size", str(args.size)], capture_output=True, text=True, check=True)
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
