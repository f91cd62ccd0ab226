"""Reading the user's YAML files safely: only what JSON (and so the API server) can hold.

PyYAML's safe loader still builds Python types the API never sees (datetime for an unquoted date,
set for !!set, bytes for !!binary), takes any key type, recurses once per level of nesting, and
hands back the shared objects of an alias "bomb" whose expansion is exponential: walking one hung
the CLI. Here a timestamp stays the string it is written as (as kubectl sends it), other tags are
refused, and the result is checked with a budget: string keys, finite numbers, bounded depth and
size, each refusal naming where it is.
"""

from __future__ import annotations

import math
import sys
from typing import IO

import yaml

MAX_DEPTH = 100  # levels of nesting in a document (the operator's own decoder keeps as many)
MAX_NODES = 200_000  # values in a document, aliases counted as often as they are used
# A file of specs, at most: the API server stores an object of at most 1.5 MiB, and a larger file
# takes the YAML parser tens of seconds (20 MB: over 40 s) before any rule is checked.
MAX_FILE_BYTES = 1024 * 1024


class YAMLFileError(ValueError):
    """A document the CLI will not read; the message says where and why."""


class _Loader(yaml.SafeLoader):
    """SafeLoader without timestamps (they stay strings) and without Python-only types."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _refuse(loader: yaml.SafeLoader, node: yaml.Node):
    raise yaml.constructor.ConstructorError(
        None, None, f"tag {node.tag} is not allowed: a Kubernetes object holds only strings, numbers, "
        "booleans, null, lists and maps", node.start_mark)


for _tag in ("binary", "timestamp", "omap", "pairs", "set"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse)
_Loader.add_constructor(None, _refuse)  # any tag of no known type (!python/..., !custom)


def _check(doc: object, where: str) -> None:
    """Walk ``doc`` without recursion, with a budget of nodes (an alias bomb runs out of it)."""
    stack = [(doc, where, 0)]
    nodes = 0
    while stack:
        value, path, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise YAMLFileError(f"{where}: more than {MAX_NODES} values (aliases counted where they are used)")
        if depth > MAX_DEPTH:
            raise YAMLFileError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise YAMLFileError(f"{path}: key {key!r} must be a string (quote it)")
                stack.append((item, f"{path}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise YAMLFileError(f"{path}: {value} is not a number JSON can hold")


def load_documents(stream: IO[str] | str, name: str = "") -> list:
    """Every non-empty document of a YAML stream, each checked; YAMLFileError otherwise."""
    try:
        docs = [doc for doc in yaml.load_all(stream, Loader=_Loader) if doc is not None]
    except RecursionError:
        raise YAMLFileError(f"{name or 'the file'}: nested too deeply to read") from None
    except yaml.YAMLError as err:
        raise YAMLFileError(f"{name or 'the file'}: {err}") from None
    for i, doc in enumerate(docs):
        _check(doc, f"document {i + 1}" if len(docs) > 1 else "document")
    return docs


def read_documents(path: str) -> list:
    """The documents of a file ('-' for stdin): at most MAX_FILE_BYTES of UTF-8 holding at least one
    document; YAMLFileError (or OSError, from opening it) otherwise, each naming the file."""
    if path == "-":
        stdin = getattr(sys.stdin, "buffer", None)  # a text stream of no bytes underneath (tests)
        data = stdin.read(MAX_FILE_BYTES + 1) if stdin else sys.stdin.read(MAX_FILE_BYTES + 1).encode()
    else:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise YAMLFileError(f"{path}: larger than {MAX_FILE_BYTES // 1024} KiB (1 MiB), the most a spec file may be")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise YAMLFileError(f"{path}: not UTF-8 text (byte {err.start} is {data[err.start:err.start + 1]!r}); "
                            "save it as UTF-8") from None
    docs = load_documents(text, path)
    if not docs:
        raise YAMLFileError(f"{path}: holds no YAML document (the file is empty or only comments)")
    return docs
