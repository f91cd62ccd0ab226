#!/usr/bin/env python3
"""The least a TPUTorchJob controller must do: the yardsticks for the operator in bench/burst.py.

`python bench/minimal_controller.py [--same-work] NAMESPACE` (KUBECONFIG from the environment)
watches the TPUTorchJobs of one namespace and, from a pool of threads as the operator does, makes
each one's RayJob (tputorch's own parse + render, an ownerReference). Nothing else: no status, no
events, no validation report, no retries, no resume after a restart.

- Without ``--same-work`` (the "minimal" baseline, runs 1-7): the RayJob only.
- With ``--same-work`` (the "same-work floor", issue 40): the API work of the operator's critical
  path as well: the RayJob names a token Secret of its own, the Secret (its token derived by the
  operator's own HMAC, owned by the RayJob, so made after it) and the job's NetworkPolicy (the
  operator's default render, owned by the TPUTorchJob) are created once the RayJob is.

Any TPUTorchJob -> RayJob controller that gives each job these objects pays at least for this, so
its figures bound what the operator can reach on the same machine; bench/RESULTS.md compares them.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
from tputorch import render  # noqa: E402
from tputorch.render.network import NetworkPolicyConfig, network_policy
from tputorch.render.raytoken import (
    new_ray_token_secret_name, ray_token_secret, ray_token_secret_name, with_ray_token_secret,
)
from tputorch.api import crd, spec  # noqa: E402
from tputorch.controller.rest import raw_call  # noqa: E402
from tputorch.controller.raytoken import RayTokens  # noqa: E402

WORKERS = 8  # as many threads as the operator has for RayJob calls (handlers.Config.api_workers)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("namespace")
    p.add_argument("--same-work", action="store_true",
                   help="also each RayJob's token Secret and each job's NetworkPolicy (the operator's critical path)")
    args = p.parse_args()
    namespace = args.namespace
    cfg = client.Configuration()
    config.load_kube_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = WORKERS
    api_client = client.ApiClient(cfg)
    api = client.CustomObjectsApi(api_client)
    tokens = RayTokens(secrets.token_bytes(32))
    policy = NetworkPolicyConfig()  # the operator's default (handlers.Config.network_policy)

    def post(what: str, call, *call_args) -> dict | None:
        try:
            return call(*call_args)
        except ApiException as err:
            print(f"{what}: HTTP {err.status} {err.reason}", flush=True)
            return None

    def create(job: dict) -> None:
        meta = job["metadata"]
        parsed = spec.parse(job)
        body = render.rayjob(parsed)
        owner = {"apiVersion": crd.API_VERSION, "kind": crd.KIND, "name": meta["name"], "uid": meta["uid"],
                 "controller": True, "blockOwnerDeletion": True}
        body["metadata"]["ownerReferences"] = [owner]
        if args.same_work:
            with_ray_token_secret(body, new_ray_token_secret_name(meta["name"], secrets.token_hex(3)))
        created = post(f"RayJob {meta['name']}", api.create_namespaced_custom_object, "ray.io", "v1", namespace,
                       "rayjobs", body)
        if not args.same_work or created is None:
            return
        name = ray_token_secret_name(created)
        secret = ray_token_secret(created, tokens.token(namespace, name))
        post(f"Secret {name}", lambda: raw_call(api_client, "POST", f"/api/v1/namespaces/{namespace}/secrets",
                                                None, body=secret).read())
        netpol = network_policy(parsed, policy)
        netpol["metadata"].update(namespace=namespace, ownerReferences=[owner])
        post(f"NetworkPolicy {netpol['metadata']['name']}", api.create_namespaced_custom_object,
             "networking.k8s.io", "v1", namespace, "networkpolicies", netpol)

    with ThreadPoolExecutor(WORKERS) as pool:
        for event in watch.Watch().stream(api.list_namespaced_custom_object, crd.GROUP, crd.VERSION, namespace,
                                          crd.PLURAL, timeout_seconds=3600):
            if event["type"] == "ADDED":
                pool.submit(create, event["object"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
