"""Step: the child (RayJob, RayService), made and owned: created with the object as its controller,
told apart from an earlier object's or someone else's by uid, patched as the spec says, its
labels put back; a job's next attempt's RayJob created only once every pod of the earlier one is
gone (status/attempts.py earlier_pods). Its state: the child just created while its watch event has not arrived
(client-go's expectations), the uids of children seen deleted, and why a child could not be made."""

from __future__ import annotations

import logging
import secrets
import time
from typing import Callable

from kubernetes.client.rest import ApiException

from .. import render
from ..render.names import MANAGED_BY_LABEL, RAYSERVICE_ANNOTATIONS
from ..render.raytoken import new_ray_token_secret_name, ray_token_secret_name, with_ray_token_secret
from ..render.service import rayservice_patch
from ..api.job import kueue_errors
from ..api.spec import InvalidSpec
from ..render import stamp as stamps
from ..status import CLUSTER_LABEL
from ..status import attempts as tries
from ..status.job import ATTEMPT_LABEL, attempt, child_must_go
from ..status.pods import secret_missing
from ..status.rendering import name_token_secret
from .extras import RayTokenSecrets
from .kind import Key, Kind, now, controller_of, create_problem, owner_reference, ownership, waiting_problem
from .stores import Stores
from .writes import StatusWrites

log = logging.getLogger("tputorch")


def rayjob_patch(job, rayjob: dict) -> dict | None:
    """What a live RayJob takes from the spec: every other field of a TPUTorchJob is immutable (CRD
    rules); suspend is the one a live RayJob takes."""
    if bool((rayjob.get("spec") or {}).get("suspend")) == job.suspend:
        return None
    return {"spec": {"suspend": job.suspend}}

# A child this operator created (or found to be its own after a 409) counts as existing until its
# watch event arrives, at most this long (client-go's expectations); the store itself is written by
# the informer alone, so a watch that never brings the child (it lost our label) cannot freeze it.
EXPECT_FOR = 120.0
TOMBSTONES_KEPT = 1000  # uids of children whose deletion was seen, so that no expectation revives one


def in_clusters(pods, kind: Kind, child: dict | None) -> list[dict]:
    """Those of ``pods`` that belong to one of the child's current RayClusters."""
    if child is None:
        return []
    clusters = kind.cluster_names(child)
    return [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(CLUSTER_LABEL) in clusters]


class ChildStep:
    def __init__(self, kube, stores: Stores, tokens: RayTokenSecrets, writes: StatusWrites,
                 kueue_manages: Callable[[dict], bool], monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], str] = now, requeue: Callable[[Key, float], None] = lambda key, delay: None) -> None:
        self.kube, self.stores, self.tokens, self.writes = kube, stores, tokens, writes
        self.kueue_manages, self.monotonic, self.clock, self.requeue = kueue_manages, monotonic, clock, requeue
        self.expected: dict[Key, tuple[dict, float]] = {}  # key -> (child just created, monotonic time)
        self.tombstones: dict[str, None] = {}  # uids of deleted children, oldest first
        self.problems: dict[Key, tuple[str, str]] = {}  # why a child could not be created

    def keys(self) -> set[Key]:
        return set(self.problems) | set(self.expected)

    def forget(self, key: Key, uid: str | None) -> None:
        self.problems.pop(key, None)
        self.expected.pop(key, None)

    # --- expectations -----------------------------------------------------------------------------

    def seen(self, key: Key, event: str, obj: dict) -> None:
        """The watch brought this child: what was expected of it is known now (or is gone)."""
        uid = (obj.get("metadata") or {}).get("uid")
        expected = self.expected.get(key)
        if expected is not None and (expected[0].get("metadata") or {}).get("uid") == uid:
            del self.expected[key]
        if event == "DELETED" and uid:
            self.tombstones[uid] = None
            while len(self.tombstones) > TOMBSTONES_KEPT:
                del self.tombstones[next(iter(self.tombstones))]

    def expect(self, key: Key, child: dict) -> None:
        uid = (child.get("metadata") or {}).get("uid")
        if uid and uid not in self.tombstones:  # its deletion may have been seen before its creation returned
            self.expected[key] = (self.stores.children[key[0]].slim(child), self.monotonic())

    def pods_of(self, kind: Kind, key: Key, child: dict | None) -> list[dict]:
        """The pods of the child's current clusters (not those of an earlier cluster being deleted)."""
        if child is None:
            return []
        return in_clusters(self.stores.pods.indexed((kind.label, key[1], key[2])), kind, child)

    def earlier_pods(self, kind: Kind, key: Key, parent: dict) -> tries.EarlierPods | None:
        """While the job has no RayJob, the pods labelled with its name are an earlier attempt's:
        whether the next attempt waits for them (status/attempts.py earlier_pods), counted from the
        previous attempt's recorded end."""
        if self.stores.pods is None:
            return None
        previous = self.writes.previous(parent)
        number = attempt(previous)
        ended = [a for a in previous.get("attemptHistory") or [] if isinstance(a, dict) and a.get("attempt") == number - 1]
        return tries.earlier_pods(self.stores.pods.indexed((kind.label, key[1], key[2])), number,
                                  ended[-1].get("endTime") if ended else None, self.clock())

    def of(self, key: Key, parent: dict) -> dict | None:
        """The child as the store holds it, else the one just created for this very object while
        its watch event has not arrived."""
        child = self.stores.children[key[0]].get(key[1:])
        if child is not None:
            return child
        expected = self.expected.get(key)
        if expected is None:
            return None
        owner = controller_of(expected[0]) or {}
        if self.monotonic() - expected[1] > EXPECT_FOR or owner.get("uid") != parent["metadata"].get("uid"):
            del self.expected[key]
            return None
        return expected[0]

    # --- the step, per kind -----------------------------------------------------------------------
    # Each returns (result, child), result one of 'retry', 'created', 'exists' (ours already: its
    # create answered 409), 'unchanged' or 'child-patched'. ``beside`` is called once the child is
    # rendered and about to be created (the reconcile starts the extras then, beside the create).

    async def ensure_rayjob(self, kind: Kind, key: Key, parent: dict, spec, cap=None,
                            beside: Callable[[], None] | None = None) -> tuple[str, dict | None]:
        """A job's RayJob, for its current attempt; the result may also be 'finished' (it ran, its
        child is gone) or 'ending' (the child of an attempt that has ended). ``cap``:
        the installed Kueue's pod-set cap (kueuecap.py), checked before a create only (a child
        that exists was admitted, or not, already); a refusal raises InvalidSpec. Its own Ray
        token Secret comes with it; its suspend is patched unless Kueue holds it."""
        child = self.of(key, parent)
        if child is None:
            if self.writes.terminal_of(kind, parent) is not None:
                return "finished", None  # it ran and its child is gone: making one would run it again
            errors = kueue_errors(spec, cap) if cap is not None else []
            if errors:
                raise InvalidSpec(errors)
            waiting = self.earlier_pods(kind, key, parent)
            if waiting is not None:  # attempts never overlap: each pod's deletion brings the key back
                self.problems[key] = (waiting.reason, waiting.message)
                if waiting.recheck_s is not None:  # the deadline comes with no event of its own
                    self.requeue(key, waiting.recheck_s + 1)
                return "waiting", None

            def desired() -> dict:
                number = attempt(self.writes.previous(parent))
                # from attempt 2 on, when it starts: what tells an earlier attempt's late checkpoint (train.py)
                rayjob = render.rayjob(spec, number, self.clock() if number > 1 else None)
                rayjob["metadata"].setdefault("labels", {})[ATTEMPT_LABEL] = str(number)
                return rayjob
            return await self._create_with_token(kind, key, parent, spec, desired, beside)
        if not self._owned(kind, key, parent, child) or not await self._token(kind, key, child):
            return "retry", child
        if child_must_go(self.writes.previous(parent), child):
            return "ending", child
        if self.kueue_manages(child):  # its only patch is suspend, Kueue's then (carried to its Workload)
            return "unchanged", child
        return await self._patch(kind, key, rayjob_patch(spec, child)), child

    async def ensure_rayservice(self, kind: Kind, key: Key, parent: dict, spec, fresh: dict,
                                beside: Callable[[], None] | None = None) -> tuple[str, dict | None]:
        """A service's RayService: every field of the spec is applied to the live RayService
        (KubeRay upgrades it without downtime). ``fresh``: the RayService ``spec`` renders (rendered,
        and refused when too large, whatever the child keeps). Its own Ray token Secret comes with
        it, named when it is created and kept for its life (render/raytoken.py)."""
        child = self.of(key, parent)
        if child is None:
            return await self._create_with_token(kind, key, parent, spec, lambda: fresh, beside)
        if not self._owned(kind, key, parent, child) or not await self._token(kind, key, child):
            return "retry", child
        named: list[str] = []

        def rerendered() -> dict:
            """The spec's rendering with the token Secret the child names (status/rendering.py)."""
            running = stamps.running_rendering(child, stamps.read(child), RAYSERVICE_ANNOTATIONS)
            if (name := name_token_secret(child, running, fresh)) is not None:
                named.append(name)
            return fresh
        # An operator upgrade changes no running RayService: it keeps its own rendering (restored
        # where edited) until the spec changes or the user asks for this operator's (render/stamp.py).
        patch = stamps.child_patch(parent, child, rerendered, lambda desired: rayservice_patch(spec, child, desired),
                                   RAYSERVICE_ANNOTATIONS)
        result = await self._patch(kind, key, patch)
        if result == "child-patched" and named and named[0] != ray_token_secret_name(child):
            # a RayService made before services got a token Secret, named one by this edit: its
            # Secret now, before the new RayCluster's pods wait for it
            cluster = child["spec"]["rayClusterConfig"]
            patched = {**child, "spec": {**child["spec"], "rayClusterConfig": {**cluster}}}
            with_ray_token_secret(patched, named[0])
            if not await self._token(kind, key, patched):
                return "retry", child
        return result, child

    def _owned(self, kind: Kind, key: Key, parent: dict, child: dict) -> bool:
        owned = ownership(kind, parent, child)
        if owned != "ours":
            self.problems[key] = waiting_problem(kind, key[1], key[2], owned)
            # 'previous': its deletion event brings the key back; 'foreign' may carry no label of
            # ours (invisible to the watch): look again with backoff either way.
            return False
        self.problems.pop(key, None)
        return True

    async def _patch(self, kind: Kind, key: Key, patch: dict | None) -> str:
        if patch is None:
            return "unchanged"
        await self.kube.patch(kind.child, key[1], key[2], patch)
        log.info("%s %s/%s patched: %s", kind.child.kind, key[1], key[2], sorted(patch.get("spec") or patch))
        return "child-patched"

    async def _token(self, kind: Kind, key: Key, child: dict, just_created: bool = False) -> bool:
        if self.stores.pods is not None and secret_missing(self.pods_of(kind, key, child), ray_token_secret_name(child)):
            # made once per process, as the operator may not read Secrets: its pods say it is gone
            # (deleted by hand), so it is made again (its token the current key's)
            self.tokens.forget(key, None)
        problem = await self.tokens.ensure(kind, key, child, just_created)
        if problem is not None:
            self.problems[key] = problem
            return False
        self.problems.pop(key, None)
        return True

    async def _create_with_token(self, kind: Kind, key: Key, parent: dict, spec, render_child: Callable[[], dict],
                                 beside: Callable[[], None] | None) -> tuple[str, dict | None]:
        """_create() of the child ``render_child()`` renders, named a token Secret of its own (a name of
        this child's alone: never one a deleted child still holds), then that Secret."""
        def named() -> dict:
            child = render_child()
            with_ray_token_secret(child, new_ray_token_secret_name(key[2], secrets.token_hex(3)))
            return child
        result, child = await self._create(kind, key, parent, spec, named, beside, "; its Ray token Secret next")
        if result in ("created", "exists") and not await self._token(kind, key, child, result == "created"):
            return "retry", child
        return result, child

    async def _create(self, kind: Kind, key: Key, parent: dict, spec, render_child: Callable[[], dict],
                      beside: Callable[[], None] | None = None, then: str = "") -> tuple[str, dict | None]:
        """Create what ``render_child()`` renders as the object's child: 'created', 'exists' (ours
        already: a late watch event), or 'retry' (refused, or the name is another's). ``then``
        ends the log line of a create."""
        namespace, name = key[1], key[2]
        refused = self.stores.children[key[0]].forbidden_in(namespace)  # this namespace's, not another's
        if refused is not None:
            self.problems[key] = ("Forbidden", f"the operator may not {refused[0]} {kind.child.kind}s: {refused[1]}")
            return "retry", None
        desired = render_child()
        # the record of its rendering: what it keeps through operator upgrades (render/stamp.py)
        desired["metadata"]["annotations"] = {**(desired["metadata"].get("annotations") or {}), **stamps.annotations(
            stamps.OPERATOR_VERSION, parent["metadata"].get("generation"), stamps.requested(parent),
            stamps.rendering(desired))}
        desired["metadata"]["namespace"] = namespace  # the object's own, whatever its body says
        desired["metadata"]["ownerReferences"] = [owner_reference(kind, parent)]
        if beside is not None:
            beside()
        try:
            created = await self.kube.create(kind.child, namespace, desired)
        except ApiException as err:
            if err.status != 409:
                self.problems[key] = create_problem(kind, err)
                log.warning("%s %s/%s not created: %s", kind.child.kind, namespace, name, self.problems[key][1])
                return "retry", None
            # There already: ours with a late watch event, an earlier object's, or someone else's
            # (which may carry no label of ours, so never reach the store: look again with backoff).
            existing = await self.kube.get(kind.child, namespace, name)
            owned = ownership(kind, parent, existing)
            if owned != "ours":
                self.problems[key] = waiting_problem(kind, namespace, name, owned)
                return "retry", existing
            self.problems.pop(key, None)
            await self._relabel(kind, key, desired, existing)
            self.expect(key, existing)
            return "exists", existing
        except Exception as err:
            self.problems[key] = create_problem(kind, err)
            raise
        self.problems.pop(key, None)
        self.expect(key, created)
        log.info("%s %s/%s created (%s %s slice, %d hosts)%s", kind.child.kind, namespace, name,
                 spec.slice.generation.name, spec.slice.topology, spec.slice.hosts, then)
        return "created", created

    async def _relabel(self, kind: Kind, key: Key, desired: dict, child: dict) -> None:
        """Our own child without the labels our watch selects on (someone removed them): put them
        back, or the operator would never see it change again."""
        wanted = {k: v for k, v in (desired["metadata"].get("labels") or {}).items()
                  if k in (MANAGED_BY_LABEL, kind.label)}
        labels = (child.get("metadata") or {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in wanted.items()):
            return
        await self.kube.patch(kind.child, key[1], key[2], {"metadata": {"labels": wanted}})
        log.info("%s %s/%s: its labels %s put back", kind.child.kind, key[1], key[2], sorted(wanted))
