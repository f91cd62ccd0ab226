"""Observed RayJob / RayService (+ their pods) -> TPUTorchJob / TPUTorchService status, and the
events a status change deserves. Each kind's derivation (job.py, service.py) runs in stages: what
its pods say (pods.py) and its child says, the conditions every object starts with (leading.py),
its own conditions, its phase, its message; what both share about conditions is conditions.py's.
This module is the one name callers use for all of them.
"""

from .conditions import (  # noqa: F401  (re-exported)
    Event, child_created, condition, events, finished, invalid, patch_for, stamp, without_times,
)
from .pods import (  # noqa: F401  (re-exported)
    CLUSTER_LABEL, POD_LABELS_READ, REPLICA_LABEL, ROLE_LABEL, TPU_RESOURCE, labels_of, pods_forbidden, ready_hosts,
    ready_slices, scheduling_problem, stable_scheduler_message,
)
from .job import derive, rayjob_phase  # noqa: F401
from .service import derive_service, endpoint  # noqa: F401
