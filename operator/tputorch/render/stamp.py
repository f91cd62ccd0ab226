"""The record a child (RayService, RayJob) carries of the rendering it was made with, and the rule
that an operator upgrade changes no running child.

KubeRay hashes a RayService's whole rayClusterConfig (but replicas, min/max and a few others) and
starts a complete second RayCluster, on TPU a second set of slices, on any other change. So a
child keeps the rendering it was made with until its parent's spec changes (a new
metadata.generation) or the user asks for the new rendering (the parent's RERENDER_ANNOTATION set
to a value the child has not recorded: ``kubectl annotate``, or ``tputorch rerender``). Putting
back an edit made behind the operator's back restores the child's own rendering, not the one
this operator would make. A child made before this rule has no stamp: what it has is its rendering.

The stamp lives in metadata.annotations, outside every hash KubeRay computes. Pure: no I/O."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from dataclasses import dataclass

from .. import __version__

OPERATOR_VERSION = __version__
VERSION_ANNOTATION = "tputorch.io/rendered-by"  # the operator version that rendered the child
GENERATION_ANNOTATION = "tputorch.io/rendered-for-generation"  # the parent's metadata.generation it renders
RENDERING_ANNOTATION = "tputorch.io/rendering"  # what the operator manages of the child (rendering())
# On the parent: a value the child has not recorded asks for this operator's rendering now. The
# child records the value it was last rendered at, so a value asks once.
RERENDER_ANNOTATION = "tputorch.io/rerender"
STAMP_ANNOTATIONS = (VERSION_ANNOTATION, GENERATION_ANNOTATION, RENDERING_ANNOTATION, RERENDER_ANNOTATION)
UNKNOWN_VERSION = "unknown"  # a child made before this rule: no operator said which version made it
_ENCODING = "gzip+base64:"  # a RayService renders to about 10 kB of JSON, 2 kB gzipped
# A child's annotations may total 256 KiB (the API server's limit): a rendering whose encoding would
# take more than half (a spec of large incompressible values) is not recorded.
MAX_RENDERING_CHARS = 128 * 1024

# What the reconcile does with an existing child of ours (decide()).
KEEP = "keep"  # its own rendering stays (and is restored where edited behind our back)
RERENDER = "rerender"  # this operator's rendering of the current spec, stamped anew
ADOPT = "adopt"  # made before this rule: stamped with what it has, its spec untouched


@dataclass(frozen=True)
class Stamp:
    version: str  # the operator's, or UNKNOWN_VERSION
    generation: int | None  # the parent's generation it was rendered for
    rerender: str  # the parent's RERENDER_ANNOTATION it was rendered at ("" when none)
    rendering: dict | None  # rendering() of what was rendered; None when not kept (a store's copy of a job's)


def rendering(child: dict, managed: tuple[str, ...] | None = None) -> dict:
    """What the operator manages of a child: its spec and its annotations but the stamp's, or only
    those ``managed`` (of a child it did not stamp, which others annotated too). The labels are
    metadata the parent's labels give, never patched."""
    annotations = ((child.get("metadata") or {}).get("annotations") or {})
    return {"annotations": {k: v for k, v in annotations.items()
                            if k not in STAMP_ANNOTATIONS and (managed is None or k in managed)},
            "spec": child.get("spec") or {}}


def encode(value: dict) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _ENCODING + base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()


def decode(text: str) -> dict | None:
    """The rendering an annotation holds; None when it is not one (edited by hand, cut)."""
    if not isinstance(text, str) or not text.startswith(_ENCODING):
        return None
    try:
        value = json.loads(gzip.decompress(base64.b64decode(text[len(_ENCODING):], validate=True)))
    except (binascii.Error, OSError, EOFError, ValueError):
        return None
    return value if isinstance(value, dict) and isinstance(value.get("spec"), dict) else None


def annotations(version: str, generation: int | None, rerender: str, rendered: dict) -> dict[str, str]:
    """The stamp as the child's annotations: ``rendered`` is rendering() of what it runs, left out
    when its encoding is over MAX_RENDERING_CHARS (the child then keeps what it has, unrecorded)."""
    stamp = {VERSION_ANNOTATION: version, GENERATION_ANNOTATION: str(generation if generation is not None else ""),
             RERENDER_ANNOTATION: rerender}
    encoded = encode(rendered)
    if len(encoded) <= MAX_RENDERING_CHARS:
        stamp[RENDERING_ANNOTATION] = encoded
    return stamp


def read(child: dict) -> Stamp | None:
    """The child's stamp; None for a child made before this rule (no version recorded)."""
    found = ((child.get("metadata") or {}).get("annotations") or {})
    version = found.get(VERSION_ANNOTATION)
    if not version:
        return None
    generation = found.get(GENERATION_ANNOTATION)
    rendered = found.get(RENDERING_ANNOTATION)
    return Stamp(version, int(generation) if str(generation or "").isdigit() else None,
                 found.get(RERENDER_ANNOTATION) or "", decode(rendered) if rendered is not None else None)


def requested(parent: dict) -> str:
    """The parent's request for the new rendering ("" when none)."""
    return str(((parent.get("metadata") or {}).get("annotations") or {}).get(RERENDER_ANNOTATION) or "")


def decide(parent: dict, stamp: Stamp | None) -> str:
    """KEEP, RERENDER or ADOPT for an existing child of ``parent`` carrying ``stamp``.

    A generation other than the stamped one re-renders (newer: the user's edit; older only for a
    parent restored from a backup, whose spec the child must follow too). A child without a stamp
    was rendered by an operator before this rule for the generation its parent's status last
    observed: a newer generation (edited while no operator ran) is the user's edit too."""
    meta = parent.get("metadata") or {}
    generation = meta.get("generation")
    asked = requested(parent)
    if stamp is None:
        observed = (parent.get("status") or {}).get("observedGeneration")
        edited = isinstance(observed, int) and isinstance(generation, int) and generation > observed
        return RERENDER if edited or asked else ADOPT
    if stamp.generation != generation or (asked and asked != stamp.rerender):
        return RERENDER
    return KEEP



def child_patch(parent: dict, child: dict, fresh, restore, managed: tuple[str, ...]) -> dict | None:
    """The merge patch an existing child of ``parent`` takes under the rule (None: none).

    ``fresh()``: this operator's rendering of the spec (the whole child); ``restore(desired)``: the
    merge patch that brings ``child`` to ``desired`` (a child: metadata.annotations and spec), or
    None when it has it; ``managed``: the annotations the operator writes on such a child, what a
    child without a stamp is recorded with beside its spec."""
    found = read(child)
    decision = decide(parent, found)
    generation = (parent.get("metadata") or {}).get("generation")
    if decision == RERENDER:
        desired = fresh()
        patch = restore(desired) or {}
        meta = patch.setdefault("metadata", {})
        # an earlier rendering too large to record must not stay recorded as this one
        meta["annotations"] = {**(meta.get("annotations") or {}), RENDERING_ANNOTATION: None,
                               **annotations(OPERATOR_VERSION, generation, requested(parent), rendering(desired))}
        return patch
    if decision == KEEP and found.rendering is not None:
        own = found.rendering
        return restore({"metadata": {"annotations": dict(own.get("annotations") or {})}, "spec": own["spec"]})
    # ADOPT, or a stamp whose rendering was lost (edited by hand): what it has is its rendering
    stamp = annotations(found.version if found is not None else UNKNOWN_VERSION,
                        generation if found is None else found.generation,
                        found.rerender if found is not None else "", rendering(child, managed))
    if found is not None and RENDERING_ANNOTATION not in stamp:
        return None  # stamped, its rendering too large to record: kept as it is, without drift correction
    return {"metadata": {"annotations": stamp}}


def own_rendering(parent: dict, child: dict | None, found: Stamp | None, fresh: dict, managed: tuple[str, ...]) -> dict:
    """The rendering (rendering()) ``child`` is to run under the rule: this operator's ``fresh``
    one when there is no child yet or it is to be re-rendered, else its own (stamped, or what a
    child without a stamp has of ``managed`` and its spec)."""
    if child is None or decide(parent, found) == RERENDER:
        return rendering(fresh)
    return running_rendering(child, found, managed)


def running_rendering(child: dict, found: Stamp | None, managed: tuple[str, ...]) -> dict:
    """What an existing child runs (rendering()): its stamped rendering (``found``), else what it
    has of ``managed`` and its spec (made before the rule, or its record lost)."""
    if found is not None and found.rendering is not None:
        return found.rendering
    return rendering(child, managed)
