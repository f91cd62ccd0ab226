"""The words a TPUTorchJob's and a TPUTorchService's status are written in: each kind's phases, its
condition types in the order they are written, the status fields it has, and the cap on a
condition's message.

They are the API's, as KubeRay keeps its deployment statuses and condition types with its API
types: status_schema.py builds the CRDs' status enums from them, status/ derives into them, and the
controller and CLI read them. Which reason a condition carries is status/'s decision, not here.
"""

from __future__ import annotations

# Condition types, in the order they are written.
VALIDATED = "Validated"
RAYJOB_CREATED = "RayJobCreated"
SLICE_READY = "SliceReady"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
ADMITTED = "Admitted"  # Kueue admitted the child (only for objects with spec.queueName)
NETWORK_POLICY_READY = "NetworkPolicyReady"  # its NetworkPolicy was made as rendered (with policies on)
RAY_AUTH = "RayAuth"  # the child, as stored, still asks KubeRay for Ray token auth (status/auth.py)
# Present only when the child runs another rendering than this operator would make of its spec (an
# earlier operator's, kept: render/stamp.py), or a spec this operator refuses (status/rendering.py).
RENDERING_CURRENT = "RenderingCurrent"
# Present only when a group of the job switches Ray's per-worker chip isolation off (api/groups.py).
CHIP_ISOLATION = "ChipIsolation"
# False when the spec reaches Cloud Storage as the namespace's default ServiceAccount (api/identity.py)
STORAGE_IDENTITY = "StorageIdentity"
# Present only for a job with spec.hangDetection: whether the hang sentinel watches its steps (status/hang.py).
HANG_SENTINEL = "HangSentinel"
CONDITION_TYPES = (VALIDATED, RAYJOB_CREATED, RAY_AUTH, ADMITTED, NETWORK_POLICY_READY, STORAGE_IDENTITY, SLICE_READY, SUCCEEDED,
                   FAILED, RENDERING_CURRENT, CHIP_ISOLATION, HANG_SENTINEL)
RAYSERVICE_CREATED = "RayServiceCreated"
READY = "Ready"
SPEC_APPLIED = "SpecApplied"  # the serving RayCluster runs the service's current spec (status/applied.py)
# Present only on a multi-host service once Ray's state was read: each LLM replica's placement group
# is on one whole slice (status/slices.py).
REPLICAS_ON_WHOLE_SLICES = "ReplicasOnWholeSlices"
SERVICE_CONDITION_TYPES = (VALIDATED, RAYSERVICE_CREATED, RAY_AUTH, ADMITTED, NETWORK_POLICY_READY, STORAGE_IDENTITY, SLICE_READY,
                           REPLICAS_ON_WHOLE_SLICES, READY, SPEC_APPLIED, FAILED, RENDERING_CURRENT)

QUEUED, PREEMPTED = "Queued", "Preempted"  # phases while Kueue holds the child back (status/kueue.py)
QUEUE_PHASES = (QUEUED, PREEMPTED)
TERMINAL_PHASES = ("Succeeded", "Failed")
JOB_PHASES = ("Pending", *QUEUE_PHASES, "Running", "Retrying", "Succeeded", "Failed", "Suspended")
SERVICE_PHASES = ("Pending", *QUEUE_PHASES, "Deploying", "Ready", "Updating", "Degraded", "Recovering", "Failed")

# Every status field the status derivations write (the CRD declares each one).
STATUS_FIELDS = (
    "phase", "message", "observedGeneration", "conditions", "workers", "hosts", "readyHosts",
    "hostsReady", "rayJobName", "rayClusterName", "dashboardURL", "jobId", "jobStatus",
    "jobDeploymentStatus", "startTime", "completionTime", "queue", "priorityClass", "clusterQueue", "workload", "attempts", "attemptHistory",
    "progress", "lastCheckpoint", "goodput",
)
SERVICE_STATUS_FIELDS = (
    "phase", "message", "observedGeneration", "conditions", "replicas", "readyReplicas",
    "replicasReady", "hosts", "readyHosts", "model", "endpoint", "rayServiceName", "rayClusterName",
    "serviceStatus", "applicationStatus", "applicationMessage", "appliedConfig", "queue", "priorityClass", "clusterQueue", "workload",
)
# A condition's message is capped (metav1.Condition allows 32768 characters).
MAX_CONDITION_MESSAGE = 32768
