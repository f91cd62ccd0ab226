"""The few API calls the reconcile makes, behind one small adapter (tests use a fake of it).

The kubernetes client is blocking: calls run on threads. Status patches run on threads of their own
so that in a burst they never queue ahead of the creates of children, and events on one more thread
so that they never queue ahead of either (events.py holds them back while objects wait).
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

EVENT_SOURCE = "tputorch.io/operator"  # reportingController of our Events
# Every call gives up after this (connect, read) time: a call on a connection that went silent would
# otherwise hold its object's reconcile, and so the object, forever.
REQUEST_TIMEOUT = (10, 30)


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}"
        base += f"/namespaces/{namespace}/{self.plural}" if namespace else f"/{self.plural}"
        return f"{base}/{name}" if name else base


# The client's credential refresh runs before every request, and each run sets the host again,
# which scans the whole environment for proxies: 10 % of the operator's CPU in a burst (profile in
# bench/RESULTS.md). Tokens are re-read at most this often instead (the in-cluster token file is
# re-read after a minute anyway; projected tokens live an hour or more).
CREDENTIAL_REFRESH_S = 10.0


def load_config():
    """The in-cluster service account, else the kubeconfig: an ApiClient either way."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    throttle_credential_refresh(configuration)
    return configuration


def throttle_credential_refresh(configuration, seconds: float = CREDENTIAL_REFRESH_S, clock=time.monotonic) -> None:
    """Run the client's credential refresh hook at most once per ``seconds``. The loaders' hook
    installs itself again on every run: the newest one is kept behind this one."""
    hook = configuration.refresh_api_key_hook
    if hook is None:
        return
    last = float("-inf")

    def refresh(cfg) -> None:
        nonlocal hook, last
        now = clock()
        if now - last < seconds:
            return
        last = now  # two threads at once may both refresh: harmless
        hook(cfg)
        if cfg.refresh_api_key_hook is not refresh:
            hook, cfg.refresh_api_key_hook = cfg.refresh_api_key_hook, refresh
    configuration.refresh_api_key_hook = refresh


class Kube:
    def __init__(self, configuration, workers: int, report_workers: int) -> None:
        from kubernetes import client

        configuration.connection_pool_maxsize = workers + report_workers + 1
        self.api_client = client.ApiClient(configuration)
        self.custom = client.CustomObjectsApi(self.api_client)
        # events.k8s.io, not CoreV1Api: importing CoreV1Api costs the operator 20 MB (measured).
        self.events = client.EventsV1Api(self.api_client)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.report_pool = ThreadPoolExecutor(max_workers=report_workers, thread_name_prefix="report")
        self.event_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="events")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, lambda: fn(*args, _request_timeout=REQUEST_TIMEOUT))

    async def create(self, res: Resource, namespace: str, body: dict) -> dict:
        return await self._run(self.custom.create_namespaced_custom_object, res.group, res.version, namespace,
                               res.plural, body)

    async def get(self, res: Resource, namespace: str, name: str) -> dict:
        return await self._run(self.custom.get_namespaced_custom_object, res.group, res.version, namespace,
                               res.plural, name)

    async def patch(self, res: Resource, namespace: str, name: str, patch: dict) -> None:
        await self._run(self.custom.patch_namespaced_custom_object, res.group, res.version, namespace, res.plural,
                        name, patch)

    async def _report(self, fn, *args, pool=None) -> None:
        """A status patch or an event, on the report threads. The answer is not parsed (that costs
        more CPU than the request), only drained so that the connection goes back to the pool."""
        def call():
            answer = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
            answer.drain_conn()
            answer.release_conn()
        await asyncio.get_running_loop().run_in_executor(pool or self.report_pool, call)

    async def patch_status(self, res: Resource, namespace: str, name: str, status: dict) -> None:
        await self._report(self.custom.patch_namespaced_custom_object_status, res.group, res.version, namespace,
                           res.plural, name, {"status": status})

    async def post_event(self, regarding: dict, event) -> None:
        """An events.k8s.io/v1 Event (a status.Event; `kubectl describe` shows it like a core/v1 one)."""
        namespace, name = regarding["namespace"], regarding["name"]
        body = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            # A name as client-go gives it (the events API refuses generateName "<name>.").
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "regarding": regarding,
            "type": event.type, "reason": event.reason, "note": event.message[:1024], "action": "Reconcile",
            "eventTime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": EVENT_SOURCE, "reportingInstance": socket.gethostname()[:128],
        }
        await self._report(self.events.create_namespaced_event, namespace, body, pool=self.event_pool)
