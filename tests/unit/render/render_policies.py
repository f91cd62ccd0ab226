"""Run as a script by test_upgrade_network.py: renders, with whichever tputorch is first on
PYTHONPATH (this checkout's, or a previous release's sources), the NetworkPolicy of every
TPUTorchJob / TPUTorchService body under every operator configuration, and the pods its Ray
cluster runs. Reads one JSON object on stdin:
{"bodies": {key: body}, "configs": {name: {"mode": ..., "peers": [peer text], "metrics": [peer text]}}}
(peer texts as the operator's --network-policy-peer / --network-policy-metrics-peer flags take them),
and writes to stdout as JSON {"tputorch": the package's file, "policies": {key: {config name: policy}},
"pods": {key: {"head": labels, "workers": [labels], "submitter": labels or null, "ports": [port]}},
"refused": {key: why}}.

The pods are read from the child this tree renders: under the previous release, the pods a running
cluster has. It uses only what every release has had (api.spec.parse_any, render.render_any,
api.network.parse_peer_text, NetworkPolicyConfig and network_policy, which 0.2.0 kept in
render/__init__.py and later releases in render/network.py): it must run against the previous
release's code unchanged."""

import json
import sys

import tputorch
from tputorch.api.network import parse_peer_text
from tputorch.api.spec import InvalidSpec, parse_any
from tputorch.render import render_any

try:
    from tputorch.render.network import NetworkPolicyConfig, network_policy
except ImportError:  # 0.2.0
    from tputorch.render import NetworkPolicyConfig, network_policy


def pods(child: dict) -> dict:
    """The pod labels and declared ports of a rendered RayJob / RayService's cluster."""
    cluster = child["spec"].get("rayClusterSpec") or child["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster.get("workerGroupSpecs") or []]
    submitter = child["spec"].get("submitterPodTemplate")
    return {"head": templates[0].get("metadata", {}).get("labels") or {},
            "workers": [t.get("metadata", {}).get("labels") or {} for t in templates[1:]],
            "submitter": (submitter.get("metadata") or {}).get("labels") or {} if submitter else None,
            "ports": sorted({p["containerPort"] for t in templates for c in t["spec"]["containers"]
                             for p in c.get("ports") or []})}


def main() -> None:
    given = json.load(sys.stdin)
    configs = {name: NetworkPolicyConfig(c["mode"], tuple(parse_peer_text(p) for p in c["peers"]),
                                         tuple(parse_peer_text(p) for p in c["metrics"]))
               for name, c in given["configs"].items()}
    out = {"tputorch": tputorch.__file__, "policies": {}, "pods": {}, "refused": {}}
    for key, body in given["bodies"].items():
        try:
            spec = parse_any(body)
            child = render_any(spec)
        except InvalidSpec as e:
            out["refused"][key] = str(e)
            continue
        out["policies"][key] = {name: network_policy(spec, config) for name, config in configs.items()}
        out["pods"][key] = pods(child)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
