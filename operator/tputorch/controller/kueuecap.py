"""Step: the installed Kueue's cap on pod sets per Workload, read from its Workload CRD (the store
``Stores.workload_crd`` keeps only the cap: stores.slim_workload_crd). The rule that turns the cap
into a refusal is api/groups.py's; this step only says what the cap is, and when it changed."""

from __future__ import annotations

import logging

from ..api.groups import KUEUE_SAFE_PODSETS, KueuePodSets, max_groups_under_kueue
from ..status import kueue
from .kind import PODSETS_MAX
from .stores import Stores

log = logging.getLogger("tputorch")


class KueueCap:
    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        # the cap last acted on (changed()); "unseen" until the first event, so that jobs refused
        # while the CRD was not listed yet are looked at again whatever it then says
        self.seen: KueuePodSets | None | str = "unseen"
        self.unread: str | None = None  # why the cap could not be read, as last logged

    def podsets(self) -> KueuePodSets | None:
        """The cap, from the Workload CRD's schema; None without that CRD (no Kueue: no cap). One
        that cannot be read (not listed yet, refused, no maxItems) is the smallest cap of the Kueue
        versions known, said in the log once per reason."""
        store = self.stores.workload_crd
        if store is None:
            return None
        if store.forbidden is not None:
            why = f"the operator may not read it: {store.forbidden}"
        elif not store.synced.is_set():
            why = f"not listed yet ({store.list_error or 'no answer'})"
        else:
            crd = store.get(("", kueue.WORKLOAD_CRD))
            if crd is None:
                return None
            if crd.get(PODSETS_MAX):
                return KueuePodSets(crd[PODSETS_MAX], "the installed Kueue's Workload CRD, spec.podSets maxItems")
            why = "its schema has no spec.podSets maxItems"
        if self.unread != why:
            self.unread = why
            log.warning("Kueue's Workload CRD %s could not be read (%s): queued TPUTorchJobs get the smallest cap of "
                        "the Kueue versions known, %d pod sets (%d spec.groups)", kueue.WORKLOAD_CRD, why,
                        KUEUE_SAFE_PODSETS, max_groups_under_kueue(KUEUE_SAFE_PODSETS))
        return KueuePodSets(KUEUE_SAFE_PODSETS, f"Kueue's Workload CRD could not be read, {why}: the smallest cap "
                            "of the Kueue versions known (0.17)")

    def changed(self) -> bool:
        """Whether the cap differs from the one last acted on (then it is the one acted on)."""
        cap = self.podsets()
        if cap == self.seen:
            return False
        self.seen = cap
        if cap is None:
            log.info("Kueue's Workload CRD %s not installed: no Kueue cap on spec.groups", kueue.WORKLOAD_CRD)
        else:
            log.info("Kueue's Workloads take at most %d pod sets (%s): a queued TPUTorchJob may have at most %d "
                     "spec.groups", cap.max_podsets, cap.source, max_groups_under_kueue(cap.max_podsets))
        return True
