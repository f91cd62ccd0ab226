"""The TPUTorchJob's own spec schema (job_spec_schema): its entrypoint, training, storage, retries
and groups beside the blocks both kinds have, and the rule that only spec.suspend changes after
creation (JOB_MUTABLE).
"""

from __future__ import annotations

from . import groups, job as job_spec, spec
from .job import JOB_KIND
from .schema import common_properties, described, env_schema, int_field, string_field, topology_rule


def _immutable(field: str, kind: str) -> dict:
    """A transition rule on spec that refuses a change of ``field``, including adding or removing
    it (a rule on the field itself would only run when both old and new have it)."""
    return {
        "rule": f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        "message": f"spec.{field} is immutable: delete the {kind} and create it again to change it "
                   f"(only spec.suspend may change on a {kind})",
    }


# Fields of a TPUTorchJob that may change after creation: the only one that reaches the RayJob.
JOB_MUTABLE = {"suspend"}


def _hang_detection_schema() -> dict:
    low, high = job_spec.MIN_HANG_TIMEOUT_S, job_spec.MAX_HANG_TIMEOUT_S
    return described(
        "The hang sentinel (off without this block): when no training step ends in time, every worker's Python "
        "stacks are printed (tputorch.train.report() arms a watchdog in each worker), the status and an Event name "
        "where they are, and the attempt ends as a Hang so that the next one resumes from the last checkpoint "
        "(spec.retries.hang). The operator reads progress every ~30 s, which bounds how soon it can tell. A "
        "script that never calls tputorch.train.report() cannot arm it: the HangSentinel condition says so.",
        type="object",
        properties={
            "timeoutSeconds": int_field(
                "The least time a step may take, once the first step ended, before it counts as hung "
                "(a step that saves a checkpoint included).",
                minimum=low, maximum=high, default=job_spec.HANG_DEFAULTS["timeoutSeconds"],
            ),
            "firstStepTimeoutSeconds": int_field(
                "The first step of each attempt (compilation, restoring the checkpoint): the floor before any step "
                "ended, and the most any step may take. Default: 1800, or timeoutSeconds when that is longer.",
                minimum=low, maximum=high,
            ),
            "stepTimeMultiple": int_field(
                "After the first steps, a step counts as hung past this many times the median step time when that "
                "is longer than timeoutSeconds (0: timeoutSeconds alone).",
                minimum=0, maximum=job_spec.MAX_STEP_TIME_MULTIPLE, default=job_spec.HANG_DEFAULTS["stepTimeMultiple"],
            ),
        },
        **{"x-kubernetes-validations": [{
            "rule": "!has(self.firstStepTimeoutSeconds) || self.firstStepTimeoutSeconds >= self.timeoutSeconds",
            "message": "spec.hangDetection.firstStepTimeoutSeconds must be at least spec.hangDetection.timeoutSeconds",
        }]},
    )


def job_spec_schema() -> dict:
    properties = {
        **common_properties(JOB_KIND),
        "groups": groups.schema(topology_rule(), env_schema("", "spec.groups[].env")),
        "entrypoint": string_field(
            "Command the Ray job runs on the head, e.g. `python train.py`.",
            minLength=1,
            maxLength=spec.MAX_ENTRYPOINT,
        ),
        "suspend": described(
            "Create the RayJob suspended (no pods) or suspend a running one.",
            type="boolean",
            default=spec.DEFAULTS["suspend"],
        ),
        "activeDeadlineSeconds": int_field("Seconds the job may run before it is failed.", minimum=1),
        "backoffLimit": int_field(
            "Retries of a failed job; each retry provisions a whole new slice.",
            minimum=0,
            maximum=100,
            default=spec.DEFAULTS["backoffLimit"],
        ),
        "ttlSecondsAfterFinished": int_field(
            "Seconds to keep the Ray cluster after the job finishes.", minimum=0
        ),
        "shutdownAfterJobFinishes": described(
            "Delete the Ray cluster (and free the slice) when the job finishes.",
            type="boolean",
            default=spec.DEFAULTS["shutdownAfterJobFinishes"],
        ),
        "checkpoint": described(
            "Where Ray Train keeps the run's checkpoints. The script gets it as TPUTORCH_STORAGE_PATH, with "
            "TPUTORCH_RUN_NAME, a name that stays the same across every attempt of this object; "
            "tputorch.train.run_config() makes both a RunConfig, so ray.train.get_checkpoint() resumes.",
            type="object",
            required=["storagePath"],
            properties={
                "storagePath": string_field(
                    "gs://bucket/path on GKE, any fsspec/pyarrow URI, or an absolute path on a volume every host mounts.",
                    minLength=1, maxLength=job_spec.MAX_STORAGE_PATH, pattern=job_spec.STORAGE_PATH.pattern,
                ),
                "workerRetries": int_field(
                    "Ray Train's FailureConfig(max_failures) inside one attempt (-1: no limit).",
                    minimum=-1, maximum=job_spec.MAX_RETRIES, default=job_spec.WORKER_RETRIES_DEFAULT,
                ),
            },
        ),
        "retries": described(
            "New attempts (each a fresh Ray cluster on a whole slice, resuming from the last checkpoint) "
            "after an attempt ends, per kind of failure.",
            type="object",
            default={},
            properties={
                "infrastructure": int_field(
                    "After a host or the head of the slice is lost (preemption, node shutdown or deletion, eviction).",
                    minimum=0, maximum=job_spec.MAX_RETRIES, default=job_spec.RETRY_DEFAULTS["infrastructure"],
                ),
                "application": int_field(
                    "After the script failed with every host healthy.",
                    minimum=0, maximum=job_spec.MAX_RETRIES, default=job_spec.RETRY_DEFAULTS["application"],
                ),
                # No schema default: the API server would serve it on every existing job, and the
                # previous release's operator, after a downgrade, refuses the field it does not know.
                "hang": int_field(
                    "After the hang sentinel (spec.hangDetection) ended an attempt whose step did not end in time "
                    f"(default {job_spec.RETRY_DEFAULTS['hang']}).",
                    minimum=0, maximum=job_spec.MAX_RETRIES,
                ),
            },
        ),
        "hangDetection": _hang_detection_schema(),
    }
    # spec.tpu has its own self == oldSelf rule (with the slice in its message).
    immutable = [_immutable(f, JOB_KIND) for f in sorted(set(properties) - JOB_MUTABLE - {"tpu"})]
    return described(
        "What to train and on which TPU slice. Only suspend may change after creation.",
        type="object",
        required=["tpu", "image", "entrypoint"],
        properties=properties,
        **{
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.ttlSecondsAfterFinished) || self.shutdownAfterJobFinishes",
                    "message": "spec.ttlSecondsAfterFinished must not be set unless spec.shutdownAfterJobFinishes is true",
                },
                {
                    "rule": "!self.suspend || self.shutdownAfterJobFinishes",
                    "message": "spec.suspend must not be true unless spec.shutdownAfterJobFinishes is true",
                },
                *immutable,
            ]
        },
    )
