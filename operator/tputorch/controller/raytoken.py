"""Each job's Ray cluster auth token, derived from the operator's own key.

The operator writes the token into a Secret it creates (render/raytoken.py ray_token_secret), which KubeRay
hands to every Ray container; it needs the same token again for its own dashboard calls (the
progress reads). Deriving it (HMAC-SHA256 of the Secret's namespace and name under the key)
means the operator never reads a Secret: RBAC grants it ``create`` on secrets and nothing else, and
every replica and restart computes the same token from the key the chart mounts.

Rotation (docs/tasks/rotate-token-key.md): a current key, which makes every new token, and optionally the
previous one, whose tokens are still tried where a cluster refuses the current key's (a cluster
made before the rotation holds a token of the old key until it ends).
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
    def __init__(self, key: bytes, previous: bytes | None = None) -> None:
        for what, k in (("the Ray token key", key), ("the previous Ray token key", previous)):
            if k is not None and len(k) < MIN_KEY_BYTES:
                raise ValueError(f"{what} must hold at least {MIN_KEY_BYTES} bytes, it holds {len(k)}")
        self._keys = [key] + ([previous] if previous and previous != key else [])

    @classmethod
    def from_file(cls, path: str | None, previous_path: str | None = None) -> "RayTokens":
        """The key in ``path`` (surrounding whitespace dropped), and the previous key in
        ``previous_path`` where that file exists and is not empty (a Secret without the item mounts
        no file). Without a path, a key of this process only, so the tokens of clusters made before
        a restart or by another replica are not known (their progress reads are refused until they end)."""
        if not path:
            log.warning("no --ray-token-key-file: Ray tokens come from a key of this process only; "
                        "progress reads of clusters made by another replica or before a restart will be refused")
            return cls(secrets.token_bytes(MIN_KEY_BYTES))
        previous = None
        if previous_path and Path(previous_path).is_file():
            previous = Path(previous_path).read_bytes().strip() or None
        if previous:
            log.info("Ray token keys: the current one makes new tokens; the previous one is still tried for "
                     "clusters made before the rotation")
        return cls(Path(path).read_bytes().strip(), previous)

    def token(self, namespace: str, secret_name: str) -> str:
        """The token a new cluster gets: the current key's."""
        return self._token(self._keys[0], namespace, secret_name)

    def candidates(self, namespace: str, secret_name: str) -> list[str]:
        """The tokens a cluster may hold, the current key's first."""
        return [self._token(k, namespace, secret_name) for k in self._keys]

    @staticmethod
    def _token(key: bytes, namespace: str, secret_name: str) -> str:
        return hmac.new(key, f"{namespace}/{secret_name}".encode(), hashlib.sha256).hexdigest()
