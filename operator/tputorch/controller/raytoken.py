"""Each job's Ray cluster auth token, derived from the operator's own key.

The operator writes the token into a Secret it creates (render.ray_token_secret), which KubeRay
hands to every Ray container; it needs the same token again for its own dashboard calls (the
progress reads). Deriving it (HMAC-SHA256 of the Secret's namespace and name under the key)
means the operator never reads a Secret: RBAC grants it ``create`` on secrets and nothing else, and
every replica and restart computes the same token from the key the chart mounts.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from pathlib import Path

log = logging.getLogger("tputorch")

MIN_KEY_BYTES = 32


class RayTokens:
    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the Ray token key must hold at least {MIN_KEY_BYTES} bytes, it holds {len(key)}")
        self._key = key

    @classmethod
    def from_file(cls, path: str | None) -> "RayTokens":
        """The key in ``path`` (surrounding whitespace dropped); without a path, a key of this process
        only, so the tokens of clusters made before a restart or by another replica are not known
        (their progress reads are refused until they end)."""
        if not path:
            log.warning("no --ray-token-key-file: Ray tokens come from a key of this process only; "
                        "progress reads of clusters made by another replica or before a restart will be refused")
            return cls(secrets.token_bytes(MIN_KEY_BYTES))
        return cls(Path(path).read_bytes().strip())

    def token(self, namespace: str, secret_name: str) -> str:
        return hmac.new(self._key, f"{namespace}/{secret_name}".encode(), hashlib.sha256).hexdigest()
