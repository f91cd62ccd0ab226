"""Lease-based leader election (coordination.k8s.io/v1): only the leader's workers write; a standby
keeps its stores warm and takes over when the leader's lease runs out (it died) or is released (it
was stopped).

A small Lease loop of our own rather than the kubernetes client's ``leaderelection`` module: that
module catches only ``ApiException`` (a refused connection kills its thread and ``on_stopped`` never
runs), bounds no renewal in total (urllib3 retries and (connect, read) timeouts per call) and gives
no way to gate writes on the last good renewal. Here, as client-go promises:

- every attempt (GET, then create or replace) is bounded in total by the renew deadline: urllib3
  retries are off and each call's total timeout is what is left of the deadline;
- any exception is a failed attempt; the loop itself is supervised (a watchdog declares the
  lease lost when no renewal succeeded within the renew deadline, whatever the loop is doing);
- ``may_write()`` is true only until the last good renewal's start + the renew deadline, which is
  before any standby can take the Lease (it waits the lease duration from when it saw that renewal);
- ``release()`` replaces the Lease only while this replica holds it (resourceVersion precondition)
  and only after in-flight writes ended;
- ``healthy()`` fails /healthz when this replica should lead but has not renewed for the lease
  duration + a tolerance (client-go's HealthzAdaptor).

Losing the lease ends the process by default, as client-go's controllers do.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Callable, Protocol

log = logging.getLogger("tputorch")

LEASE_DURATION = 15  # seconds a standby waits after the last renewal it saw
RENEW_DEADLINE = 10  # the leader stops writing when it could not renew for this long
RETRY_PERIOD = 2
HEALTH_TOLERANCE = 20  # /healthz fails when a leader's renewals are this late past the lease duration


class LeaseApi(Protocol):
    """The Lease calls the election makes; each takes a total timeout in seconds and returns the
    Lease as a dict (None from ``get`` when there is none). A conflict raises ``Conflict``."""

    def get(self, name: str, namespace: str, timeout: float) -> dict | None: ...

    def create(self, name: str, namespace: str, spec: dict, timeout: float) -> dict: ...

    def replace(self, lease: dict, timeout: float) -> dict: ...


class Conflict(Exception):
    """Someone else wrote the Lease first (HTTP 409), or created it first."""


def identity() -> str:
    # The pod name (hostname in Kubernetes) plus a suffix: a restarted container is a new candidate.
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def micro_time(now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Election:
    def __init__(self, name: str, namespace: str, api: LeaseApi, on_leading: Callable[[], None],
                 on_lost: Callable[[], None] | None = None, who: str | None = None,
                 clock: Callable[[], float] = time.monotonic, lease_duration: float = LEASE_DURATION,
                 renew_deadline: float = RENEW_DEADLINE, retry_period: float = RETRY_PERIOD,
                 drain: Callable[[float], bool] | None = None) -> None:
        self.name, self.namespace, self.api = name, namespace, api
        self.identity = who or identity()
        self.on_leading = on_leading
        self.on_lost = on_lost or _exit_on_lost
        self.clock = clock
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.drain = drain  # waits for in-flight writes (seconds) -> whether they all ended
        self.leading = threading.Event()  # this replica took the Lease (until it is lost or released)
        self.released = threading.Event()
        self.lost = threading.Event()
        self.renewed_at: float | None = None  # clock() at the start of the last good renewal
        self.transitions = 0  # times this replica became the leader
        self._observed: tuple | None = None  # (holder, renewTime, resourceVersion) as last read
        self._observed_at = 0.0
        self._failing: str | None = None  # the current streak's error, logged once
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- what the workers and probes read ---------------------------------------------------------

    def may_write(self) -> bool:
        """True while this replica leads and its last good renewal is within the renew deadline."""
        renewed = self.renewed_at
        return (self.leading.is_set() and not self.released.is_set() and not self.lost.is_set()
                and renewed is not None and self.clock() < renewed + self.renew_deadline)

    def write_timeout(self) -> float | None:
        """The total time a write started now may take, None when this replica may not write: it
        must end before a standby could take the Lease (the lease duration after the renewal it
        saw, which started no earlier than ours), less a second for clocks and scheduling."""
        renewed = self.renewed_at
        if not self.may_write() or renewed is None:
            return None
        return renewed + self.lease_duration - 1 - self.clock()

    def healthy(self) -> bool:
        """False once the lease was lost, or while a leader has not renewed for the lease duration
        + a tolerance (its loop is stuck: restarting the process is the way out)."""
        if self.released.is_set():
            return True
        if self.lost.is_set():
            return False
        if not self.leading.is_set():
            return True
        return self.clock() < (self.renewed_at or 0.0) + self.lease_duration + HEALTH_TOLERANCE

    # --- one attempt --------------------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One GET and, when the Lease is free, ours or expired, one create or replace; all of it
        within the renew deadline. Raises on any failure to talk to the API."""
        started = self.clock()
        deadline = started + self.renew_deadline

        def left() -> float:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise TimeoutError("the renew deadline passed during the attempt")
            return remaining

        lease = self.api.get(self.name, self.namespace, left())
        now = micro_time()
        if lease is None:
            spec = self._spec(now, now, 0)
            self.api.create(self.name, self.namespace, spec, left())
            self._renewed(started)
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        seen = (holder, spec.get("renewTime"), (lease.get("metadata") or {}).get("resourceVersion"))
        if seen != self._observed:
            self._observed, self._observed_at = seen, self.clock()
        duration = spec.get("leaseDurationSeconds") or self.lease_duration
        if holder and holder != self.identity and self.clock() < self._observed_at + duration:
            return False  # held by another whose lease has not run out
        if self.released.is_set():
            return False
        ours = holder == self.identity
        transitions = (spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        acquired = spec.get("acquireTime") if ours and spec.get("acquireTime") else now
        self.api.replace({**lease, "spec": self._spec(acquired, now, transitions)}, left())
        self._renewed(started)
        return True

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict:
        return {"holderIdentity": self.identity, "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": acquired, "renewTime": renewed, "leaseTransitions": transitions}

    def _renewed(self, started: float) -> None:
        with self._lock:
            if self.lost.is_set() or self.released.is_set():
                return
            self.renewed_at = started
            first = not self.leading.is_set()
            self.leading.set()
        if first:
            self.transitions += 1
            log.info("leader election: %s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
            self.on_leading()

    # --- the loop and its watchdog --------------------------------------------------------------

    def step(self) -> None:
        """One attempt; any exception is a failed attempt (logged once per streak)."""
        try:
            ok = self.try_acquire_or_renew()
        except Exception as err:  # refused/reset connections, timeouts, 5xx, 409: all a failed attempt
            ok = False
            text = f"{type(err).__name__}: {str(err)[:200]}"
            if self._failing is None:
                log.warning("leader election: %s could not reach the Lease %s/%s: %s", self.identity,
                            self.namespace, self.name, text)
            self._failing = text
        else:
            if self._failing is not None:
                log.info("leader election: the Lease %s/%s is reachable again", self.namespace, self.name)
            self._failing = None
        if not ok:
            self.check()

    def check(self) -> None:
        """Declare the lease lost once a leader has not renewed within the renew deadline."""
        with self._lock:
            if (not self.leading.is_set() or self.lost.is_set() or self.released.is_set()
                    or self.may_write()):
                return
            self.lost.set()
        log.error("leader election: %s lost the Lease %s/%s (no renewal for %ss)", self.identity,
                  self.namespace, self.name, self.renew_deadline)
        self.on_lost()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.step()
            # a leader renews every retry period; candidates with jitter (client-go's JitterFactor 1.2)
            wait = self.retry_period * (1 if self.leading.is_set() else 1 + 0.2 * random.random())
            self._stop.wait(wait)

    def _watchdog(self) -> None:
        period = min(1.0, self.retry_period / 2)
        while not self._stop.wait(period):
            self.check()
            if not self._threads[0].is_alive() and not self._stop.is_set():  # cannot happen; if it does, say so
                log.error("leader election: the election thread ended; starting it again")
                self._threads[0] = self._spawn(self._loop, "leader-election")

    def _spawn(self, target, name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread

    def start(self) -> None:
        log.info("leader election: %s is a candidate for Lease %s/%s", self.identity, self.namespace, self.name)
        self._threads = [self._spawn(self._loop, "leader-election")]
        self._threads.append(self._spawn(self._watchdog, "leader-watchdog"))

    # --- shutdown ---------------------------------------------------------------------------------

    def release(self, timeout: float = 10.0) -> bool:
        """Give the Lease up at shutdown so that the standby leads at once (client-go's
        ReleaseOnCancel): only after in-flight writes ended, and only while this replica holds it.
        Returns whether the Lease was released."""
        with self._lock:
            was_leading = self.leading.is_set() and not self.lost.is_set()
            self.released.set()  # no write starts from here on, no renewal either
        self._stop.set()
        if not was_leading:
            return False
        end = self.clock() + timeout
        if self.drain is not None and not self.drain(timeout):
            log.warning("leader election: writes still in flight; the standby takes over when the Lease runs out")
            return False
        try:
            lease = self.api.get(self.name, self.namespace, max(0.5, end - self.clock()))
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != self.identity:
                log.info("leader election: %s no longer holds the Lease; nothing to release", self.identity)
                return False
            now = micro_time()
            self.api.replace({**lease, "spec": {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                                                "renewTime": now, "acquireTime": now}},
                             max(0.5, end - self.clock()))
        except Exception as err:  # the standby takes over after the lease duration instead
            log.warning("leader election: could not release the Lease: %s: %s", type(err).__name__, str(err)[:200])
            return False
        log.info("leader election: %s released the Lease", self.identity)
        return True


class KubeLeaseApi:
    """LeaseApi over the kubernetes client, on an ApiClient of its own with urllib3 retries off:
    each call is one request bounded by its total timeout."""

    def __init__(self, configuration) -> None:
        import copy

        from kubernetes import client

        configuration = copy.copy(configuration)
        configuration.retries = False
        self.api = client.CoordinationV1Api(client.ApiClient(configuration))

    def _call(self, fn, *args, timeout: float) -> dict:
        from kubernetes.client.rest import ApiException

        try:
            resp = fn(*args, _preload_content=False, _request_timeout=float(timeout))
        except ApiException as err:
            if err.status == 409:
                raise Conflict(str(err.reason)) from None
            raise
        return json.loads(resp.data)

    def get(self, name, namespace, timeout):
        from kubernetes.client.rest import ApiException

        try:
            return self._call(self.api.read_namespaced_lease, name, namespace, timeout=timeout)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def create(self, name, namespace, spec, timeout):
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}
        return self._call(self.api.create_namespaced_lease, namespace, body, timeout=timeout)

    def replace(self, lease, timeout):
        meta = lease["metadata"]
        return self._call(self.api.replace_namespaced_lease, meta["name"], meta["namespace"], lease, timeout=timeout)


def _exit_on_lost() -> None:
    os._exit(1)
