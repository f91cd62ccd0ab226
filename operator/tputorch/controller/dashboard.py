"""The operator's one client of the Ray dashboard: the tail of a Ray job driver's log, which carries
the progress lines of tputorch.train.report() (status/progress.py reads them), and a multi-host
service's placement groups and nodes (status/slices.py judges them).

Ray 2.60's state API serves it: ``GET /api/v0/logs/file?node_id=<driver's node>&submission_id=<id>&lines=<n>``
on the head's dashboard (port 8265, the head Service KubeRay makes, ``<raycluster>-head-svc``); every
Ray cluster's NetworkPolicy admits the operator there (api/network.py Peer). Ray 2.60 refuses the call
without a node (HTTP 500, GetLogOptions: "node_id or node_ip must be provided") although the
submission id names the driver's log alone, so the job's own info (``GET /api/jobs/<id>``, as KubeRay
reads it) gives ``driver_node_id`` first. Placement groups and nodes: ``GET /api/v0/<what>?detail=1&limit=<n>``,
whose answer is ``{"data": {"result": {"result": [...]}}}`` (Ray 2.60's state API). Proxies come from the environment
(HTTP_PROXY / NO_PROXY), as KubeRay's own dashboard client takes them. Every call carries the
cluster's Ray token (controller/raytoken.py) in ``X-Ray-Authorization``, the header KubeRay's own
dashboard client sends (Ray 2.60 reads ``Authorization`` first, then this one). A redirect is never
followed (a tenant's head could send the token anywhere); each request has its own timeout, the
wait for one of the SLOTS outside it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re

import aiohttp

from ..render.network import DASHBOARD_PORT
from ..status.progress import LOG_LINES, MAX_LOG_BYTES

# Seconds for one request (connecting, sending, the whole answer), not counting the wait for a slot:
# a timeout that included the wait made a few slow heads time out every other job's reads.
TIMEOUT = 5.0
SLOTS = 32  # requests in flight at once, to every dashboard together
CLUSTER_DOMAIN = "cluster.local"
MAX_JOB_INFO = 256 * 1024  # bytes of a job's info (its entrypoint and runtime env are bounded by the spec)
STATE_LIMIT = 1000  # entries of a state-API list asked for (a service's cluster has far fewer nodes or groups)
MAX_STATE = 8 * 1024 * 1024  # bytes of one such list (a node with its labels and resources is under 4 KiB)
_NODE_ID = re.compile(r"^[0-9a-f]{8,128}$")


# Ray 2.60 with token auth: 401 without a token, 403 with a wrong one (hack/fakedash/recorded/auth.json).
TOKEN_REFUSED = (401, 403)


class DashboardError(Exception):
    """The dashboard did not answer with the log (its status and the start of its answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, where the dashboard answered with one

    @property
    def token_refused(self) -> bool:
        return self.status in TOKEN_REFUSED


def head_url(namespace: str, cluster: str) -> str:
    return f"http://{cluster}-head-svc.{namespace}.svc.{CLUSTER_DOMAIN}:{DASHBOARD_PORT}"


async def _refused(what: str, resp: aiohttp.ClientResponse) -> DashboardError:
    if 300 <= resp.status < 400:  # never followed: the token would go wherever a tenant's head points
        return DashboardError(f"{what}: HTTP {resp.status}: a redirect to {resp.headers.get('Location', '')[:200]!r}, "
                              f"not followed", resp.status)
    return DashboardError(f"{what}: HTTP {resp.status}: {(await resp.content.read(300)).decode(errors='replace')}",
                          resp.status)


class Dashboard:
    def __init__(self, timeout: float = TIMEOUT, lines: int = LOG_LINES, max_bytes: int = MAX_LOG_BYTES,
                 slots: int = SLOTS) -> None:
        self.timeout, self.lines, self.max_bytes = timeout, lines, max_bytes
        self._slots = asyncio.Semaphore(slots)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No limit in the connector: the slots bound the requests, outside each one's timeout.
            self._session = aiohttp.ClientSession(
                trust_env=True, timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=0, force_close=True))
        return self._session

    async def driver_log(self, namespace: str, cluster: str, submission_id: str, token: str | None = None) -> str:
        """The last lines of the driver's log (its last ``max_bytes`` bytes at most); raises
        DashboardError or an aiohttp/asyncio error."""
        async with self._slots:
            return await self._driver_log(namespace, cluster, submission_id, token)

    async def _driver_log(self, namespace: str, cluster: str, submission_id: str, token: str | None) -> str:
        base = head_url(namespace, cluster)
        session = self._client()
        headers = {"X-Ray-Authorization": f"Bearer {token}"} if token else {}
        async with session.get(f"{base}/api/jobs/{submission_id}", headers=headers, allow_redirects=False) as resp:
            if resp.status != 200:
                raise await _refused("job info", resp)
            raw = b"".join([chunk async for chunk in _bounded(resp, MAX_JOB_INFO, "job info")])
        try:
            node = json.loads(raw).get("driver_node_id")
        except (ValueError, AttributeError, RecursionError):
            raise DashboardError(f"job info is not a JSON object: {raw[:100]!r}") from None
        if not isinstance(node, str) or not _NODE_ID.match(node):
            raise DashboardError(f"job {submission_id} has no driver node yet ({node!r})")
        params = {"node_id": node, "submission_id": submission_id, "lines": str(self.lines)}
        async with session.get(f"{base}/api/v0/logs/file", params=params, headers=headers,
                               allow_redirects=False) as resp:
            if resp.status != 200:
                raise await _refused("driver log", resp)
            tail: collections.deque[bytes] = collections.deque()
            size = 0
            async for chunk in resp.content.iter_chunked(64 * 1024):
                tail.append(chunk)
                size += len(chunk)
                while size - len(tail[0]) >= self.max_bytes:  # keep the last max_bytes only
                    size -= len(tail.popleft())
        return b"".join(tail)[-self.max_bytes:].decode(errors="replace")

    async def state(self, namespace: str, cluster: str, what: str, token: str | None = None) -> list[dict]:
        """One list of Ray's state API with details (``placement_groups``, ``nodes``); raises
        DashboardError or an aiohttp/asyncio error."""
        async with self._slots:
            headers = {"X-Ray-Authorization": f"Bearer {token}"} if token else {}
            params = {"detail": "1", "limit": str(STATE_LIMIT)}
            async with self._client().get(f"{head_url(namespace, cluster)}/api/v0/{what}", params=params,
                                          headers=headers, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise await _refused(what, resp)
                raw = b"".join([chunk async for chunk in _bounded(resp, MAX_STATE, what)])
        try:
            found = json.loads(raw)["data"]["result"]["result"]
        except (ValueError, KeyError, TypeError, RecursionError):
            raise DashboardError(f"{what}: not a state API answer: {raw[:100]!r}") from None
        if not isinstance(found, list):
            raise DashboardError(f"{what}: not a list: {raw[:100]!r}")
        return found

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)


async def _bounded(resp: aiohttp.ClientResponse, limit: int, what: str):
    """The whole answer, however many reads it comes in, up to ``limit`` bytes (more is refused)."""
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise DashboardError(f"{what}: more than {limit} bytes")
        yield chunk
