"""Ray's token authentication as a RayCluster's own head would apply it (Ray 2.60, started by
KubeRay 1.6 with `RAY_AUTH_MODE=token` and `RAY_AUTH_TOKEN` from the cluster's Secret).

A RayCluster whose `spec.authOptions.mode` is `token` has a token: the key `auth_token` of the
Secret `authOptions.secretName`, or else of the Secret KubeRay made for it (named as KubeRay's
`utils.CheckName(<raycluster>)`). Every dashboard call to that cluster but Ray's public paths must
carry `Bearer <token>` in `Authorization`, else in `X-Ray-Authorization` (what KubeRay's dashboard
client sends), else the cookie `ray-authentication-token`; the answer otherwise is exactly what a
real head answers (recorded/auth.json, recorded by tests/cluster/record_auth.py): 401 without a
token, 403 with a wrong one. A RayCluster without authOptions is open, as its head would be.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path

from .kube import Kube

RECORDED = Path(__file__).resolve().parent / "recorded" / "auth.json"
# Ray 2.60's dashboard (dashboard/http_server_head.py): reachable without a token.
PUBLIC_PATHS = frozenset({"/", "/favicon.ico", "/api/authentication_mode", "/api/authenticate", "/api/healthz",
                          "/api/gcs_healthz", "/api/local_raylet_healthz", "/-/healthz"})
PUBLIC_PREFIXES = ("/static/",)
COOKIE = "ray-authentication-token"
CACHE_SECONDS = 5.0


def check_name(name: str) -> str:
    """KubeRay's utils.CheckName: the name of the Secret it makes for a RayCluster (and of its pods'
    prefix): cut from the front to 50 characters, first character made a letter."""
    if len(name) > 50:
        name = name[len(name) - 50:]
    if name[:1].isdigit() or (name[:1] and not name[:1].isalnum()):
        name = "r" + name[1:]
    return name


def _recorded() -> dict:
    cases = json.loads(RECORDED.read_text())["cases"]
    return {"missing": cases["missing"]["response"], "invalid": cases["wrong"]["response"]}


REFUSALS = _recorded()


def presented(headers) -> str:
    """The credential as Ray reads it: Authorization, else X-Ray-Authorization, else the cookie."""
    value = headers.get("Authorization") or headers.get("X-Ray-Authorization") or ""
    if not value:
        for part in (headers.get("Cookie") or "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == COOKIE and v:
                value = "Bearer " + v
    return value


def refusal(path: str, headers, token: str | None) -> dict | None:
    """None if the call may pass; else Ray's recorded refusal ({status, content_type, body})."""
    if token is None or path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return None
    value = presented(headers)
    if not value:
        return REFUSALS["missing"]
    if value != "Bearer " + token:  # Ray compares the whole header: the prefix is case-sensitive
        return REFUSALS["invalid"]
    return None


def secret_name(raycluster: dict) -> str | None:
    """The Secret holding this RayCluster's token, None when its auth is off (KubeRay's rule)."""
    opts = (raycluster.get("spec") or {}).get("authOptions") or {}
    if opts.get("mode") != "token":
        return None
    return opts.get("secretName") or check_name(raycluster["metadata"]["name"])


class Tokens:
    """Each RayCluster's token, read from the API server (a few seconds' cache: KubeRay polls)."""

    def __init__(self, kube: Kube | None) -> None:
        self.kube = kube
        self.lock = threading.Lock()
        self.cache: dict[tuple[str, str], tuple[float, str | None]] = {}

    def token(self, ns: str, cluster: str) -> str | None:
        """The token a call to this RayCluster's head needs; None: open (no auth, or no API server)."""
        if self.kube is None or not ns or not cluster:
            return None
        now = time.monotonic()
        with self.lock:
            hit = self.cache.get((ns, cluster))
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1]
        token = self._read(ns, cluster)
        if token != "":  # a missing Secret is read again: its head starts as soon as it is made
            with self.lock:
                self.cache[(ns, cluster)] = (now, token)
        return token

    def _read(self, ns: str, cluster: str) -> str | None:
        rc = self.kube.raycluster(ns, cluster)
        name = secret_name(rc) if rc else None
        if name is None:
            return None
        secret = self.kube.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
        data = (secret or {}).get("data") or {}
        if "auth_token" not in data:
            # No head runs before its Secret exists (kubelet.py: its container waits): nothing
            # can authenticate.
            return ""
        return base64.b64decode(data["auth_token"]).decode()
