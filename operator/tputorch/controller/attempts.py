"""Step: a job's attempts. The pods of its RayJob's current cluster seen deleted, which the status
derivation reads to tell a lost host (status/attempts.py), the RayJob
read again before an attempt is ended on pod events alone, and the child of an ended attempt
deleted. Its state: per object, the pods of its slice seen deleted while it could still lose a host."""

from __future__ import annotations

import logging

from kubernetes.client.rest import ApiException

from .. import status as statuses
from ..status.job import child_must_go
from .child import ChildStep, in_clusters
from .kind import Key, Kind
from .kind import TPUTORCHJOB
from .stores import Stores
from .writes import StatusWrites

log = logging.getLogger("tputorch")

MAX_DELETED_PODS = 64  # per object: the pods of its current attempt's slice seen deleted


class Attempts:
    def __init__(self, kube, stores: Stores, child: ChildStep, writes: StatusWrites) -> None:
        self.kube, self.stores, self.child, self.writes = kube, stores, child, writes
        self.deleted_pods: dict[Key, list[dict]] = {}  # pods seen deleted (status/attempts.py reads them)

    def keys(self) -> set[Key]:
        return set(self.deleted_pods)

    def forget(self, key: Key, uid: str | None = None) -> None:
        self.deleted_pods.pop(key, None)

    def pod_deleted(self, key: Key, pod: dict) -> None:
        """A pod that vanished is no longer in any store: what the reconcile needs to tell a lost
        host from a healthy slice is kept here until it has looked."""
        if key[0] != TPUTORCHJOB.kind or not self._may_lose_hosts(key):  # a service's pods are KubeRay's to replace
            return
        gone = self.deleted_pods.setdefault(key, [])
        gone[:] = gone[-(MAX_DELETED_PODS - 1):] + [pod]

    def _may_lose_hosts(self, key: Key) -> bool:
        """Whether a deleted pod can still matter to this object: it exists and has not finished
        (a finished or deleted job's pods all go; keeping them cost 62 MB per 1,000 jobs)."""
        parent = self.stores.parents[key[0]].get(key[1:])
        return parent is not None and not statuses.finished(parent.get("status") or {}) \
            and parent["metadata"].get("uid") not in self.writes.terminal

    def deleted_of(self, kind: Kind, key: Key, child: dict | None) -> list[dict]:
        """The pods of the RayJob's current cluster seen deleted."""
        return in_clusters(self.deleted_pods.get(key, ()), kind, child)

    @staticmethod
    def must_end(status: dict, child: dict | None) -> bool:
        return child is not None and child_must_go(status, child)

    async def read_again(self, kind: Kind, key: Key, child: dict) -> dict | None:
        """About to end the attempt, maybe on pod events alone: the pod and RayJob watches are not
        ordered, and a job that just succeeded also loses its pods (KubeRay deletes its cluster).
        The RayJob as the API has it now when newer than the store's (None: the same version).
        Only for this reconcile: the informer alone writes the store (a copy put there could
        outlive the RayJob's deletion event and hold the next attempt until a re-list)."""
        fresh = await self.kube.get(kind.child, key[1], key[2])
        if (fresh.get("metadata") or {}).get("resourceVersion") == (child.get("metadata") or {}).get("resourceVersion"):
            return None
        return self.stores.children[key[0]].slim(fresh)

    async def end(self, kind: Kind, key: Key, child: dict) -> None:
        """Delete a child of an ended attempt (once; its deletion event brings the key back)."""
        meta = child.get("metadata") or {}
        self.deleted_pods.pop(key, None)  # they were that attempt's
        self.child.expected.pop(key, None)  # the child just created, if it was this one, is not awaited any more
        if meta.get("deletionTimestamp"):
            return
        try:
            await self.kube.delete(kind.child, key[1], key[2], meta.get("uid"))
        except ApiException as err:
            if err.status not in (404, 409):  # gone already, or another object by that name now
                raise
        log.info("%s %s/%s of an ended attempt deleted", kind.child.kind, key[1], key[2])
