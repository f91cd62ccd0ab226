"""Both kinds' status schemas (job_status_schema, service_status_schema): the fields the status
derivations write, their phases and condition types as api/phases.py lists them.
"""

from __future__ import annotations

from . import phases
from .. import train
from .schema import described, int_field, string_field

PHASES = list(phases.JOB_PHASES)
# status.goodput's parts and moments (status/goodput.py writes them: api/ cannot import status/)
GOODPUT_PARTS = {
    "teardown": ("The attempt's start (the job's creation, the previous attempt's end) to its RayJob's creation, "
                 "and a succeeded attempt's last report to its end (the run's shutdown)."),
    "queued": "The RayJob's creation to Kueue's admission (0 without a queue).",
    "provisioning": "Admission to the last pod scheduled.",
    "start": "The last pod scheduled to the last pod Ready (image pull, Ray up).",
    "firstStep": "Ray up to the first progress report (the driver's start, the compile), less the restore.",
    "restore": "Time in tputorch.train.restoring() before the first report.",
    "productive": "Step time between the first and the last report read, less the lost work.",
    "checkpointSave": "Time tputorch.train.report spent persisting checkpoints.",
    "lostWork": ("A failed attempt's steps after its last checkpoint, by its step time, and its last report "
                 "to its end (the work in flight when it failed)."),
    "hang": "A hung attempt's time from its hang to its end.",
    "unaccounted": "Time between observed moments around a moment that was not observed.",
}
GOODPUT_MOMENTS = ("start", "created", "admitted", "scheduled", "rayUp")
MAX_HISTORY = 20  # attempt records kept in the status (attemptHistory, goodput.attempts): the first and the latest
SERVICE_PHASES = list(phases.SERVICE_PHASES)
MAX_CONDITIONS = 16


def _conditions_schema(types: tuple[str, ...]) -> dict:
    """metav1.Condition, as the Kubernetes API conventions define it."""
    return described(
        ", ".join(types) + ".",
        type="array",
        maxItems=MAX_CONDITIONS,
        items={
            "type": "object",
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
            "properties": {
                "type": {"type": "string", "maxLength": 316,
                         "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string", "minLength": 1, "maxLength": 1024,
                           "pattern": r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"},
                "message": {"type": "string", "maxLength": phases.MAX_CONDITION_MESSAGE},
                "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
                "lastTransitionTime": {"type": "string", "format": "date-time"},
            },
        },
        **{"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


def _common_status() -> dict:
    return {
        "message": string_field("Human-readable summary of the current state."),
        "observedGeneration": described("Generation of the spec this status describes.", type="integer", format="int64"),
        "hosts": int_field("TPU hosts (pods) wanted."),
        "readyHosts": int_field("TPU host pods that are ready."),
        "rayClusterName": string_field("Name of the RayCluster KubeRay created."),
        "queue": string_field("Kueue LocalQueue (spec.queueName)."),
        "priorityClass": string_field("Kueue WorkloadPriorityClass (spec.priorityClassName)."),
        "clusterQueue": string_field("Kueue ClusterQueue that admitted the workload."),
        "workload": string_field("Name of the Kueue Workload made for the child."),
    }


def _number(description: str) -> dict:
    return described(description, type="number", minimum=0)


def _timing_schema() -> dict:
    return described(
        "The script's own clock in that report (tputorch.train.report; absent from an older one's): where "
        "its time went from its first report on. Times are UNIX seconds of the training host's clock.",
        type="object",
        properties={
            "attempt": int_field("The attempt that reported (TPUTORCH_ATTEMPT)."),
            "time": _number("When this report returned."),
            "firstReportTime": _number("When the process's first report began: the end of its first step(s)."),
            "stepSeconds": _number("Seconds spent in steps (between reports) since the first report."),
            "checkpointSaveSeconds": _number("Seconds spent persisting checkpoints since the first report."),
            "restoreSeconds": _number("Seconds spent in tputorch.train.restoring()."),
            "secondsPerStep": _number("Seconds per step over the steps between the last two reports."),
            "checkpointStep": described("The step of the last checkpoint this process persisted.", type="integer",
                                        format="int64", minimum=0),
        },
    )


def _parts_schema(description: str) -> dict:
    return described(description, type="object",
                     properties={p: described(what + " Seconds.", type="number") for p, what in GOODPUT_PARTS.items()})


def _goodput_schema() -> dict:
    attempt = {
        "type": "object",
        "properties": {
            "attempt": described("The attempt's number.", type="integer", format="int32"),
            "result": string_field("How it ended (attemptHistory); absent while it runs."),
            "startTime": string_field("When it started.", format="date-time"),
            "wallClockSeconds": _number("Its start to its end, or to asOf while it runs."),
            "seconds": _parts_schema("The attempt's wall-clock by part."),
        },
    }
    return described(
        "The goodput ledger (docs/tasks/goodput.md): the job's wall-clock split into " + ", ".join(GOODPUT_PARTS) +
        ", each measured from observed timestamps, up to the last moment observed (asOf).",
        type="object",
        properties={
            "productiveFraction": _number("productive / wallClockSeconds, for the whole job."),
            "wallClockSeconds": _number("From the job's creation to asOf (or its end)."),
            "asOf": string_field("The last moment the figures reach.", format="date-time"),
            "seconds": _parts_schema("The job's wall-clock by part; the parts sum to wallClockSeconds."),
            "attempts": described("Each attempt's figures: the first and the latest ones.", type="array",
                                  maxItems=MAX_HISTORY, items=attempt),
            "ended": described("The sums over every ended attempt (those no longer listed included).",
                               type="object", properties={"wallClockSeconds": _number("Their wall-clock."),
                                                          "seconds": _parts_schema("Their wall-clock by part.")}),
            "marks": described(
                "The current attempt's moments as first observed, kept for the next reconcile.", type="object",
                properties={
                    "attempt": {"type": "integer", "format": "int32"},
                    **{m: {"type": "string", "format": "date-time"} for m in GOODPUT_MOMENTS},
                    "firstReport": described("The attempt's earliest first report (a worker restart's process "
                                             "reports a later one).", type="string", format="date-time"),
                    "restoreSeconds": {"type": "number"},
                    "ended": {"type": "boolean"},
                },
            ),
        },
    )


def job_status_schema() -> dict:
    return described(
        "Observed state, derived from the RayJob, its RayCluster and pods.",
        type="object",
        properties={
            **_common_status(),
            "phase": string_field(", ".join(PHASES) + ".", enum=PHASES),
            "attempts": int_field("The current attempt (1 + the retries so far); each is a fresh RayJob."),
            "attemptHistory": described(
                "Attempts that ended: when, and why (result Infrastructure, Application, Hang, Final or Succeeded).",
                type="array",
                items={
                    "type": "object",
                    "properties": {
                        "attempt": {"type": "integer", "format": "int32"},
                        "result": {"type": "string"},
                        "reason": {"type": "string"},
                        "message": {"type": "string", "maxLength": 1024},
                        "endTime": {"type": "string", "format": "date-time"},
                        "hungSince": described("A Hang: when its last step ended (or it began running); "
                                               "until endTime the slice did no training.",
                                               type="string", format="date-time"),
                    },
                },
            ),
            "conditions": _conditions_schema(phases.CONDITION_TYPES),
            "rayJobName": string_field("Name of the RayJob."),
            "dashboardURL": string_field("Ray dashboard address (inside the cluster)."),
            "jobId": string_field("Ray job submission id."),
            "jobStatus": string_field("Ray job status from KubeRay (PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED)."),
            "jobDeploymentStatus": string_field("KubeRay's RayJob deployment status."),
            "workers": int_field("Ray Train workers: chips / chipsPerWorker."),
            "hostsReady": string_field("readyHosts/hosts, for display."),
            "startTime": string_field("When the Ray job started.", format="date-time"),
            "completionTime": string_field("When the Ray job finished.", format="date-time"),
            "progress": described(
                "What the training script last reported through tputorch.train.report(), read from the "
                "Ray job driver's log while the job runs (at most every 30 s).",
                type="object",
                properties={
                    "step": described("The last reported step.", type="integer", format="int64", minimum=0),
                    "epoch": described("The last reported epoch.", type="integer", format="int64", minimum=0),
                    "metrics": described("The numeric metrics of that report (e.g. loss).", type="object",
                                  maxProperties=train.MAX_PROGRESS_METRICS,
                                  additionalProperties={"type": "number"}),
                    "reportedAt": string_field("When the operator first read this report.", format="date-time"),
                    "timing": _timing_schema(),
                },
            ),
            "goodput": _goodput_schema(),
            "lastCheckpoint": string_field("Where Ray Train persisted the latest checkpoint the script reported.",
                                      maxLength=train.MAX_CHECKPOINT_PATH),
        },
    )


def service_status_schema() -> dict:
    return described(
        "Observed state, derived from the RayService and its pods.",
        type="object",
        properties={
            **_common_status(),
            "phase": string_field(", ".join(SERVICE_PHASES[:-1]) + " or " + SERVICE_PHASES[-1] + ".", enum=SERVICE_PHASES),
            "conditions": _conditions_schema(phases.SERVICE_CONDITION_TYPES),
            "replicas": int_field("Model replicas (slices) wanted now."),
            "readyReplicas": int_field("Replicas whose every TPU host runs (a host without a Serve replica is NotReady by design)."),
            "replicasReady": string_field("readyReplicas/replicas, for display."),
            "model": string_field("The model name clients send."),
            "endpoint": string_field("OpenAI-compatible base URL inside the cluster."),
            "rayServiceName": string_field("Name of the RayService."),
            "serviceStatus": string_field("KubeRay's serviceStatus (Running when ready)."),
            "applicationStatus": string_field("The Serve application's status (DEPLOYING, RUNNING, DEPLOY_FAILED, UNHEALTHY...)."),
            "applicationMessage": string_field("The Serve application's message."),
            "appliedConfig": described(
                "What the operator has seen the serving RayCluster apply (hashes; the SpecApplied condition).",
                type="object",
                properties={
                    "rayClusterName": string_field("The RayCluster these hashes were recorded for."),
                    "serveConfig": string_field("Hash of the Serve config seen reloaded."),
                    "cluster": string_field("Hash of the cluster spec as KubeRay 1.6 hashes it (no replicas, tolerations)."),
                    "tolerations": string_field("Hash of the pod specs' tolerations and scheduling gates."),
                },
            ),
        },
    )
