"""Status writes across an upgrade (issue 59): every status the previous release's CRDs accept,
this release's accept too (an object the old operator wrote is never stranded by a tightened
rule), and every status this release's accept, the previous release's accept too, pruned only of
the fields added since (the new operator's writes pass while the cluster still has the old CRDs,
which Helm never upgrades).
Held as schemas: "accepts at least what the other accepts", node by node, over the status
subtree (types, enums, bounds, patterns, required fields, the fields a schema keeps rather than
prunes, CEL rules, list types); descriptions aside."""

import pytest
import yaml

import tputorch
from tputorch.api import crd

from ..previous import ROOT, show

NUMERIC_MAX = ("maxLength", "maxItems", "maxProperties", "maximum")
NUMERIC_MIN = ("minLength", "minItems", "minProperties", "minimum")
EXACT = ("type", "format", "pattern", "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "nullable",
         "x-kubernetes-int-or-string", "exclusiveMaximum", "exclusiveMinimum")


def tighter(old: dict, new: dict, path: str = "status") -> list[str]:
    """Where schema ``new`` refuses or prunes a value schema ``old`` accepts and keeps (empty: it
    accepts all of it)."""
    out = []
    for key in EXACT:
        if key in new and new.get(key) != old.get(key):
            out.append(f"{path}: {key} {old.get(key)!r} -> {new[key]!r}")
    if "enum" in new and not set(old.get("enum", [object()])) <= set(new["enum"]):
        out.append(f"{path}: enum {old.get('enum')} -> {new['enum']}")
    for key in NUMERIC_MAX:
        if key in new and not (key in old and old[key] <= new[key]):
            out.append(f"{path}: {key} {old.get(key)} -> {new[key]}")
    for key in NUMERIC_MIN:
        if key in new and not (key in old and old[key] >= new[key]):
            out.append(f"{path}: {key} {old.get(key)} -> {new[key]}")
    if not set(new.get("required", [])) <= set(old.get("required", [])):
        out.append(f"{path}: required {old.get('required')} -> {new['required']}")
    rules = {r.get("rule") for r in old.get("x-kubernetes-validations", [])}
    out += [f"{path}: CEL rule added: {r['rule']}" for r in new.get("x-kubernetes-validations", []) if r.get("rule") not in rules]
    if old.get("x-kubernetes-preserve-unknown-fields") and not new.get("x-kubernetes-preserve-unknown-fields"):
        out.append(f"{path}: unknown fields pruned")
    kept_anyway = new.get("x-kubernetes-preserve-unknown-fields")
    for name, sub in (old.get("properties") or {}).items():
        if name in (new.get("properties") or {}):
            out += tighter(sub, new["properties"][name], f"{path}.{name}")
        elif not kept_anyway and not isinstance(new.get("additionalProperties"), dict):
            out.append(f"{path}.{name}: pruned (no longer declared)")
    for key in ("items", "additionalProperties"):
        if isinstance(old.get(key), dict):
            if isinstance(new.get(key), dict):
                out += tighter(old[key], new[key], f"{path}.{key}" if key == "additionalProperties" else f"{path}[]")
            elif key == "additionalProperties" and not kept_anyway:
                out.append(f"{path}: additional properties pruned")
    return out


def schema_of(definition: dict, part: str) -> dict:
    """The CRD's schema of ``part`` ("spec" or "status") of its one version."""
    (version,) = definition["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"][part]


def previous_and_current():
    for kind, build in crd.BUILDERS.items():
        yield kind, schema_of(yaml.safe_load(show(f"crds/{crd.FILES[kind]}")), "status"), schema_of(build(), "status")


@pytest.mark.parametrize("kind", list(crd.BUILDERS))
def test_every_status_the_previous_release_wrote_passes_this_releases_schema(kind):
    ((_, old, new),) = [c for c in previous_and_current() if c[0] == kind]
    assert tighter(old, new) == []


# The status fields this release added that the previous release's CRDs prune: with those CRDs
# still installed the API server drops them from the operator's writes (the write passes) until the
# CRDs are applied. CHANGELOG.md's Upgrade section names each (test below).
PRUNED_BY_PREVIOUS = {
    # the goodput ledger (carried from the previous status: it restarts at each write without it),
    # a hang's time in the attempt history, the script's own timing in the progress
    crd.KIND: ["status.attemptHistory[].hungSince", "status.progress.timing", "status.goodput"],
    crd.SERVICE_KIND: [],
}


@pytest.mark.parametrize("kind", list(crd.BUILDERS))
def test_every_status_this_release_writes_passes_the_previous_releases_schema(kind):
    """Refused by none of its rules; pruned only of the fields this release added."""
    ((_, old, new),) = [c for c in previous_and_current() if c[0] == kind]
    found = tighter(new, old)
    assert [f for f in found if not f.endswith(": pruned (no longer declared)")] == []
    assert [f.split(":")[0] for f in found] == PRUNED_BY_PREVIOUS[kind]


def test_the_changelog_names_the_status_fields_the_previous_crds_prune():
    text = (ROOT / "CHANGELOG.md").read_text()
    entry = text.split(f"## [{tputorch.__version__}]", 1)[1].split("\n## [", 1)[0]
    upgrade = entry.split("### Upgrade", 1)[1].split("\n### ", 1)[0]
    for kind, fields in PRUNED_BY_PREVIOUS.items():
        for field in fields:
            assert f"`{field}`" in upgrade, field


def test_the_comparison_finds_what_would_strand_a_status():
    old = {"type": "object", "properties": {
        "phase": {"type": "string", "enum": ["Pending", "Running"]},
        "message": {"type": "string", "maxLength": 1024},
        "conditions": {"type": "array", "items": {"type": "object", "required": ["type"],
                                                   "properties": {"type": {"type": "string"}}}},
        "gone": {"type": "integer"}}}
    new = {"type": "object", "x-kubernetes-validations": [{"rule": "self.phase != 'Running'"}], "properties": {
        "phase": {"type": "string", "enum": ["Pending"]},
        "message": {"type": "string", "maxLength": 512},
        "conditions": {"type": "array", "items": {"type": "object", "required": ["type", "reason"],
                                                   "properties": {"type": {"type": "string", "minLength": 1}}}},
        "added": {"type": "string"}}}
    assert tighter(old, new) == [
        "status: CEL rule added: self.phase != 'Running'",
        "status.phase: enum ['Pending', 'Running'] -> ['Pending']",
        "status.message: maxLength 1024 -> 512",
        "status.conditions[]: required ['type'] -> ['type', 'reason']",
        "status.conditions[].type: minLength None -> 1",
        "status.gone: pruned (no longer declared)",
    ]
    assert tighter(new, old) == ["status.added: pruned (no longer declared)"]
    assert tighter(old, {**old, "description": "other words"}) == []


def served_defaults(new: dict, old: dict | None, path: str = "spec") -> list[str]:
    """The fields ``new`` defaults that ``old`` lacks and that the API server would serve on an
    object made under ``old``: a default is applied on read wherever its parent object is there,
    that is where the parent existed before or is itself defaulted."""
    out = []
    for name, child in (new.get("properties") or {}).items():
        before = (old.get("properties") or {}).get(name) if old is not None else None
        if before is None and "default" in child:
            out.append(f"{path}.{name}")
        if before is not None or "default" in child:
            out += served_defaults(child, before if before is not None else {}, f"{path}.{name}")
    return out


@pytest.mark.parametrize("kind", list(crd.BUILDERS))
def test_no_new_field_is_defaulted_onto_the_previous_releases_objects(kind):
    """A downgrade (helm rollback keeps the new CRDs) must touch nothing: the previous release's
    operator refuses a spec field it does not know, so a field added since may have no schema
    default where existing objects would be served it (its default lives in the parser)."""
    old = schema_of(yaml.safe_load(show(f"crds/{crd.FILES[kind]}")), "spec")
    assert served_defaults(schema_of(crd.BUILDERS[kind](), "spec"), old) == []


def test_served_defaults_finds_a_new_defaulted_field_under_an_existing_object():
    old = {"properties": {"retries": {"type": "object", "default": {}, "properties": {"a": {"default": 1}}}}}
    new = {"properties": {"retries": {"type": "object", "default": {}, "properties": {
        "a": {"default": 1}, "b": {"default": 1}}},
        "block": {"type": "object", "properties": {"c": {"default": 2}}},  # new, not defaulted: never served
        "made": {"type": "object", "default": {}, "properties": {"d": {"default": 3}}}}}
    assert served_defaults(new, old) == ["spec.retries.b", "spec.made", "spec.made.d"]
