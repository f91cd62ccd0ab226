"""Step: the spec, parsed once per version of the object, and the child it renders, rendered once
per version (its state: the parse cache and the rendered children, by uid)."""

from __future__ import annotations

import json
from typing import Callable

from ..api.spec import InvalidSpec
from .kind import REFUSED, Kind


def version(meta: dict) -> tuple:
    """metadata.generation moves on every spec change; labels are metadata, so they are part of it."""
    return (meta.get("generation"), tuple(sorted((meta.get("labels") or {}).items())))


class Specs:
    def __init__(self) -> None:
        self.parsed: dict[str, tuple] = {}  # uid -> (spec version, spec or InvalidSpec)
        self.rendered: dict[str, tuple] = {}  # uid -> (spec, the child it renders as JSON text)

    def parse(self, kind: Kind, parent: dict, namespace: str, cap=None):
        """The spec, parsed once per version of it: every status write and child change reconciles
        again. A refusal raises InvalidSpec (kept without the refused values). ``cap``: the Kueue
        cap a kind with a kueue_check is checked with; kept with the version, so that a Kueue
        upgrade may admit what was refused (child.ChildStep.ensure)."""
        meta = parent["metadata"]
        cached = self.parsed.get(meta.get("uid"))
        if cached is None or cached[0] != (version(meta), cap):
            try:
                if isinstance(parent.get(REFUSED), InvalidSpec):  # refused as stored (stores.parent_slimmer)
                    raise parent[REFUSED]
                cached = ((version(meta), cap), kind.parse({**parent, "metadata": {**meta, "namespace": namespace}}))
            except InvalidSpec as err:
                cached = ((version(meta), cap), err.compact())
            self.parsed[meta.get("uid")] = cached
        if isinstance(cached[1], InvalidSpec):
            raise cached[1]
        return cached[1]

    def child(self, meta: dict, spec, render: Callable[[object], dict]) -> dict:
        """The child ``spec`` renders (``render``), rendered once per version of it: a service's
        reconcile reads its RayService twice (the patch its live one takes, the spec hash its
        status compares), and parse() keeps one spec object per version. As JSON text: every
        caller gets a copy of its own. A refusal (InvalidSpec: too large) is raised, not kept."""
        uid = meta.get("uid")
        cached = self.rendered.get(uid)
        if cached is None or cached[0] is not spec:
            cached = (spec, json.dumps(render(spec)))
            self.rendered[uid] = cached
        return json.loads(cached[1])

    def refused(self, meta: dict, err: InvalidSpec, cap=None) -> None:
        """The child this version renders was refused (too large to be created, or more than the
        installed Kueue admits, ``cap``): the spec is too."""
        self.parsed[meta.get("uid")] = ((version(meta), cap), err.compact())

    def keys(self) -> set:
        return set()  # kept by uid: dropped through forget

    def forget(self, key, uid: str | None) -> None:
        self.parsed.pop(uid, None)
        self.rendered.pop(uid, None)
