"""The typed reader every validation rule of both kinds goes through: FieldError and InvalidSpec (all
errors at once, never another exception), Reader (typed values out of a nested mapping), the
check builders (between, string), the free-form checks (freeform, strings_in, string_map), and the
generic bounds on every spec (MAX_*), which schema.bounded gives the CRD too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_STRING = 4096
INT32_MAX = 2**31 - 1  # KubeRay's int32 fields

# Bounds on every spec, so that no object can cost the operator (or etcd) more than a known amount.
# Both kinds and every field added later get them: schema.bounded gives each string, list and map of the
# schema that has no bound of its own MAX_STRING / MAX_ITEMS / MAX_PROPERTIES, and the parser checks
# free-form blocks with ``freeform`` and the typed ones field by field, with the same numbers.
MAX_ITEMS = 64
MAX_PROPERTIES = 64
MAX_DEPTH = 32  # levels of nesting within a free-form block (runtimeEnv, engine.args)
MAX_FREEFORM_BYTES = 32 * 1024  # a free-form block as JSON
MAX_ENV = 128
MAX_ENV_VALUE = 32 * 1024
MAX_TOLERATIONS = 32
MAX_REPLICAS = 64  # slices a service (or a group) may ask for; KubeRay's replica fields are int32


@dataclass(frozen=True)
class FieldError:
    path: str
    value: Any
    message: str

    def __str__(self) -> str:
        shown = "" if self.value is None else f"{_show(self.value)} "
        return f"{self.path}: {shown}{self.message}"


class InvalidSpec(ValueError):
    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))

    def compact(self) -> "InvalidSpec":
        """The same refusal (the same text) without the refused values: what the operator keeps of
        a refused object, which may be 1.4 MB of them."""
        return InvalidSpec([FieldError(e.path, None, f"{_show(e.value)} {e.message}" if e.value is not None else e.message)
                            for e in self.errors])


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:  # a value nested ~1,000 levels (the operator's decoder admits that many)
        text = f"<{type(value).__name__} nested too deeply to show>"
    return text if len(text) <= 80 else text[:77] + "..."


_MISSING = object()


class Reader:
    """Reads typed values out of a nested mapping, recording a FieldError per bad value."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def error(self, path: str, value: Any, message: str) -> None:
        self.errors.append(FieldError(path, value, message))

    def mapping(self, obj: Mapping, key: str, path: str, allowed: set[str] | None = None) -> dict:
        value = obj.get(key, _MISSING) if isinstance(obj, Mapping) else _MISSING
        if value is _MISSING or value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, value, "must be an object")
            return {}
        if allowed is not None:
            for unknown in sorted(set(map(str, value)) - allowed):
                self.error(f"{path}.{unknown}", value[unknown], f"is not a known field; known: {', '.join(sorted(allowed))}")
        return dict(value)

    def value(
        self,
        obj: Mapping,
        key: str,
        path: str,
        kind: type | tuple,
        *,
        required: bool = False,
        default: Any = None,
        check: Callable[[Any], str | None] | None = None,
    ) -> Any:
        value = obj.get(key, _MISSING)
        if value is _MISSING or value is None:
            if required:
                self.error(path, None, "is required")
            return default
        # bool is an int in Python; never accept it where a number is asked.
        wrong_bool = isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,))
        if wrong_bool or not isinstance(value, kind):
            self.error(path, value, f"must be {_type_name(kind)}")
            return default
        if check is not None:
            problem = check(value)
            if problem:
                self.error(path, value, problem)
                return default
        return value


def _type_name(kind: type | tuple) -> str:
    names = {str: "a string", int: "an integer", bool: "a boolean", list: "a list", dict: "an object"}
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def between(low: int, high: int | None = None) -> Callable[[int], str | None]:
    def check(v: int) -> str | None:
        if v < low or (high is not None and v > high):
            if high is None or (high == INT32_MAX and v < low):
                return f"must be at least {low}"
            return f"must be between {low} and {high}"
        return None

    return check


def string(max_len: int = MAX_STRING, pattern: re.Pattern | None = None, what: str = "") -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        if not v.strip():
            return "must not be empty"
        if len(v) > max_len:
            return f"must be at most {max_len} characters"
        if pattern is not None and not pattern.fullmatch(v):
            return f"must be {what}"
        return None

    return check


def string_map(r: Reader, obj: Mapping, key: str, path: str) -> dict[str, str]:
    raw = r.mapping(obj, key, path)
    result = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not isinstance(v, str):
            r.error(f"{path}.{k}", v, "must map strings to strings")
        else:
            result[k] = v
    return result


def freeform(r: Reader, value: Any, path: str, max_bytes: int = MAX_FREEFORM_BYTES) -> bool:
    """A free-form block (runtimeEnv, engine.args): JSON data nested at most MAX_DEPTH levels and
    at most ``max_bytes`` as JSON. Walked without recursion: the operator's decoder hands over
    objects up to 100 levels deep (controller/rest.decode)."""
    stack = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            r.error(path, None, f"must be nested at most {MAX_DEPTH} levels deep ({where} is deeper)")
            return False
        if isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    r.error(where, key, "keys must be strings")
                    return False
                stack.append((child, f"{where}.{key}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))
        elif not (item is None or isinstance(item, (str, int, float, bool))):
            r.error(where, item, "must be JSON data (string, number, boolean, null, list or object)")
            return False
    size = len(json.dumps(value, separators=(",", ":")))
    if size > max_bytes:
        r.error(path, None, f"must be at most {max_bytes} bytes as JSON; it is {size}")
        return False
    return True


def strings_in(value: Any, path: str):
    """(path, string) for every string in a free-form block, keys included (after freeform)."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            yield where, item
        elif isinstance(item, Mapping):
            for key, child in item.items():
                yield f"{where}.{key}", key
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
