"""Step: the extras every object's child gets besides itself. Its NetworkPolicy (``Extra``s: made
from the spec, owned by the object, put back when changed or deleted) and its Ray token Secret
(made once per RayJob or RayService). Their state: what this process created
and awaits the watch event of, and why an extra could not be written, per object."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from kubernetes.client.rest import ApiException

from ..render.raytoken import is_ray_token_secret_of, ray_token_secret, ray_token_secret_name
from .kind import Extra, Key, Kind, api_message, describe, owner_reference, ownership
from .raytoken import RayTokens
from .stores import Stores

log = logging.getLogger("tputorch")

EXPECT_FOR = 120.0  # an extra this process created counts as there until its watch event, at most this long
# A write that failed for a reason that may pass (a timeout, a 5xx, a throttle) is tried again after
# this long, whatever else happens to the object; a refusal (403, 422) waits for the next change.
RETRY_AFTER = 30.0


class ExtraChildren:
    def __init__(self, kube, stores: Stores, extras: list[Extra], requeue: Callable[[Key, float], None],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.kube, self.stores, self.extras = kube, stores, list(extras)
        self.requeue, self.monotonic = requeue, monotonic
        # (plural, namespace, name) -> when this process created it: not again before its watch event
        self.made: dict[tuple[str, str, str], float] = {}
        self.problems: dict[Key, tuple[str, str]] = {}  # why an extra child could not be written

    def keys(self) -> set[Key]:
        return set(self.problems)

    def forget(self, key: Key, uid: str | None) -> None:
        self.problems.pop(key, None)

    def network(self, key: Key, spec):
        """What the status derivation is given as ``network``: the first extra's state."""
        return next((e.status(spec, self.problems.get(key)) for e in self.extras if e.status), None)

    async def ensure(self, kind: Kind, key: Key, parent: dict, spec) -> None:
        """Each Extra exists, is ours and says what the spec renders. A failure is said in the status
        (problems) and tried again: the main child never waits for an extra, nor does the status."""
        namespace = key[1]
        for extra in self.extras:
            store = self.stores.extras[extra.resource.plural]
            refused = store.forbidden_in(namespace)
            if refused is not None:
                self.problems[key] = ("Forbidden", f"the operator may not {refused[0]} "
                                      f"{extra.resource.kind}s: {refused[1]}")
                continue
            if store.served is False:
                continue  # the informer reports it (the kind not served)
            desired = extra.render(spec)
            name = desired["metadata"]["name"]
            try:
                await self._ensure_one(kind, key, parent, desired, extra, store)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # an API error, a timeout, a reset connection: said, never the status's end
                log.warning("%s %s/%s not written: %s", extra.resource.kind, namespace, name, describe(err))
                self.problems[key] = (f"{extra.resource.kind}NotWritten",
                                      f"the {extra.resource.kind} {name} could not be written: "
                                      f"{api_message(err) or describe(err)}")
                if getattr(err, "status", None) not in (403, 422):
                    self.requeue(key, RETRY_AFTER)

    async def _ensure_one(self, kind: Kind, key: Key, parent: dict, desired: dict, extra: Extra, store) -> None:
        namespace, name = key[1], desired["metadata"]["name"]
        existing = store.get((namespace, name))
        made = (extra.resource.plural, namespace, name)
        if existing is not None:
            self.made.pop(made, None)  # the watch has it
        elif len(self.made) > 1000:  # bounded: forget what should have arrived long ago
            now_ = self.monotonic()
            self.made = {k: t for k, t in self.made.items() if now_ - t < EXPECT_FOR}
        try:
            if existing is None:
                if self.monotonic() - self.made.get(made, -EXPECT_FOR) < EXPECT_FOR:
                    return  # created just now; its watch event is on the way
                desired["metadata"]["namespace"] = namespace
                desired["metadata"]["ownerReferences"] = [owner_reference(kind, parent)]
                await self.kube.create(extra.resource, namespace, desired)
                self.made[made] = self.monotonic()
                # debug: made with every child, whose own create is logged (a line costs CPU in a burst)
                log.debug("%s %s/%s created", extra.resource.kind, namespace, name)
            elif ownership(kind, parent, existing) != "ours":
                self._taken(kind, extra, key, name)
                return
            elif existing.get("spec") != desired["spec"]:
                await self.kube.patch(extra.resource, namespace, name, {"spec": desired["spec"]})
                log.info("%s %s/%s patched", extra.resource.kind, namespace, name)
        except ApiException as err:
            if err.status != 409:
                raise
            # There already: ours arrives through the watch; someone else's (maybe without our
            # labels, so never in the store) is read to be told apart.
            found = await self.kube.get(extra.resource, namespace, name)
            if ownership(kind, parent, found) != "ours":
                self._taken(kind, extra, key, name)
            else:
                self.made[made] = self.monotonic()
            return
        self.problems.pop(key, None)

    def _taken(self, kind: Kind, extra: Extra, key: Key, name: str) -> None:
        self.problems[key] = (
            f"{extra.resource.kind}NameTaken",
            f"a {extra.resource.kind} named {name} already exists in {key[1]} and does not belong to this "
            f"{kind.resource.kind}: it is left alone and the operator's is not made; delete that {extra.resource.kind}")
        log.warning("%s %s/%s exists and is not %s's: left alone", extra.resource.kind, key[1], name, key[2])


class RayTokenSecrets:
    """The Secret with the token of a child's cluster (named on it when the child is made, owned by
    it). Its state: per object, the uid of the child whose Secret this process made or found."""

    def __init__(self, kube, ray_tokens: RayTokens) -> None:
        self.kube, self.ray_tokens = kube, ray_tokens
        self.made: dict[Key, str] = {}  # key -> uid of the child whose token Secret is there

    def keys(self) -> set[Key]:
        return set(self.made)

    def forget(self, key: Key, uid: str | None) -> None:
        self.made.pop(key, None)

    async def ensure(self, kind: Kind, key: Key, child: dict, just_created: bool = False) -> tuple[str, str] | None:
        """Made once per process per child: level-based, so a child whose Secret an earlier process
        never made (it died or was refused in between) gets it (and one deleted by hand, once its
        pods say so: child.py _token). Created only, as the operator may
        not read Secrets: a 409 is this child's own (the name is the child's alone, the token is
        derived, never random). The problem when refused: said in the status and tried again."""
        name, uid = ray_token_secret_name(child), child["metadata"].get("uid")
        if (not is_ray_token_secret_of(child, name) or self.made.get(key) == uid
                or child["metadata"].get("deletionTimestamp")):
            return None
        namespace = key[1]
        try:
            await self.kube.create_secret(namespace, ray_token_secret(child, self.ray_tokens.token(namespace, name)))
            # Right after its child's create (whose line says it comes next): debug, a line costs CPU in
            # a burst. For a child that existed without it (a process died or was refused before): info.
            log.log(logging.DEBUG if just_created else logging.INFO, "Secret %s/%s (the Ray token of %s %s) created",
                    namespace, name, kind.child.kind, key[2])
        except ApiException as err:
            if err.status != 409:
                detail = api_message(err) or f"HTTP {err.status} {err.reason}"
                problem = ("RayTokenSecretNotCreated", f"the Secret {name} with the Ray cluster's auth "
                           f"token could not be created (its pods wait for it): {detail}")
                log.warning("%s %s/%s: %s", kind.resource.kind, namespace, key[2], problem[1])
                return problem
        self.made[key] = uid  # replaces the entry of an earlier child of this key
        return None
