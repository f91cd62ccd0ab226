"""Lease-based leader election (coordination.k8s.io/v1) through the kubernetes client's own
implementation: only the leader's workers reconcile; a standby keeps its stores warm and takes over
when the leader's lease runs out (it died) or is released (it was stopped).

Losing the lease ends the process, as client-go's controllers do: a replica that may have been
replaced must not write another status.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import uuid
from typing import Callable

log = logging.getLogger("tputorch")

LEASE_DURATION = 15  # seconds a standby waits after the last renewal it saw
RENEW_DEADLINE = 10  # the leader gives up when it could not renew for this long
RETRY_PERIOD = 2


def identity() -> str:
    # The pod name (hostname in Kubernetes) plus a suffix: a restarted container is a new candidate.
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Election:
    def __init__(self, name: str, namespace: str, on_leading: Callable[[], None],
                 on_lost: Callable[[], None] | None = None, who: str | None = None) -> None:
        from kubernetes.leaderelection import electionconfig, leaderelection
        from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

        self.name, self.namespace = name, namespace
        self.identity = who or identity()
        self.lock = LeaseLock(name, namespace, self.identity)
        self.lock.api_instance = _WithTimeout(self.lock.api_instance)
        self.leading = threading.Event()
        self.on_lost = on_lost or _exit_on_lost

        def started() -> None:
            log.info("leader election: %s leads (Lease %s/%s)", self.identity, namespace, name)
            self.leading.set()
            on_leading()

        def stopped() -> None:
            if self.leading.is_set() and not self.released.is_set():
                log.error("leader election: %s lost the Lease %s/%s", self.identity, namespace, name)
                self.on_lost()

        released = self.released = threading.Event()

        class _Election(leaderelection.LeaderElection):
            def try_acquire_or_renew(self):
                # After release() this replica neither renews nor takes the lease back.
                return False if released.is_set() else super().try_acquire_or_renew()

        self.election = _Election(electionconfig.Config(
            self.lock, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, started, stopped))

    def start(self) -> None:
        log.info("leader election: %s is a candidate for Lease %s/%s", self.identity, self.namespace, self.name)
        threading.Thread(target=self.election.run, name="leader-election", daemon=True).start()

    def release(self) -> None:
        """Give the lease up at shutdown so that the standby leads at once (client-go's
        ReleaseOnCancel); only once this replica has stopped reconciling."""
        if not self.leading.is_set():
            return
        self.released.set()
        from kubernetes import client

        try:
            now = datetime.datetime.now(datetime.timezone.utc)
            client.CoordinationV1Api().patch_namespaced_lease(self.name, self.namespace, {"spec": {
                "holderIdentity": None, "leaseDuration": 1, "renewTime": now.isoformat()}})
            log.info("leader election: %s released the Lease", self.identity)
        except Exception as err:  # the standby takes over after the lease duration instead
            log.warning("leader election: could not release the Lease: %s", err)


class _WithTimeout:
    """The lock's API with a timeout on every call: a renewal stuck on a silent connection would
    keep a standby from ever leading."""

    def __init__(self, api) -> None:
        self._api = api

    def __getattr__(self, name: str):
        from .kube import REQUEST_TIMEOUT

        call = getattr(self._api, name)
        return lambda *args, **kwargs: call(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)


def _exit_on_lost() -> None:
    os._exit(1)
