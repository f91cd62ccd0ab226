#!/usr/bin/env python3
"""A stand-in for the GKE Ray TPU webhook's pod mutation, for the local cluster (loopback HTTPS).

On GKE the Ray Operator add-on's webhook gives each TPU pod of a RayCluster (label
app.kubernetes.io/name=kuberay, a container with a google.com/tpu limit) TPU_WORKER_ID and TPU_NAME,
and on a multi-host slice TPU_WORKER_HOSTNAMES, at admission (docs/compatibility.md). This one sets
the same three variables so that the local cluster's pods look like GKE's, and, as it does, keeps
the hosts of one multi-host slice in one node pool (a required pod affinity on the slice's pods,
topology key cloud.google.com/gke-nodepool): a second node pool of the same shape never gets half
a slice. What it does not do: the pods' hostname/subdomain, the RayCluster validation. Its
selector is KubeRay's label of the pod replica (ray.io/worker-group-replica-name, which
RayMultiHostIndexing sets); the real webhook labels the pods with an index of its own.

Which host of which slice a pod is comes from KubeRay's multi-host labels (RayMultiHostIndexing,
on in hack/cluster.sh); the slice's host count from its topology node selector and the pod's
chips, as the real webhook's own check computes it. The hostnames are nominal (no hostname is set).

hack/cluster.sh registers it with namespaceSelector `tputorch.io/tpu-webhook NotIn (off)`: a test
labels its namespace `tputorch.io/tpu-webhook=off` to get GKE without the webhook there.

Usage: tpu_webhook.py --port N --cert FILE --key FILE
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TPU = "google.com/tpu"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
REPLICA_LABEL = "ray.io/worker-group-replica-name"


def slice_hosts(pod: dict, chips: int) -> int:
    """The hosts of ``pod``'s slice: its topology's chips over ``chips`` per host (at least 1)."""
    topology = ((pod.get("spec") or {}).get("nodeSelector") or {}).get(TOPOLOGY_LABEL, "")
    dims = [int(d) for d in topology.split("x") if d.isdigit()]
    return max(math.prod(dims) // chips, 1) if dims and chips else 1


def slice_env(pod: dict, chips: int) -> dict[str, str]:
    """The variables the webhook sets on a TPU container of ``pod`` (``chips`` per host)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    hosts = slice_hosts(pod, chips)
    group = labels.get("ray.io/group", "workers")
    name = labels.get("ray.io/worker-group-replica-name") or f"{labels.get('ray.io/cluster', 'ray')}-{group}-0"
    env = {"TPU_WORKER_ID": labels.get("ray.io/replica-host-index", "0"), "TPU_NAME": name}
    if hosts > 1:
        env["TPU_WORKER_HOSTNAMES"] = ",".join(f"{name}-{i}.{labels.get('ray.io/cluster', 'ray')}-headless"
                                               for i in range(hosts))
    return env


def one_node_pool(pod: dict) -> list[dict]:
    """JSON patch ops adding a required pod affinity that keeps ``pod`` in the node pool of the other
    pods of its pod replica (the hosts of one slice); the first of them may land in any pool."""
    replica = ((pod.get("metadata") or {}).get("labels") or {}).get(REPLICA_LABEL)
    if not replica:
        return []
    term = {"labelSelector": {"matchLabels": {REPLICA_LABEL: replica}}, "topologyKey": NODE_POOL_LABEL}
    affinity = (pod.get("spec") or {}).get("affinity")
    if affinity is None:
        return [{"op": "add", "path": "/spec/affinity", "value": {"podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [term]}}}]
    if affinity.get("podAffinity") is None:
        return [{"op": "add", "path": "/spec/affinity/podAffinity",
                 "value": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}]
    if affinity["podAffinity"].get("requiredDuringSchedulingIgnoredDuringExecution") is None:
        return [{"op": "add", "path": "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution",
                 "value": [term]}]
    return [{"op": "add", "path": "/spec/affinity/podAffinity/requiredDuringSchedulingIgnoredDuringExecution/-",
             "value": term}]


def patch_for(pod: dict) -> list[dict]:
    """JSON patch adding the variables to every container that asks for TPU chips, and on a
    multi-host slice the pod affinity that keeps its hosts in one node pool."""
    ops, multi_host = [], False
    for i, container in enumerate((pod.get("spec") or {}).get("containers") or []):
        limits = (container.get("resources") or {}).get("limits") or {}
        if TPU not in limits:
            continue
        chips = int(str(limits[TPU]))
        multi_host = multi_host or slice_hosts(pod, chips) > 1
        env = slice_env(pod, chips)
        have = {e.get("name") for e in container.get("env") or []}
        add = [{"name": k, "value": v} for k, v in env.items() if k not in have]
        if not add:
            continue
        if container.get("env") is None:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": add})
        else:
            ops += [{"op": "add", "path": f"/spec/containers/{i}/env/-", "value": e} for e in add]
    return ops + (one_node_pool(pod) if multi_host else [])


def review(request: dict) -> dict:
    response = {"uid": request.get("uid", ""), "allowed": True}
    pod = request.get("object") or {}
    ops = patch_for(pod) if request.get("operation") == "CREATE" else []
    if ops:
        response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(ops).encode()).decode())
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        out = json.dumps(review(body.get("request") or {})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:  # noqa: N802 (health, for hack/cluster.sh)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, fmt, *args) -> None:  # one line per pod would flood the log
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(f"TPU webhook stand-in on https://127.0.0.1:{a.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
