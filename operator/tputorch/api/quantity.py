"""Kubernetes quantities ("500m", "16Gi", "1.5"): whether a value is one, its number, and a number of
bytes written as one. The spec's resource and storage rules (common.py, storage.py) and the doctor's
comparisons read quantities through these, so that all of them agree with the API server.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(v: Any) -> str | None:
    return None if QUANTITY.fullmatch(str(v)) else "must be a Kubernetes quantity such as 4, 500m, 16Gi"


# [.] rather than an escaped dot: the same pattern goes into a CEL string literal (common.resource_schema).
ZERO_QUANTITY = re.compile(r"^0+([.]0+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def positive_quantity(v: Any) -> str | None:
    problem = quantity(v) if len(str(v)) <= 64 else "must be at most 64 characters"
    if problem is None and ZERO_QUANTITY.fullmatch(str(v)):
        return "must be greater than zero (a pod with none could never run Ray)"
    return problem


# A pod's memory: a bare number is bytes, so "1.5" or "8" would give a Ray node a few bytes, which
# the API server accepts and the kernel kills at once. Below this no Ray node starts.
MIN_MEMORY = "256Mi"
MIN_MEMORY_MESSAGE = f"must be at least {MIN_MEMORY} (a number without a unit is bytes; Ray's processes need more)"


QUANTITY_SUFFIXES = {"": 1, "m": Decimal("0.001"), **{s: 1000 ** (i + 1) for i, s in enumerate("kMGTPE")},
                     **{f"{s}i": 1024 ** (i + 1) for i, s in enumerate("KMGTPE")}}


def quantity_value(v: Any) -> Decimal:
    """A quantity that matches QUANTITY, as a number (bytes for memory)."""
    text = str(v)
    digits = text.rstrip("kKMGTPEmi")  # K only before i (Ki)
    return Decimal(digits) * QUANTITY_SUFFIXES[text[len(digits):]]


BINARY_SUFFIXES = ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki")


def bytes_quantity(n: Decimal | int) -> str:
    """A number of bytes as a quantity: whole bytes (rounded up), in the largest binary unit that
    holds it exactly (214748364800 -> 200Gi), else plain bytes."""
    whole = math.ceil(Decimal(n))
    for i, suffix in enumerate(BINARY_SUFFIXES):
        unit = 1024 ** (len(BINARY_SUFFIXES) - i)
        if whole and whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)


def memory_quantity(v: Any) -> str | None:
    problem = positive_quantity(v)
    if problem is None and quantity_value(v) < quantity_value(MIN_MEMORY):
        return MIN_MEMORY_MESSAGE
    return problem
