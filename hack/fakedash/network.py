"""The pod network as GKE Dataplane V2 enforces it, for the connections the stand-in dashboard
carries to a Ray cluster's pods: whether the NetworkPolicies in force admit a connection is asked
of a real NetworkPolicy engine, cyclonus (`cyclonus analyze --mode query-traffic`, built by
`hack/build.sh cyclonus`), never decided here. A denied connection is dropped: the caller gets no
answer until its own timeout, as Dataplane V2 drops it (no refusal).

Each caller has a declared network identity: "hosted" (outside the pod network, from an address)
or "in-cluster" (a namespace and pod labels). Callers are told apart by what their HTTP client
sends: KubeRay is a Go client (`Go-http-client`), the operator's progress reads aiohttp; anything
else (a test's request to a Serve endpoint) is the "client" identity. Defaults: KubeRay hosted (as
GKE's Ray Operator add-on "installs and hosts" it, from an address that is not documented), the
operator in-cluster in tputorch-system, clients hosted. `PUT /_control/network` changes them.

Verdicts are cached per (policies in force, source, destination, port): one cyclonus run per new
combination (~0.1 s), none for a repeated one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.parse

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
POD_NETWORK_PLACEHOLDER_IP = "10.8.0.10"  # the destination pod's IP when the API has none (KWOK)
DEFAULT_IDENTITIES = {
    "kuberay": {"hosted": "203.0.113.10"},
    "operator": {"namespace": "tputorch-system",
                 "labels": {"app.kubernetes.io/name": "tputorch-operator", "app.kubernetes.io/instance": "tputorch"}},
    "client": {"hosted": "198.51.100.20"},
}
TTL = 2.0  # seconds the policies and pod labels read from the API server are reused


def caller_of(headers) -> str:
    agent = headers.get("User-Agent") or ""
    if agent.startswith("Go-http-client"):
        return "kuberay"
    if "aiohttp" in agent:
        return "operator"
    return "client"


def cyclonus_binary() -> str | None:
    path = os.environ.get("CYCLONUS")
    if path:
        return path
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run([os.path.join(here, "build.sh"), "cyclonus-dir"], capture_output=True, text=True,
                             check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    binary = os.path.join(out, "cyclonus")
    return binary if os.access(binary, os.X_OK) else None


def query(binary: str, policies: list[dict], flows: list[dict]) -> list[bool]:
    """cyclonus's verdict per flow. It reads only a file's first YAML document: one policy per file
    (JSON is YAML)."""
    with tempfile.TemporaryDirectory(prefix="fakedash-netpol-") as d:
        os.mkdir(os.path.join(d, "policies"))
        for i, policy in enumerate(policies):
            with open(os.path.join(d, "policies", f"{i}.yaml"), "w") as f:
                json.dump(policy, f)
        traffic = os.path.join(d, "traffic.json")
        with open(traffic, "w") as f:
            json.dump(flows, f)
        out = subprocess.run([binary, "analyze", "--mode", "query-traffic", "--policy-path", os.path.join(d, "policies"),
                              "--traffic-path", traffic], capture_output=True, text=True, timeout=60, check=True).stdout
    verdicts = [line.split("|")[2].strip() == "TRUE" for line in out.splitlines() if line.startswith("| IS ALLOWED?")]
    if len(verdicts) != len(flows):
        raise RuntimeError(f"cyclonus gave {len(verdicts)} verdicts for {len(flows)} flows: {out[-2000:]}")
    return verdicts


def _endpoint(identity: dict, namespace_labels: dict, ip: str | None = None) -> dict:
    if "hosted" in identity:
        return {"IP": identity["hosted"]}
    return {"Internal": {"PodLabels": dict(identity.get("labels") or {}), "NamespaceLabels": namespace_labels,
                         "Namespace": identity["namespace"]}, "IP": ip or "10.8.1.10"}


class Network:
    def __init__(self, kube, log, binary: str | None = None) -> None:
        self.kube, self.log = kube, log
        self.binary = binary if binary is not None else cyclonus_binary()
        self.enforce = kube is not None and self.binary is not None
        self.identities = json.loads(json.dumps(DEFAULT_IDENTITIES))
        self.lock = threading.Lock()
        self._read: dict[str, tuple[float, object]] = {}  # API path -> (when, answer)
        self.verdicts: dict[str, bool] = {}
        self.asked = 0  # cyclonus runs (the rest came from the cache)
        if kube is not None and self.binary is None:
            log("network: no cyclonus binary (hack/build.sh cyclonus): NetworkPolicies are NOT enforced")

    def control(self, method: str, body: dict) -> tuple[int, dict]:
        if method in ("PUT", "POST"):
            for name, identity in (body.get("identities") or {}).items():
                if not isinstance(identity, dict) or not ("hosted" in identity or "namespace" in identity):
                    return 400, {"error": f"identity {name}: give {{'hosted': IP}} or {{'namespace': NS, 'labels': {{...}}}}"}
                with self.lock:
                    self.identities[name] = identity
            if "enforce" in body:
                if body["enforce"] and self.binary is None:
                    return 409, {"error": "no cyclonus binary (hack/build.sh cyclonus)"}
                self.enforce = bool(body["enforce"]) and self.kube is not None
            if body.get("reset"):
                with self.lock:
                    self.identities = json.loads(json.dumps(DEFAULT_IDENTITIES))
        with self.lock:
            return 200, {"enforce": self.enforce, "identities": self.identities, "cyclonus": self.binary,
                         "verdicts_cached": len(self.verdicts), "cyclonus_runs": self.asked}

    # -- the API server's view, briefly cached --------------------------------------------------
    def _get(self, path: str):
        now = time.monotonic()
        with self.lock:
            hit = self._read.get(path)
        if hit is not None and now - hit[0] < TTL:
            return hit[1]
        try:
            answer = self.kube.get(path)
        except Exception as exc:  # noqa: BLE001  (the namespace or pod may be gone)
            answer = None
            self.log(f"network: GET {path}: {exc!r}")
        with self.lock:
            self._read[path] = (now, answer)
            if len(self._read) > 4096:
                self._read.clear()
        return answer

    def _namespace_labels(self, ns: str) -> dict:
        obj = self._get(f"/api/v1/namespaces/{ns}") or {}
        return {**((obj.get("metadata") or {}).get("labels") or {}), NAMESPACE_NAME_LABEL: ns}

    def head_pod(self, ns: str, cluster: str) -> dict | None:
        sel = urllib.parse.quote(f"ray.io/cluster={cluster},ray.io/node-type=head")
        items = (self._get(f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}") or {}).get("items") or []
        return items[0] if items else None

    # -- the verdict -------------------------------------------------------------------------------
    def admits(self, caller: str, pod, port: int) -> bool:
        """Whether the NetworkPolicies of ``pod``'s namespace let ``caller`` connect to its ``port``
        (``pod``: the pod, or a function that reads it, called only when policies are enforced)."""
        if not self.enforce:
            return True
        pod = pod() if callable(pod) else pod
        if pod is None:
            return True  # nothing to enforce, or no pod behind the address (nothing answers either way)
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace") or ""
        policies = [{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                     "metadata": {"name": p["metadata"]["name"], "namespace": ns}, "spec": p.get("spec") or {}}
                    for p in (self._get(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies") or {}).get("items") or []]
        if not policies:
            return True  # no policy selects any pod of the namespace: everything is admitted
        # Only the policies that may select the pod decide its ingress; one whose matchLabels the pod
        # lacks cannot (anything else is left to cyclonus). Without this, every new job's policy in
        # a namespace would make every verdict there new.
        labels = meta.get("labels") or {}
        policies = [p for p in policies if all(labels.get(k) == v for k, v in
                                               ((p["spec"].get("podSelector") or {}).get("matchLabels") or {}).items())]
        if not policies:
            return True  # none selects this pod: it is not isolated
        with self.lock:
            identity = dict(self.identities.get(caller) or self.identities["client"])
        source = _endpoint(identity, self._namespace_labels(identity["namespace"]) if "namespace" in identity else {})
        destination = {"Internal": {"PodLabels": meta.get("labels") or {}, "NamespaceLabels": self._namespace_labels(ns),
                                    "Namespace": ns},
                       "IP": (pod.get("status") or {}).get("podIP") or POD_NETWORK_PLACEHOLDER_IP}
        flow = {"Source": source, "Destination": destination, "Protocol": "TCP", "ResolvedPort": port}
        key = hashlib.sha256(json.dumps([sorted(json.dumps(p, sort_keys=True) for p in policies), flow],
                                        sort_keys=True).encode()).hexdigest()
        with self.lock:
            known = self.verdicts.get(key)
        if known is not None:
            return known
        (verdict,) = query(self.binary, policies, [flow])
        with self.lock:
            self.asked += 1
            if len(self.verdicts) > 10000:
                self.verdicts.clear()
            self.verdicts[key] = verdict
        self.log(f"network: {caller} -> {ns}/{meta.get('name')}:{port}: {'allowed' if verdict else 'DROPPED'} (cyclonus)")
        return verdict
