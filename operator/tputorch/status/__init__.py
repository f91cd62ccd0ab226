"""Observed RayJob / RayService (+ their pods) -> TPUTorchJob / TPUTorchService status, and the
events a status change deserves: the shared part in conditions.py, each kind's derive in job.py and
service.py. This module is the one name callers use for all of them.
"""

from .conditions import (  # noqa: F401  (re-exported)
    CLUSTER_LABEL, CONDITION_TYPES, Event, FAILED, MAX_CONDITION_MESSAGE, POD_LABELS_READ,
    RAYJOB_CREATED, RAYSERVICE_CREATED, READY, REPLICA_LABEL, ROLE_LABEL, SERVICE_CONDITION_TYPES,
    SERVICE_PHASES, SERVICE_STATUS_FIELDS, SLICE_READY, STATUS_FIELDS, SUCCEEDED, TERMINAL_PHASES, TPU_RESOURCE, VALIDATED,
    child_created, condition, events, finished, invalid, labels_of, patch_for, pods_forbidden, ready_hosts, ready_slices,
    scheduling_problem, stable_scheduler_message, stamp, without_times,
)
from .job import PHASES as JOB_PHASES, derive, rayjob_phase  # noqa: F401
from .service import derive_service, endpoint  # noqa: F401
