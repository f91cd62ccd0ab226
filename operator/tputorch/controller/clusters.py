"""Step: the running RayClusters of a child get what the spec says of them where KubeRay does not
carry it (a service's worker bounds: KubeRay leaves replicas out of its cluster hash). Its state:
per object, the spec version each cluster was read or patched to hold."""

from __future__ import annotations

import logging

from kubernetes.client.rest import ApiException

from ..render.service import raycluster_bounds_patch
from .kind import RAYCLUSTER, Key, Kind, api_message, controller_of

log = logging.getLogger("tputorch")
# Reads of a RayCluster per pass when its replicas keep changing under the bounds patch's test.
BOUNDS_READS = 3


class ClusterBounds:
    def __init__(self, kube) -> None:
        self.kube = kube
        self.done: dict[Key, dict[str, tuple]] = {}  # key -> {RayCluster name: spec version it holds}

    def keys(self) -> set[Key]:
        return set(self.done)

    def forget(self, key: Key, uid: str | None) -> None:
        self.done.pop(key, None)

    async def ensure(self, kind: Kind, key: Key, spec, child: dict | None, version: tuple) -> None:
        """Each running RayCluster of the service's RayService (owned by it) gets the spec's worker
        bounds (render/service.py raycluster_bounds_patch). Read once per spec version and cluster: nothing
        else writes a cluster's bounds."""
        if child is None:
            return
        namespace = key[1]
        child_uid = (child.get("metadata") or {}).get("uid")
        names = kind.cluster_names(child)
        done = {n: v for n, v in self.done.get(key, {}).items() if n in names}
        self.done[key] = done
        for name in sorted(names):
            if done.get(name) == version:
                continue
            if await self._bound(kind, key, spec, name, child_uid):
                done[name] = version

    async def _bound(self, kind: Kind, key: Key, spec, name: str, child_uid: str | None) -> bool:
        """Read the RayCluster ``name`` and patch its worker bounds; whether it is done for this spec
        version. The patch tests the replicas it read: when the autoscaler wrote them in between, the
        API server refuses it (422) and the cluster is read again (BOUNDS_READS times in all, then
        left to the next event), so the patch never overwrites the autoscaler's write."""
        namespace = key[1]
        for _ in range(BOUNDS_READS):
            try:
                cluster = await self.kube.get(RAYCLUSTER, namespace, name)
            except ApiException as err:
                if err.status == 403:  # a chart older than this grant: the service runs on, unresized
                    log.warning("RayCluster %s/%s: may not read it (%s): a replicas edit will not reach it",
                                namespace, name, api_message(err))
                    return True
                if err.status == 404:
                    return True  # not made yet, or already deleted by KubeRay: looked at on the next event
                raise
            patch = raycluster_bounds_patch(spec, cluster)
            # never one another object controls (its name in our status is no proof it is ours)
            if patch is None or (controller_of(cluster) or {}).get("uid") != child_uid:
                return True
            try:
                await self.kube.patch(RAYCLUSTER, namespace, name, patch)
            except ApiException as err:
                if err.status == 422 and '"causes"' not in (err.body or ""):  # a failed test: read again
                    log.info("RayCluster %s/%s: changed since read (%s), reading it again", namespace, name,
                             api_message(err))
                    continue
                raise
            log.info("RayCluster %s/%s of %s %s/%s: worker bounds patched", namespace, name, kind.child.kind,
                     namespace, key[2])
            return True
        return False
