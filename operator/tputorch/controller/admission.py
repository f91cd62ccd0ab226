"""Step: Kueue admission. Where Kueue holds a child's suspend, the status says what its Workload
says, and the user's spec.suspend is carried to the Workload. Its inputs: the Workload and
WorkloadPriorityClass stores (None: Kueue is not read); no state of its own."""

from __future__ import annotations

import logging

from ..render.names import QUEUE_LABEL
from ..render.service import admitted_timeout_patch
from ..status import kueue
from .informer import key_of
from .kind import WORKLOAD, Kind
from .stores import Stores

log = logging.getLogger("tputorch")


class KueueAdmission:
    def __init__(self, kube, stores: Stores) -> None:
        self.kube, self.stores = kube, stores

    def manages(self, child: dict) -> bool:
        """Kueue holds this child's suspend: it carries a queue name and Kueue's Workload kind is
        served (without Kueue nobody else would ever start or stop it)."""
        labels = (child.get("metadata") or {}).get("labels") or {}
        workloads = self.stores.workloads
        return bool(labels.get(QUEUE_LABEL)) and workloads is not None and workloads.served is not False

    async def admission(self, kind: Kind, spec, child: dict | None) -> kueue.Admission | None:
        """Where Kueue has the child, from its Workload."""
        if child is None or not spec.queue_name or not self.manages(child):
            return None
        namespace, name = key_of(child)
        workloads = self.stores.workloads
        refused = workloads.forbidden_in(namespace)
        if refused is not None:  # RBAC without workloads: say so, keep KubeRay's phase
            return kueue.Admission(False, "Forbidden", f"the operator may not read Kueue's Workloads: "
                                   f"{refused[1]}", None)
        if not workloads.synced.is_set():  # a list that keeps failing: never guess "no Workload"
            return kueue.Admission(False, "WorkloadsNotListed", "the operator could not list Kueue's Workloads yet"
                                   f" ({workloads.list_error or 'no answer'}): admission unknown", None)
        workload = self._workload_of(kind, child)
        pcs, exists = self.stores.priority_classes, True
        if spec.priority_class_name and pcs is not None and pcs.served and pcs.forbidden is None:
            exists = pcs.get(("", spec.priority_class_name)) is not None
        return kueue.admission(spec.queue_name, kind.child.kind, name, workload, spec.priority_class_name, exists)

    def _workload_of(self, kind: Kind, child: dict) -> dict | None:
        namespace, name = key_of(child)
        return kueue.workload_for(self.stores.workloads.indexed((namespace, kind.child.kind, name)), child)

    async def initializing_timeout(self, kind: Kind, spec, child: dict | None,
                                   admission: kueue.Admission | None) -> None:
        """A queued service's RayService gets its initializing timeout when Kueue admits it
        (render/service.py admitted_timeout_patch): the time it waited in the queue does not count."""
        patch = admitted_timeout_patch(spec, child, admission) if child is not None else None
        if patch is None:
            return
        namespace, name = key_of(child)
        await self.kube.patch(kind.child, namespace, name, patch)
        log.info("%s %s/%s patched on admission: %s", kind.child.kind, namespace, name, patch)

    async def carry_suspend(self, kind: Kind, spec, child: dict) -> None:
        """The user's spec.suspend carried to the child's Workload (spec.active), the one place
        Kueue takes it from without a fight. A failure raises (the reconcile retries with backoff);
        called once the status is written, so that it never freezes the status."""
        workload, active = self._workload_of(kind, child), not getattr(spec, "suspend", False)
        if workload is None or (workload.get("spec") or {}).get("active", True) == active:
            return
        namespace, name = key_of(child)
        await self.kube.patch(WORKLOAD, namespace, key_of(workload)[1], {"spec": {"active": active}})
        log.info("%s %s/%s: Workload %s %s", kind.resource.kind, namespace, name, key_of(workload)[1],
                 "activated" if active else "deactivated (suspended)")
