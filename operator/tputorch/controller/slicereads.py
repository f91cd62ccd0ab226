"""Step: whether a multi-host service's LLM replicas each hold one whole slice, read from Ray's state
(the head's placement groups and nodes, dashboard.py) off the reconcile workers, once per interval
while the service serves on at least one replica; status/slices.py judges the answer and makes the
ReplicasOnWholeSlices condition of it. A single-host service is never read: a replica is its
host's slice. A read that fails changes nothing (the last check holds). Its state: the last check
that found replica placement groups, when each service was last read, the read in flight and the
last failure logged, per uid (dashboardreads.py)."""

from __future__ import annotations

import logging

from ..api.spec import ServiceSpec
from ..render.raytoken import is_ray_token_secret_of
from ..status import slices
from .dashboardreads import FAILED, DashboardReads
from .kind import Key, describe

log = logging.getLogger("tputorch")

# What is said, once, of a service whose cluster's Ray token only KubeRay holds (and the operator,
# which reads no Secret, cannot present): its Ray state is not read. A RayService the operator made
# names its own token Secret (controller/child.py); one made before 0.3.0 keeps KubeRay's until the
# user's edit that starts it a new RayCluster.
KUBERAY_TOKEN = ("its Ray token is KubeRay's own (authOptions names no token Secret of the operator's, and the "
                 "operator reads no Secret): the replicas' slices are not checked until an edit of the spec "
                 "that starts a new RayCluster gives it one")


def token_secret(rayservice: dict) -> tuple[bool, str | None]:
    """(whether the operator can call the service's Ray head, the token Secret to derive the token
    from): a cluster without token auth (KubeRay dropped authOptions) is called without one; one
    whose token Secret the operator named, with its derived token; any other has KubeRay's token."""
    auth = ((rayservice.get("spec") or {}).get("rayClusterConfig") or {}).get("authOptions")
    if not isinstance(auth, dict) or auth.get("mode") != "token":
        return True, None
    name = auth.get("secretName")
    return (True, name) if is_ray_token_secret_of(rayservice, name) else (False, None)


class SliceReads(DashboardReads):
    what = "the replicas' placement groups"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checks: dict[str, slices.SliceCheck] = {}  # uid -> the last check that found replica groups

    def state(self) -> tuple[dict, ...]:
        return (*super().state(), self.checks)

    def found(self, uid: str | None) -> slices.SliceCheck | None:
        return self.checks.get(uid) if uid else None

    def apply(self, key: Key, uid: str, svc: ServiceSpec, current: dict, rayservice: dict | None) -> None:
        """Read the serving cluster's placement groups and nodes again once per interval while the
        multi-host service ``current`` describes has a replica up; a check with news brings the key back."""
        cluster = current.get("rayClusterName")
        if (self.dashboard is None or not svc.slice.multi_host or rayservice is None or not cluster
                or not current.get("readyReplicas")):
            return
        callable_, secret_name = token_secret(rayservice)
        if not callable_:
            self.failed(key, uid, cluster, KUBERAY_TOKEN, logging.INFO)
            return
        self.schedule(key, uid, lambda: self._read(key, uid, cluster, svc.slice.hosts, secret_name))

    async def _read(self, key: Key, uid: str, cluster: str, hosts: int, secret_name: str | None) -> None:
        async def both(token: str | None) -> tuple[list[dict], list[dict]]:
            return (await self.dashboard.state(key[1], cluster, "placement_groups", token),
                    await self.dashboard.state(key[1], cluster, "nodes", token))

        answer = await self.fetch(key, uid, cluster, lambda: self.with_token(key[1], secret_name, both))
        if answer is FAILED:
            return
        try:
            found = slices.check(*answer, hosts)
        except Exception as err:  # a bug here must not end the read task unlogged
            log.error("%s %s/%s: the placement groups read from RayCluster %s could not be judged: %s", key[0],
                      key[1], key[2], cluster, describe(err))
            return
        if self.uid_of(key) == uid and found.groups and found != self.checks.get(uid):
            self.checks[uid] = found
            self.enqueue(key)
