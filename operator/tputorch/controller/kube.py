"""The few API calls the reconcile makes, behind one small adapter (tests use a fake of it).

The kubernetes client is blocking: calls run on threads. Status patches run on threads of their own
so that in a burst they never queue ahead of the creates of children, and events on one more thread
so that they never queue ahead of either (events.py holds them back while objects wait).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from kubernetes.client.rest import ApiException

from .rest import raw_call
from .metrics import METRICS

EVENT_SOURCE = "tputorch.io/operator"  # reportingController of our Events
# Every call gives up after this (connect, read) time: a call on a connection that went silent would
# otherwise hold its object's reconcile, and so the object, forever.
REQUEST_TIMEOUT = (10, 30)


class NotLeading(Exception):
    """This replica may not write now: it does not lead, or its last renewal is too old."""


class Abandoned(Exception):
    """The reconcile that asked for this call was abandoned (it timed out): it must not write."""


@dataclass
class Calls:
    """The API calls of one reconcile: once it is abandoned, none of its calls still waiting for a
    thread is sent, and the worker waits for those already sent before the key is handed out again
    (two writes for one object must never be in flight at once)."""
    abandoned: bool = False
    pending: set = field(default_factory=set)

    async def settled(self) -> None:
        await asyncio.gather(*(asyncio.wrap_future(f) for f in list(self.pending)), return_exceptions=True)


CALLS: contextvars.ContextVar[Calls | None] = contextvars.ContextVar("tputorch_calls", default=None)


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


class RawApi:
    """The calls Kube makes, under the client's own method names (CustomObjectsApi's, EventsV1Api's
    create_namespaced_event, CoreV1Api's create_namespaced_secret), each one raw_call: a body goes
    out as json.dumps makes it, an answer is parsed by json.loads only when it is read. The typed
    clients first walk every body in Python (sanitize_for_serialization: more CPU per RayJob
    create than json.dumps, bench/RESULTS.md issue 40), and CoreV1Api costs 20 MB to import."""

    def __init__(self, api_client) -> None:
        self.api_client = api_client

    def _call(self, method: str, path: str, timeout, body=None, content_type: str = "application/json",
              preload: bool = True):
        answer = raw_call(self.api_client, method, path, timeout, body=body, content_type=content_type)
        return json.loads(answer.read()) if preload else answer

    @staticmethod
    def _path(group: str, version: str, namespace: str, plural: str, name: str = "") -> str:
        return f"/apis/{group}/{version}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, _request_timeout=None):
        return self._call("POST", self._path(group, version, namespace, plural), _request_timeout, body)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, _request_timeout=None):
        return self._call("GET", self._path(group, version, namespace, plural, name), _request_timeout)

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, _request_timeout=None,
                                       _content_type=None):
        return self._call("PATCH", self._path(group, version, namespace, plural, name), _request_timeout, body,
                          _content_type or "application/merge-patch+json")

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body,
                                              _request_timeout=None, _content_type=None, _preload_content=True):
        return self._call("PATCH", self._path(group, version, namespace, plural, name) + "/status", _request_timeout,
                          body, _content_type or "application/merge-patch+json", _preload_content)

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, body=None,
                                        _request_timeout=None):
        return self._call("DELETE", self._path(group, version, namespace, plural, name), _request_timeout, body)

    def read_custom_resource_definition(self, name, _request_timeout=None):
        return self._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", _request_timeout)

    def create_namespaced_event(self, namespace, body, _request_timeout=None, _preload_content=True):
        return self._call("POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", _request_timeout, body,
                          preload=_preload_content)

    def create_namespaced_secret(self, namespace, body, _request_timeout=None) -> None:
        """The answer repeats what was sent (the token): read and dropped."""
        self._call("POST", f"/api/v1/namespaces/{namespace}/secrets", _request_timeout, body, preload=False).read()


class Kube:
    def __init__(self, configuration, workers: int, report_workers: int,
                 fence: Callable[[], float | None] | None = None, watches: int = 0) -> None:
        from kubernetes import client

        # the informers' watches hold a connection each, for as long as they run
        configuration.connection_pool_maxsize = workers + report_workers + 1 + watches
        # One attempt per call: urllib3's own retries (3 by default) each got the whole fenced
        # timeout, so a write outlived the Lease it was fenced by; a failure goes back to the
        # reconcile (or the informer), which retries with backoff and fences again.
        configuration.retries = 0
        # With leader election: the total time a write may take now, None when it may not write.
        self.fence = fence
        self._inflight: set[concurrent.futures.Future] = set()
        self._inflight_lock = threading.Lock()
        self.api_client = client.ApiClient(configuration)
        # one raw adapter for every call (RawApi says why); three names, as tests replace each
        self.custom = self.events = self.secrets = RawApi(self.api_client)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self.report_pool = ThreadPoolExecutor(max_workers=report_workers, thread_name_prefix="report")
        self.event_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="events")

    def _write_timeout(self, calls: Calls | None):
        """Checked in the call's thread just before it is sent, not when it was queued."""
        if calls is not None and calls.abandoned:
            raise Abandoned("the reconcile was abandoned")
        if self.fence is None:
            return REQUEST_TIMEOUT
        total = self.fence()
        if total is None or total <= 0:
            raise NotLeading("this replica does not hold the Lease")
        return min(float(REQUEST_TIMEOUT[1]), total)

    async def _submit(self, pool, call: Callable, write: bool, verb: str = "call", resource: str = ""):
        """``call(timeout)`` on ``pool``; a write is fenced (see _write_timeout) and tracked until
        it ends, for the abandoned reconcile and for the release of the Lease. Counted by verb and
        answer, timed by verb and resource (the time on the thread: the wait for one is not)."""
        calls = CALLS.get()

        def run():
            timeout = self._write_timeout(calls) if write else REQUEST_TIMEOUT
            started = time.perf_counter()
            try:
                answer = call(timeout)
            except ApiException as err:
                METRICS.api_call(verb, str(err.status), resource, time.perf_counter() - started)
                raise
            except Exception as err:  # no answer: refused, reset, timed out
                METRICS.api_call(verb, type(err).__name__, resource, time.perf_counter() - started)
                raise
            METRICS.api_call(verb, "2xx", resource, time.perf_counter() - started)
            return answer

        future = pool.submit(run)
        with self._inflight_lock:
            self._inflight.add(future)
        if calls is not None:
            calls.pending.add(future)

        def ended(f) -> None:
            with self._inflight_lock:
                self._inflight.discard(f)
            if calls is not None:
                calls.pending.discard(f)
        future.add_done_callback(ended)
        return await asyncio.wrap_future(future)

    def drain(self, timeout: float) -> bool:
        """Wait (blocking) for every call in flight; whether they all ended within ``timeout``."""
        with self._inflight_lock:
            inflight = set(self._inflight)
        return not concurrent.futures.wait(inflight, timeout).not_done

    async def _run(self, verb: str, resource: str, fn, *args, write: bool = True, **kwargs):
        return await self._submit(self.pool, lambda timeout: fn(*args, _request_timeout=timeout, **kwargs), write,
                                  verb, resource)

    async def create(self, res: Resource, namespace: str, body: dict) -> dict:
        return await self._run("create", res.plural, self.custom.create_namespaced_custom_object, res.group,
                               res.version, namespace, res.plural, body)

    async def create_secret(self, namespace: str, body: dict) -> None:
        await self._run("create", "secrets", self.secrets.create_namespaced_secret, namespace, body)

    async def get(self, res: Resource, namespace: str, name: str) -> dict:
        return await self._run("get", res.plural, self.custom.get_namespaced_custom_object, res.group, res.version,
                               namespace, res.plural, name, write=False)

    async def read_crd(self, name: str) -> dict | None:
        """A CustomResourceDefinition by name; None when it is not installed."""
        try:
            return await self._run("get", "customresourcedefinitions", self.custom.read_custom_resource_definition,
                                   name, write=False)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def patch(self, res: Resource, namespace: str, name: str, patch: dict | list) -> None:
        """A merge patch (a dict) or a JSON patch (a list of operations, e.g. with a test of the uid)."""
        await self._run("patch", res.plural, self.custom.patch_namespaced_custom_object, res.group, res.version,
                        namespace, res.plural, name, patch,
                        _content_type="application/json-patch+json" if isinstance(patch, list) else None)

    async def delete(self, res: Resource, namespace: str, name: str, uid: str | None) -> None:
        """Delete one object, only if it is still the one with ``uid`` (409 otherwise). Background:
        the garbage collector removes its dependents (a RayJob's RayCluster and pods)."""
        body = {"propagationPolicy": "Background", **({"preconditions": {"uid": uid}} if uid else {})}
        await self._run("delete", res.plural, self.custom.delete_namespaced_custom_object, res.group, res.version,
                        namespace, res.plural, name, body=body)

    async def _report(self, verb: str, resource: str, fn, *args, pool=None, **kwargs) -> None:
        """A status patch or an event, on the report threads. The answer is not parsed (that costs
        more CPU than the request), only drained so that the connection goes back to the pool."""
        def call(timeout):
            answer = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            answer.drain_conn()
            answer.release_conn()
        await self._submit(pool or self.report_pool, call, True, verb, resource)

    async def patch_status(self, res: Resource, namespace: str, name: str, status: dict,
                           uid: str | None = None) -> None:
        """Write ``status`` (the object's whole status; None values are fields to drop). With
        ``uid``, only onto that very object: a patch never lands on an object deleted and made
        again under the same name meanwhile (HTTP 422 then)."""
        body = status_patch_body(status, uid)
        await self._report("patch_status", res.plural, self.custom.patch_namespaced_custom_object_status, res.group,
                           res.version, namespace, res.plural, name, body,
                           _content_type="application/json-patch+json" if isinstance(body, list) else None)

    async def post_event(self, regarding: dict, event) -> None:
        """An events.k8s.io/v1 Event (a status.Event; `kubectl describe` shows it like a core/v1 one)."""
        namespace, name = regarding["namespace"], regarding["name"]
        body = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            # A name as client-go gives it (the events API refuses generateName "<name>.").
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "regarding": regarding,
            "type": event.type, "reason": event.reason, "note": note(event.message), "action": "Reconcile",
            "eventTime": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": EVENT_SOURCE, "reportingInstance": socket.gethostname()[:128],
        }
        await self._report("create_event", "events", self.events.create_namespaced_event, namespace, body, pool=self.event_pool)


def status_patch_body(status: dict, uid: str | None):
    """A merge patch, or with ``uid`` a JSON patch that tests metadata.uid first and then sets the
    whole status (a merge patch cannot carry a precondition: the status subresource ignores the
    metadata of a patch, a wrong uid included; measured on the API server)."""
    if uid is None:
        return {"status": status}
    return [{"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "add", "path": "/status", "value": {k: v for k, v in status.items() if v is not None}}]


def note(message: str, limit: int = 1024) -> str:
    """An event's note within the API's limit, which counts bytes, not characters."""
    data = message.encode("utf-8")
    return message if len(data) <= limit else data[:limit].decode("utf-8", "ignore")
