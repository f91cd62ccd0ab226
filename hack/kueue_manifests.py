"""Kueue's CRDs and webhook configurations for an out-of-cluster Kueue on loopback.

Reads them from the Kueue module in the Go module cache (never committed) and prints one
multi-document YAML stream for `kubectl create/replace`:

  * the CRDs of config/components/crd/bases; those Kueue's kustomization gives a conversion
    webhook (config/components/crd/patches/webhook_in_*.yaml) get it here too, pointed at
    https://127.0.0.1:<port>/convert with the local CA;
  * the mutating and validating webhook configurations of config/components/webhook, keeping only
    Kueue's own kinds and the enabled integrations' API groups (ray.io), each service reference
    turned into a URL on 127.0.0.1 with the local CA (there is no Service routing here).

Usage: kueue_manifests.py crds|webhooks <kueue module dir> <webhook port> <ca.crt>
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import yaml

GROUPS = {"kueue.x-k8s.io", "ray.io"}
PREFIX = "kueue-"   # Kueue's kustomization prefixes every object name with it


def conversion_patched(module: Path) -> set[str]:
    names = set()
    kust = yaml.safe_load((module / "config/components/crd/kustomization.yaml").read_text())
    for patch in kust.get("patches", []):
        doc = yaml.safe_load((module / "config/components/crd" / patch["path"]).read_text())
        if doc.get("spec", {}).get("conversion", {}).get("strategy") == "Webhook":
            names.add(doc["metadata"]["name"])
    return names


def crds(module: Path, url: str, ca: str) -> list[dict]:
    webhooked = conversion_patched(module)
    out = []
    for f in sorted((module / "config/components/crd/bases").glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        if crd["metadata"]["name"] in webhooked:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": f"{url}/convert", "caBundle": ca},
                "conversionReviewVersions": ["v1"]}}
        out.append(crd)
    return out


def webhooks(module: Path, url: str, ca: str) -> list[dict]:
    out = []
    for doc in yaml.safe_load_all((module / "config/components/webhook/manifests.yaml").read_text()):
        if not doc:
            continue
        kept = []
        for hook in doc["webhooks"]:
            if not {g for rule in hook["rules"] for g in rule["apiGroups"]} <= GROUPS:
                continue
            hook["clientConfig"] = {"url": url + hook["clientConfig"]["service"]["path"], "caBundle": ca}
            kept.append(hook)
        doc["metadata"]["name"] = PREFIX + doc["metadata"]["name"]
        doc["webhooks"] = kept
        out.append(doc)
    return out


def main(argv: list[str]) -> int:
    what, module, port, ca_file = argv
    url = f"https://127.0.0.1:{int(port)}"
    ca = base64.b64encode(Path(ca_file).read_bytes()).decode()
    docs = {"crds": crds, "webhooks": webhooks}[what](Path(module), url, ca)
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
