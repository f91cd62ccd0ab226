"""A child as text and back: the templates' Jinja environment, the size a rendered child may take,
the spec hash, and the YAML `tputorch render` prints."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

import jinja2
import yaml

from ..api.spec import FieldError, InvalidSpec

# etcd keeps objects up to 1.5 MiB; a child also gets KubeRay's status and managedFields, so its spec
# as rendered must leave room for them. Over this it could never be created: refused as invalid.
MAX_CHILD_BYTES = 1024 * 1024


@lru_cache(maxsize=None)
def template(name: str) -> jinja2.Template:
    return _environment().get_template(name)


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tputorch.render", "templates"),
        undefined=jinja2.StrictUndefined,  # a missing value is a bug, never an empty string
        autoescape=False,
        auto_reload=False,  # templates ship with the package: no stat() of the macro file per render
        keep_trailing_newline=True,
    )
    # Plain JSON for tojson: Jinja's default also HTML-escapes <>&' (useless here, the output is
    # parsed by json.loads at once) and was half of the rendering time.
    env.filters["tojson"] = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode
    return env


def spec_hash(child_spec: dict) -> str:
    """A short stable hash of a rendered child's spec: equal specs, equal hashes."""
    text = json.dumps(child_spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def loaded(text: str, kind: str) -> dict:
    """The rendered child, refused (InvalidSpec) when it is larger than MAX_CHILD_BYTES."""
    size = len(text.encode())
    if size > MAX_CHILD_BYTES:
        raise InvalidSpec([FieldError(
            "spec", None, f"renders a {kind} of {size} bytes, over the {MAX_CHILD_BYTES} bytes a child may take "
            f"(Kubernetes stores objects up to 1.5 MiB): shorten spec.env, spec.runtimeEnv or the other large fields")])
    return json.loads(text)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (serveConfigV2, runtimeEnvYAML) as literal blocks: readable YAML inside YAML."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    block = "\n" in value and not any(line != line.rstrip() for line in value.split("\n"))
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


_Dumper.add_representer(str, _str)


def to_yaml(obj: dict) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
