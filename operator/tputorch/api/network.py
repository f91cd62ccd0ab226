"""Who may reach a Ray cluster's pods: the peers of its NetworkPolicy (by namespace and pod labels,
or by address range) and how a TPUTorchService says who may call its Serve port. Pure; the
policy itself is rendered in render/."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .common import LABEL_VALUE, label_key_ok
from .reader import Reader

NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server
ANY_NAMESPACE = "*"

# How the dashboard port (8265) is admitted. open: from any source, as Ray token auth refuses every
# call without the cluster's token (GKE's hosted KubeRay calls from an address that is not
# documented); strict: only from the listed peers (KubeRay's and the operator's).
POLICY_MODES = ("open", "strict")

# spec.exposure.clients of a TPUTorchService: who may call the Serve port, which checks no token.
EXPOSURES = ("Anywhere", "InNamespace", "Listed")
EXPOSURE_FIELDS = {"clients", "from", "serveService"}
PEER_FIELDS = {"namespace", "podLabels", "cidr"}
MAX_PEERS = 32
# spec.exposure.serveService: the Service KubeRay makes in front of the Serve port (<name>-serve-svc,
# KubeRay's RayService spec.serveService). KubeRay keeps that one Service across upgrades and only
# retargets its selector at a cluster switch, so its address (a load balancer's too) survives them.
# NodePort is not offered: it would open the Serve port, which checks no token, on every node.
SERVE_SERVICE_TYPES = ("ClusterIP", "LoadBalancer")
SERVE_SERVICE_FIELDS = {"type", "annotations", "loadBalancerSourceRanges"}
MAX_ANNOTATIONS = 32
MAX_ANNOTATION_VALUE = 4096


@dataclass(frozen=True)
class Peer:
    """Sources a NetworkPolicy rule admits: pods by namespace and labels, or an address range.
    ``namespace`` None: the policy's own namespace; ANY_NAMESPACE: every namespace."""

    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    cidr: str | None = None

    def selector(self) -> dict:
        """This peer as a NetworkPolicyPeer."""
        if self.cidr is not None:
            return {"ipBlock": {"cidr": self.cidr}}
        peer = {}
        if self.namespace == ANY_NAMESPACE:
            peer["namespaceSelector"] = {}
        elif self.namespace is not None:
            peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}}
        peer["podSelector"] = {"matchLabels": dict(self.labels)} if self.labels else {}
        return peer

    def __str__(self) -> str:
        if self.cidr is not None:
            return self.cidr
        labels = ",".join(f"{k}={v}" for k, v in self.labels)
        return (self.namespace or "") + (f":{labels}" if labels else "")


def cidr_problem(text: str) -> str | None:
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError:
        return "must be a CIDR block with no host bits set, e.g. 10.0.0.0/8 or 2001:db8::/32"
    return None if "/" in text and str(net) == text else "must be written as a CIDR block in canonical form, e.g. 10.0.0.0/8"


def labels_problem(labels: Mapping) -> str | None:
    for k, v in labels.items():
        if not isinstance(k, str) or not label_key_ok(k):
            return f"{k!r} is not a label name ([prefix/]name, name at most 63 characters of [-A-Za-z0-9_.])"
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.fullmatch(v):
            return f"{v!r} (of {k}) is not a label value (at most 63 characters of [-A-Za-z0-9_.])"
    return None


def parse_peer_text(text: str) -> Peer:
    """A peer as the operator's flags write it: a CIDR block (10.0.0.0/8), or NAMESPACE[:KEY=VALUE,...]
    with NAMESPACE '*' for every namespace. ValueError says what is allowed."""
    if "/" in text and "=" not in text:  # an address range (a label key with a prefix comes with "=")
        problem = cidr_problem(text)
        if problem:
            raise ValueError(f"{text!r}: {problem}")
        return Peer(cidr=text)
    namespace, _, labels = text.partition(":")
    pairs = [item.partition("=") for item in labels.split(",") if item]
    if namespace != ANY_NAMESPACE and not NAMESPACE_NAME.fullmatch(namespace) or any(not eq for _, eq, _ in pairs):
        raise ValueError(f"{text!r} must be a CIDR block (10.0.0.0/8), NAMESPACE or NAMESPACE:KEY=VALUE[,KEY=VALUE...] "
                         f"(NAMESPACE '*': every namespace)")
    problem = labels_problem({k: v for k, _, v in pairs})
    if problem:
        raise ValueError(f"{text!r}: {problem}")
    return Peer(namespace, tuple((k, v) for k, _, v in pairs))


@dataclass(frozen=True)
class ServeService:
    """The Service in front of the Serve port, as KubeRay makes it: its type, annotations (e.g. GKE's
    networking.gke.io/load-balancer-type: Internal) and, for a LoadBalancer, the client ranges."""

    type: str = "ClusterIP"
    annotations: tuple[tuple[str, str], ...] = ()
    source_ranges: tuple[str, ...] = ()


@dataclass(frozen=True)
class Exposure:
    """Who may call a service's Serve port: Anywhere, InNamespace (pods of its own namespace) or
    Listed (the peers in ``peers``); and the Service in front of it."""

    clients: str = "Anywhere"
    peers: tuple[Peer, ...] = ()
    serve_service: ServeService = ServeService()


def parse_exposure(r: Reader, spec: Mapping) -> Exposure:
    """spec.exposure of a TPUTorchService."""
    block = r.mapping(spec, "exposure", "spec.exposure", EXPOSURE_FIELDS)
    clients = r.value(block, "clients", "spec.exposure.clients", str, default="Anywhere",
                      check=lambda v: None if v in EXPOSURES else f"must be one of {', '.join(EXPOSURES)}")
    listed: Any = block.get("from")
    peers: list[Peer] = []
    if clients == "Listed" and not listed:
        r.error("spec.exposure.from", listed, "must list at least one client (namespace, podLabels or cidr) "
                "when spec.exposure.clients is Listed")
    elif clients != "Listed" and listed is not None:
        r.error("spec.exposure.from", listed, "may be set only when spec.exposure.clients is Listed")
    elif listed is not None and not isinstance(listed, list):
        r.error("spec.exposure.from", listed, "must be a list")
    elif listed:
        if len(listed) > MAX_PEERS:
            r.error("spec.exposure.from", len(listed), f"must list at most {MAX_PEERS} clients")
        for i, item in enumerate(listed[:MAX_PEERS]):
            peer = _parse_client(r, item, f"spec.exposure.from[{i}]")
            if peer is not None:
                peers.append(peer)
    return Exposure(clients or "Anywhere", tuple(peers), _parse_serve_service(r, block))


def _parse_serve_service(r: Reader, exposure: Mapping) -> ServeService:
    block = r.mapping(exposure, "serveService", "spec.exposure.serveService", SERVE_SERVICE_FIELDS)
    kind = r.value(block, "type", "spec.exposure.serveService.type", str, default="ClusterIP",
                   check=lambda v: None if v in SERVE_SERVICE_TYPES else
                   f"must be one of {', '.join(SERVE_SERVICE_TYPES)} (NodePort is not offered: it would open the "
                   "Serve port, which checks no token, on every node)")
    annotations: Any = block.get("annotations")
    pairs: list[tuple[str, str]] = []
    if annotations is not None:
        path = "spec.exposure.serveService.annotations"
        if not isinstance(annotations, Mapping):
            r.error(path, annotations, "must be a map of annotation names to string values")
        elif len(annotations) > MAX_ANNOTATIONS:
            r.error(path, len(annotations), f"must have at most {MAX_ANNOTATIONS} annotations")
        else:
            for k, v in annotations.items():
                if not isinstance(k, str) or not label_key_ok(k):
                    r.error(path, k, "is not an annotation name ([prefix/]name, name at most 63 characters of "
                            "[-A-Za-z0-9_.], prefix a DNS subdomain)")
                elif not isinstance(v, str) or len(v) > MAX_ANNOTATION_VALUE:
                    r.error(f"{path}.{k}", v, f"must be a string of at most {MAX_ANNOTATION_VALUE} characters")
                else:
                    pairs.append((k, v))
    ranges: Any = block.get("loadBalancerSourceRanges")
    cidrs: list[str] = []
    if ranges is not None:
        path = "spec.exposure.serveService.loadBalancerSourceRanges"
        if kind != "LoadBalancer":
            r.error(path, ranges, "may be set only when spec.exposure.serveService.type is LoadBalancer")
        elif not isinstance(ranges, list) or not ranges:
            r.error(path, ranges, "must be a non-empty list of CIDR blocks")
        elif len(ranges) > MAX_PEERS:
            r.error(path, len(ranges), f"must list at most {MAX_PEERS} address ranges")
        else:
            for i, cidr in enumerate(ranges):
                problem = cidr_problem(cidr) if isinstance(cidr, str) else "must be a string"
                if problem:
                    r.error(f"{path}[{i}]", cidr, problem)
                else:
                    cidrs.append(cidr)
    return ServeService(kind or "ClusterIP", tuple(sorted(pairs)), tuple(cidrs))


def _parse_client(r: Reader, item: Any, path: str) -> Peer | None:
    if not isinstance(item, Mapping):
        r.error(path, item, "must be an object with namespace and/or podLabels, or cidr")
        return None
    unknown = set(item) - PEER_FIELDS
    if unknown:
        r.error(path, sorted(unknown), f"unknown field(s); allowed: {', '.join(sorted(PEER_FIELDS))}")
        return None
    cidr, namespace, labels = item.get("cidr"), item.get("namespace"), item.get("podLabels")
    if cidr is not None:
        if namespace is not None or labels is not None:
            r.error(path, dict(item), "cidr excludes namespace and podLabels: write them as separate clients")
            return None
        problem = cidr_problem(cidr) if isinstance(cidr, str) else "must be a string"
        if problem:
            r.error(f"{path}.cidr", cidr, problem)
            return None
        return Peer(cidr=cidr)
    if namespace is None and labels is None:
        r.error(path, dict(item), "must set namespace and/or podLabels, or cidr")
        return None
    if namespace is not None and (not isinstance(namespace, str) or not NAMESPACE_NAME.fullmatch(namespace)):
        r.error(f"{path}.namespace", namespace, "must be a namespace name (a DNS label)")
        return None
    if labels is not None:
        problem = labels_problem(labels) if isinstance(labels, Mapping) else "must be a map of label names to values"
        if problem:
            r.error(f"{path}.podLabels", labels, problem)
            return None
    return Peer(namespace, tuple(sorted((labels or {}).items())))
