"""Whether a child runs the rendering this operator would make of its parent's spec (the
RenderingCurrent condition), and the status of an object this operator refuses while its child,
rendered for the same generation by an earlier version, keeps running (render/stamp.py has the
rule). Pure."""

from __future__ import annotations

from ..render import raytoken, stamp as stamps
from ..render.names import SPEC_HASH_ANNOTATION
from ..api.phases import RENDERING_CURRENT, VALIDATED
from ..api.service import NO_UPGRADE
from .conditions import OLDER_RENDERING, REFUSED_BY_THIS_VERSION, condition, stamp

# What KubeRay leaves out of the cluster hash it compares a RayService's rayClusterConfig by, per
# KubeRay version (issue 59): a change anywhere else makes it start a whole second RayCluster, on
# TPU a second set of slices. Read from each version's source: utils/util.go
# GenerateHashWithoutReplicasAndWorkersToDelete (the same in 1.6.2 and 1.7.0), and from 1.7.0
# rayservice_controller.go's rayClusterSpecForHashing, which leaves out `suspend` too (Kueue's).
# Every version tested_versions.KUBERAY names is here (tests/unit/render/test_upgrade_diff.py).
_UNHASHED_1_6 = {
    "cluster": ("upgradeStrategy",),
    "group": ("replicas", "minReplicas", "maxReplicas"),
    "scaleStrategy": ("workersToDelete",),
    "pod": ("tolerations", "schedulingGates"),  # the head's and every worker group's
}
KUBERAY_UNHASHED = {
    "1.6.2": _UNHASHED_1_6,
    "1.7.0": {**_UNHASHED_1_6, "cluster": ("upgradeStrategy", "suspend")},
}


def kuberay_hashed(cluster: object, kuberay: str) -> object:
    """A rayClusterConfig without the fields KubeRay ``kuberay``'s hash leaves out (KUBERAY_UNHASHED)."""
    if not isinstance(cluster, dict):
        return cluster
    muted = KUBERAY_UNHASHED[kuberay]
    out = {k: v for k, v in cluster.items() if k not in muted["cluster"]}

    def group(g: object, fields: tuple[str, ...]) -> object:
        if not isinstance(g, dict):
            return g
        g = {k: v for k, v in g.items() if k not in fields}
        if isinstance(g.get("scaleStrategy"), dict):  # a Go struct: empty hashes as absent
            g["scaleStrategy"] = {k: v for k, v in g["scaleStrategy"].items() if k not in muted["scaleStrategy"]}
            if not g["scaleStrategy"]:
                del g["scaleStrategy"]
        template = g.get("template")
        if isinstance(template, dict) and isinstance(template.get("spec"), dict):
            g["template"] = {**template, "spec": {k: v for k, v in template["spec"].items()
                                                  if k not in muted["pod"]}}
        return g
    if "headGroupSpec" in out:
        out["headGroupSpec"] = group(out["headGroupSpec"], ())
    if isinstance(out.get("workerGroupSpecs"), list):
        out["workerGroupSpecs"] = [group(g, muted["group"]) for g in out["workerGroupSpecs"]]
    return out


def differences(old: object, new: object, path: str = "", exact: bool = True) -> list[str]:
    """The paths where ``new`` differs from ``old`` (a list is one value unless both have its
    length). ``exact`` False: a key only ``old`` has is no difference (what the API server or
    KubeRay added to a child made before the rule, which was never rendered)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = list(new) + [k for k in old if k not in new and exact]
        return [d for k in keys for d in differences(old.get(k), new.get(k), f"{path}.{k}" if path else str(k), exact)]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]", exact)]
    return [] if old == new else [path]


def changed_fields(found: stamps.Stamp | None, running: dict, fresh: dict) -> list[str]:
    """Where this operator's rendering ``fresh`` differs from the child's ``running`` one (both
    stamp.rendering()), our spec hash left out (it moves with every other difference). A child
    made before the rule is recorded as it was stored, with what KubeRay and the API server
    added: there only what this operator renders is compared."""
    def unhashed(rendered: dict) -> dict:
        annotations = {k: v for k, v in (rendered.get("annotations") or {}).items() if k != SPEC_HASH_ANNOTATION}
        return {**rendered, "annotations": annotations}
    hashes = [(r.get("annotations") or {}).get(SPEC_HASH_ANNOTATION) for r in (running, fresh)]
    if hashes[0] and hashes[0] == hashes[1]:
        return []  # the same hash: the same rendering (the walk below is the cost of every reconcile)
    exact = found is not None and found.version != stamps.UNKNOWN_VERSION and found.rendering is not None
    return differences(unhashed(running), unhashed(fresh), exact=exact)


def hashed_changes(old_cluster: object, new_cluster: object, kuberay: str) -> list[str]:
    """The paths of rayClusterConfig where ``new_cluster`` differs from ``old_cluster`` inside
    KubeRay ``kuberay``'s cluster hash."""
    return differences(kuberay_hashed(old_cluster, kuberay), kuberay_hashed(new_cluster, kuberay))


def new_cluster(old_spec: dict, new_spec: dict) -> bool:
    """Whether moving a RayService from ``old_spec`` to ``new_spec`` changes a field inside the
    cluster hash of any KubeRay version known here (KubeRay then starts a new RayCluster, on TPU a
    second set of slices)."""
    return any(hashed_changes(old_spec.get("rayClusterConfig"), new_spec.get("rayClusterConfig"), kuberay)
               for kuberay in KUBERAY_UNHASHED)


def token_secret_of_rerendered(child: dict, running: dict, fresh: dict) -> str | None:
    """The token Secret an existing RayService names once re-rendered (the user's edit, or a rerender
    request; ``running``: what it runs, stamp.running_rendering(); ``fresh``: this operator's
    rendering): the operator's name it has (named at its creation and kept for its life: its
    cluster holds that Secret's token), from the live child or else its record; for one made before
    services got one (its token KubeRay's own), a name of its own only when the re-render starts a
    new RayCluster anyway, for authOptions is inside KubeRay's cluster hash: naming a Secret on an
    edit KubeRay applies in place (spec.replicas, the serve config) would roll every slice of the
    service, and under upgradeStrategy None KubeRay starts none (its cluster keeps KubeRay's token,
    which the slice check would present the operator's to); else None."""
    meta = child.get("metadata") or {}
    for holder in (child, {"metadata": meta, "spec": running.get("spec") or {}}):
        name = raytoken.ray_token_secret_name(holder)
        if raytoken.is_ray_token_secret_of(holder, name):
            return name
    rolled = ((fresh.get("spec") or {}).get("upgradeStrategy") or {}).get("type") != NO_UPGRADE
    if rolled and new_cluster(running.get("spec") or {}, fresh.get("spec") or {}):
        return raytoken.later_ray_token_secret_name(child)
    return None


def name_token_secret(child: dict, running: dict, fresh_child: dict) -> str | None:
    """token_secret_of_rerendered, written into ``fresh_child`` (this operator's whole RayService, which
    renders no name) as well: what a re-render of ``child`` carries. The name, or None."""
    name = token_secret_of_rerendered(child, running, stamps.rendering(fresh_child))
    if name is not None:
        raytoken.with_ray_token_secret(fresh_child, name)
    return name


def _made_by(found: stamps.Stamp | None) -> str:
    version = found.version if found is not None else stamps.UNKNOWN_VERSION
    return "an operator before 0.3.0" if version == stamps.UNKNOWN_VERSION else f"tputorch-operator {version}"


def how_to_apply(kind: str, name: str, namespace: str) -> str:
    return (f"edit the spec, or `kubectl annotate {kind.lower()} {name} -n {namespace} "
            f"{stamps.RERENDER_ANNOTATION}=\"$(date +%s)\" --overwrite`, or `tputorch rerender {name} -n {namespace}`")


def rendering_condition(kind: str, child_kind: str, name: str, namespace: str, found: stamps.Stamp | None,
                        running: dict, fresh: dict, generation: int) -> dict | None:
    """RenderingCurrent=False (OlderRendering) when the child ``running`` (rendering() of what
    it has) differs from this operator's rendering ``fresh`` of the same spec, naming both
    versions and how to apply the new one; None when they agree (no condition: nothing to say)."""
    changed = changed_fields(found, running, fresh)
    if not changed:
        return None
    made_by = _made_by(found)
    if child_kind == "RayService":
        effect = (" (applying it makes KubeRay start a new RayCluster, a second set of TPU slices until it is ready)"
                  if new_cluster(running.get("spec") or {}, fresh.get("spec") or {})
                  else " (applied in place: no new RayCluster)")
        then = f"It is kept until the spec changes; to apply it now: {how_to_apply(kind, name, namespace)}"
    else:  # a job's running attempt is never re-rendered
        effect, then = "", "The running attempt keeps it; the job's next attempt gets this operator's rendering"
    message = (f"the {child_kind} runs the rendering of {made_by}; this operator "
               f"(tputorch-operator {stamps.OPERATOR_VERSION}) renders the spec differently{effect}: "
               f"{', '.join(changed[:5])}{f' and {len(changed) - 5} more' if len(changed) > 5 else ''}. {then}")
    return condition(RENDERING_CURRENT, False, OLDER_RENDERING, message, generation)


def with_condition(status: dict, cond: dict | None, previous: dict, now: str) -> dict:
    """``status`` with ``cond`` among its conditions (in place of one of its type; none: the
    type dropped), its lastTransitionTime kept from ``previous`` while its status holds."""
    kept = [c for c in status.get("conditions") or [] if c.get("type") != RENDERING_CURRENT]
    if cond is not None:
        kept += stamp([cond], previous, now)
    return {**status, "conditions": kept}


def keeps_running(parent: dict, found: stamps.Stamp | None) -> bool:
    """A refusal this operator adds applies to new generations only: whether the parent's child
    was rendered for its current generation (by any operator), so that it keeps running. A child
    without a stamp counts when the parent's status observed this generation without refusing it."""
    meta = parent.get("metadata") or {}
    if found is not None:
        return found.generation == meta.get("generation")
    status = parent.get("status") or {}
    refused = any(c.get("type") == VALIDATED and c.get("status") == "False"
                  for c in status.get("conditions") or [] if isinstance(c, dict))
    return status.get("observedGeneration") == meta.get("generation") and not refused


def refused_but_running(kind: str, child_kind: str, name: str, namespace: str, errors: list, found: stamps.Stamp | None,
                        generation: int, previous: dict, now: str) -> dict:
    """The status of an object this operator refuses while its child, rendered for this very
    generation by an earlier operator, keeps running: the previous status (the child's state is
    not derived without a spec) with a warning RenderingCurrent condition naming the refusal."""
    made_by = _made_by(found)
    message = (f"tputorch-operator {stamps.OPERATOR_VERSION} refuses this spec: " + "; ".join(str(e) for e in errors)
               + f". The {child_kind} {name} keeps running as {made_by} rendered it for generation {generation}; "
               f"a new generation of the spec is refused until this is corrected (its status is not followed meanwhile)")
    cond = condition(RENDERING_CURRENT, False, REFUSED_BY_THIS_VERSION, message, generation)
    return with_condition({k: v for k, v in previous.items()}, cond, previous, now)
