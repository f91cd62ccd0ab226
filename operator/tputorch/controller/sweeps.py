"""Step: the sweeps. What the steps keep per object is dropped when the object is gone: at its
reconcile (gone, or deleted and made again under its name) and after every re-list, for the
objects whose deletion was missed while not watching. Its state: the uid each key was last
reconciled as."""

from __future__ import annotations

from typing import Iterable, Protocol

from .kind import Key
from .stores import Stores


class Step(Protocol):
    def keys(self) -> set[Key]: ...  # the objects it keeps state for by key (by uid: none)

    def forget(self, key: Key, uid: str | None) -> None: ...


class Sweeps:
    def __init__(self, stores: Stores, steps: Iterable[Step], queue, recorder) -> None:
        self.stores, self.steps, self.queue, self.recorder = stores, list(steps), queue, recorder
        self.uids: dict[Key, str] = {}  # key -> uid, to drop its state when the object is gone

    def track(self, key: Key, uid: str | None) -> None:
        """The object this key names now; nothing of an earlier one of the same name holds."""
        if self.uids.get(key) not in (None, uid):
            self.forget(key)
        self.uids[key] = uid

    def sweep(self) -> None:
        """Drop what is kept for objects that no longer exist (a deletion missed while not watching)."""
        existing = {(kind, *k) for kind, informer in self.stores.parents.items() for k in informer.keys()}
        known = set(self.uids) | self.queue.known()
        for step in self.steps:
            known |= step.keys()
        for key in known - existing:
            self.forget(key)

    def forget(self, key: Key) -> None:
        uid = self.uids.pop(key, None)
        for step in self.steps:
            step.forget(key, uid)
        if uid is not None:
            self.recorder.forget(uid)
        self.queue.drop(key)
