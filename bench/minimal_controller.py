#!/usr/bin/env python3
"""The least a TPUTorchJob controller must do: the yardstick for the operator in bench/burst.py.

`python bench/minimal_controller.py NAMESPACE` (KUBECONFIG from the environment) watches the
TPUTorchJobs of one namespace and creates each one's RayJob (tputorch's own parse + render, an
ownerReference) from a pool of threads, as the operator does. Nothing else: no status, no events,
no validation report, no retries, no resume after a restart. Any TPUTorchJob -> RayJob controller
pays at least for this (the TPUTorchJob's create and watch event, then the RayJob create), so its
figures bound what the operator can reach on the same machine; bench/RESULTS.md compares both.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from tputorch.api import crd, spec  # noqa: E402
from tputorch import render  # noqa: E402

WORKERS = 8  # as many threads as the operator has for RayJob calls (handlers.Config.api_workers)


def main() -> int:
    namespace = sys.argv[1]
    cfg = client.Configuration()
    config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = WORKERS
    api = client.CustomObjectsApi(client.ApiClient(cfg))

    def create(job: dict) -> None:
        meta = job["metadata"]
        body = render.rayjob(spec.parse(job))
        body["metadata"]["ownerReferences"] = [{"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": meta["name"],
                                                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]
        try:
            api.create_namespaced_custom_object("ray.io", "v1", namespace, "rayjobs", body)
        except ApiException as err:
            print(f"{meta['name']}: HTTP {err.status} {err.reason}", flush=True)

    with ThreadPoolExecutor(WORKERS) as pool:
        for event in watch.Watch().stream(api.list_namespaced_custom_object, crd.GROUP, crd.VERSION, namespace,
                                          crd.PLURAL, timeout_seconds=3600):
            if event["type"] == "ADDED":
                pool.submit(create, event["object"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
