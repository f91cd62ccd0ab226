"""Observed RayJob / RayService (+ their pods) -> TPUTorchJob / TPUTorchService status, and the
events a status change deserves: the shared part in conditions.py, each kind's derive in job.py and
service.py. This module is the one name callers use for all of them.
"""

from .conditions import (  # noqa: F401  (re-exported)
    CLUSTER_LABEL, Event, POD_LABELS_READ, REPLICA_LABEL, ROLE_LABEL, TPU_RESOURCE,
    child_created, condition, events, finished, invalid, labels_of, patch_for, pods_forbidden, ready_hosts, ready_slices,
    scheduling_problem, stable_scheduler_message, stamp, without_times,
)
from .job import derive, rayjob_phase  # noqa: F401
from .service import derive_service, endpoint  # noqa: F401
