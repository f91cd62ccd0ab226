"""TPUTorchJob / TPUTorchService body -> validated JobSpec / ServiceSpec, or every error at once.

The rules live in common.py (the block both kinds share, read through reader.py), job.py and
service.py (each kind's own block); this module is the one name callers use for all of them. The
CRD (crd.py) repeats the subset that the API server can check at admission; the two are kept in
agreement by tests. No parser ever raises anything but ``InvalidSpec``, whatever it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .common import (  # noqa: F401  (re-exported)
    COMMON_FIELDS, DEFAULTS, DNS1035, DNS1123_SUBDOMAIN, ENV_SOURCES, FORBIDDEN_ENV, HEAD_FIELDS,
    LABEL_VALUE, MAX_PODS_DEFAULT, MAX_PODS_ENV, RAY_VERSION, RESERVED_ENV_PREFIX, RESOURCE_FIELDS, TPU_FIELDS, CommonSpec,
    Resources,
)
from .reader import INT32_MAX, MAX_STRING, FieldError, InvalidSpec  # noqa: F401
from .job import (  # noqa: F401
    JOB_KIND, MAX_ENTRYPOINT, MIN_RAY_VERSION, RAYJOB_NAME_MAX, SINGLE_SLICE_REASON, SPEC_FIELDS, JobSpec, parse,
)
from .service import (  # noqa: F401
    ENGINE_FIELD_ARGS, ENGINE_FIELDS, ENGINE_OWNED_ARGS, HF_TOKEN_ENV, MAX_CLUSTER_DELETION_DELAY_S, MAX_GRACEFUL_SHUTDOWN_S,
    MODEL_FIELDS, RAYSERVICE_NAME_MAX,
    REPLICA_FIELDS, SECRET_REF_FIELDS, SERVICE_DEFAULTS, SERVICE_ENV, SERVICE_KIND, SERVICE_MIN_RAY_VERSION,
    SERVE_FIELDS, SERVICE_SINGLE_SLICE_REASON, SERVICE_SPEC_FIELDS, SERVICE_TPU_FIELDS, UPGRADE_STRATEGIES, SERVE_ROUTINGS, MAX_INGRESS_REPLICAS, MAX_SCALE_TO_ZERO_DELAY_S, MAX_DOWNSCALE_DELAY_S,
    LORA_ENGINE_ARGS, LORA_FIELDS, LORA_PATH, LORA_RANKS, MAX_LORA_ADAPTERS, Lora, ServiceSpec,
    parse_service,
)

PARSERS: dict[str, Callable[[Any], Any]] = {JOB_KIND: parse, SERVICE_KIND: parse_service}


def parse_any(body: Any, max_pods: int = MAX_PODS_DEFAULT) -> JobSpec | ServiceSpec:
    """Parse a body of either kind, chosen by its ``kind``; ``max_pods`` bounds its pods."""
    kind = body.get("kind") if isinstance(body, Mapping) else None
    if not isinstance(kind, str) or kind not in PARSERS:
        raise InvalidSpec([FieldError("kind", kind, f"must be {' or '.join(PARSERS)}")])
    return PARSERS[kind](body, max_pods=max_pods)
