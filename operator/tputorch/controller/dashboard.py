"""The operator's one client of the Ray dashboard: the tail of a Ray job driver's log, which carries
the progress lines of tputorch.train.report() (status/progress.py reads them).

Ray 2.60's state API serves it: ``GET /api/v0/logs/file?node_id=<driver's node>&submission_id=<id>&lines=<n>``
on the head's dashboard (port 8265, the head Service KubeRay makes, ``<raycluster>-head-svc``); every
Ray cluster's NetworkPolicy admits the operator there (render.Peer). Ray 2.60 refuses the call
without a node (HTTP 500, GetLogOptions: "node_id or node_ip must be provided") although the
submission id names the driver's log alone, so the job's own info (``GET /api/jobs/<id>``, as KubeRay
reads it) gives ``driver_node_id`` first. Proxies come from the environment
(HTTP_PROXY / NO_PROXY), as KubeRay's own dashboard client takes them. Every call carries the
cluster's Ray token (controller/raytoken.py) in ``X-Ray-Authorization``, the header KubeRay's own
dashboard client sends (Ray 2.60 reads ``Authorization`` first, then this one).
"""

from __future__ import annotations

import asyncio
import collections
import json
import re

import aiohttp

from ..render import DASHBOARD_PORT
from ..status.progress import LOG_LINES, MAX_LOG_BYTES

TIMEOUT = 5.0  # seconds for one read, connection included
CLUSTER_DOMAIN = "cluster.local"
MAX_JOB_INFO = 256 * 1024  # bytes of a job's info (its entrypoint and runtime env are bounded by the spec)
_NODE_ID = re.compile(r"^[0-9a-f]{8,128}$")


class DashboardError(Exception):
    """The dashboard did not answer with the log (its status and the start of its answer)."""


def head_url(namespace: str, cluster: str) -> str:
    return f"http://{cluster}-head-svc.{namespace}.svc.{CLUSTER_DOMAIN}:{DASHBOARD_PORT}"


class Dashboard:
    def __init__(self, timeout: float = TIMEOUT, lines: int = LOG_LINES, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.timeout, self.lines, self.max_bytes = timeout, lines, max_bytes
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                trust_env=True, timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=8, force_close=True))
        return self._session

    async def driver_log(self, namespace: str, cluster: str, submission_id: str, token: str | None = None) -> str:
        """The last lines of the driver's log (its last ``max_bytes`` bytes at most); raises
        DashboardError or an aiohttp/asyncio error."""
        base = head_url(namespace, cluster)
        session = self._client()
        headers = {"X-Ray-Authorization": f"Bearer {token}"} if token else {}
        async with session.get(f"{base}/api/jobs/{submission_id}", headers=headers) as resp:
            raw = await resp.content.read(MAX_JOB_INFO)
            if resp.status != 200:
                raise DashboardError(f"job info: HTTP {resp.status}: {raw[:300].decode(errors='replace')}")
        try:
            node = json.loads(raw).get("driver_node_id")
        except (ValueError, AttributeError):
            raise DashboardError(f"job info is not a JSON object: {raw[:100]!r}") from None
        if not isinstance(node, str) or not _NODE_ID.match(node):
            raise DashboardError(f"job {submission_id} has no driver node yet ({node!r})")
        params = {"node_id": node, "submission_id": submission_id, "lines": str(self.lines)}
        async with session.get(f"{base}/api/v0/logs/file", params=params, headers=headers) as resp:
            if resp.status != 200:
                raise DashboardError(f"HTTP {resp.status}: {(await resp.content.read(300)).decode(errors='replace')}")
            tail: collections.deque[bytes] = collections.deque()
            size = 0
            async for chunk in resp.content.iter_chunked(64 * 1024):
                tail.append(chunk)
                size += len(chunk)
                while size - len(tail[0]) >= self.max_bytes:  # keep the last max_bytes only
                    size -= len(tail.popleft())
        return b"".join(tail)[-self.max_bytes:].decode(errors="replace")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)
