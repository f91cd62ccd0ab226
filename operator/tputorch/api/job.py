"""TPUTorchJob: its own block on top of the shared one (common.py), and its parser."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from . import topology
from .groups import KueuePodSets, kueue_groups_error, parse_groups
from .common import (
    DEFAULTS, COMMON_FIELDS, MAX_PODS_DEFAULT, TPU_FIELDS, CommonSpec, KindRules, check_pods, common_fields, parse_common,
)
from .reader import INT32_MAX, FieldError, InvalidSpec, Reader, between, string, strings_in

RAYJOB_NAME_MAX = 47  # KubeRay: the RayCluster name <rayjob>-<5 chars> must stay a valid label
JOB_KIND = "TPUTorchJob"
MIN_RAY_VERSION = (2, 59, 0)  # first Ray whose TorchTrainer runs on TPU (tpu_dist backend)
MAX_ENTRYPOINT = 65536
MAX_STORAGE_PATH = 1024
SINGLE_SLICE_REASON = (
    "must be 1: a TPUTorchJob runs on one slice. Ray 2.59's PyTorch backend raises for training "
    "across slices, and multi-slice PyTorch on TPU is not verified on hardware in Ray 2.60"
)
SPEC_FIELDS = COMMON_FIELDS | {
    "groups", "entrypoint", "suspend", "activeDeadlineSeconds", "backoffLimit", "ttlSecondsAfterFinished",
    "shutdownAfterJobFinishes", "checkpoint", "retries", "hangDetection",
}
CHECKPOINT_FIELDS = {"storagePath", "workerRetries"}
RETRY_FIELDS = {"infrastructure", "application", "hang"}
# Attempts after the first, per class of failure (status/attempts.py): a lost TPU host or head is
# routine on Spot and flex-start capacity; a script that fails with every host healthy fails again;
# a hang (spec.hangDetection) may be a flaky collective, once, but a deterministic one hangs again.
RETRY_DEFAULTS = {"infrastructure": 10, "application": 0, "hang": 1}
# spec.hangDetection (status/hang.py, train.py's watchdog): off unless the block is given.
HANG_FIELDS = {"timeoutSeconds", "firstStepTimeoutSeconds", "stepTimeMultiple"}
HANG_DEFAULTS = {"timeoutSeconds": 600, "firstStepTimeoutSeconds": 1800, "stepTimeMultiple": 10}
# The operator reads progress every 30 s (status/progress.py READ_INTERVAL): a shorter timeout would
# be decided on reads older than itself.
MIN_HANG_TIMEOUT_S = 60
MAX_HANG_TIMEOUT_S = 7 * 24 * 3600
MAX_STEP_TIME_MULTIPLE = 1000
WORKER_RETRIES_DEFAULT = 1  # Ray Train's FailureConfig(max_failures) inside one attempt
MAX_RETRIES = 1000
# gs://bucket/path, s3://..., any fsspec/pyarrow URI, or an absolute path on a mounted volume.
STORAGE_PATH = re.compile(r"^([a-z][a-z0-9+.-]*://[^\s]+|/[^\s]*)$")

JOB = KindRules(JOB_KIND, SPEC_FIELDS, TPU_FIELDS, SINGLE_SLICE_REASON, RAYJOB_NAME_MAX, "RayJob", MIN_RAY_VERSION,
                "older Ray cannot run PyTorch on TPU")


def _entrypoint(v: str) -> str | None:
    # KubeRay runs the entrypoint (and runtimeEnv) in one `bash -c` argument, which Linux caps at
    # 128 KiB (MAX_ARG_STRLEN): the two limits together stay below it.
    if len(v.encode()) > MAX_ENTRYPOINT:
        return f"must be at most {MAX_ENTRYPOINT} bytes (KubeRay passes it to bash as one argument)"
    return string(MAX_ENTRYPOINT)(v)


@dataclass(frozen=True)
class HangDetection:
    """spec.hangDetection: when a step that has not ended counts as a hang."""

    timeout_s: int  # the least time a step may take before it counts (after the first step)
    first_step_timeout_s: int  # the first step of an attempt (compile, restore), and every step's ceiling
    step_time_multiple: int  # after the first steps: hung past this many median step times (0: timeout_s only)


@dataclass(frozen=True, kw_only=True)
class JobSpec(CommonSpec):
    chips_per_worker: int
    entrypoint: str
    suspend: bool
    active_deadline_seconds: int | None
    backoff_limit: int
    ttl_seconds_after_finished: int | None
    shutdown_after_job_finishes: bool
    groups: tuple = ()  # spec.groups (groups.Group), beside the training slice
    uid: str | None = None
    storage_path: str | None = None
    worker_retries: int = WORKER_RETRIES_DEFAULT
    retries: dict = field(default_factory=lambda: dict(RETRY_DEFAULTS))
    hang_detection: HangDetection | None = None  # None: spec.hangDetection absent, the sentinel is off

    @property
    def run_name(self) -> str:
        """The Ray Train run's name: the same for every attempt and re-admission of this object
        (its uid does not change), another one for a new object of the same name."""
        return f"{self.name}-{self.uid.split('-')[0][:8]}" if self.uid else self.name

    @property
    def workers(self) -> int:
        return self.slice.workers(self.chips_per_worker)


def parse(body: Any, max_pods: int = MAX_PODS_DEFAULT) -> JobSpec:
    """Validate a TPUTorchJob object (as a dict) and return its JobSpec; InvalidSpec lists every error.
    ``max_pods``: the most pods the job may make (common.check_pods)."""
    r = Reader()
    if not isinstance(body, Mapping):
        raise InvalidSpec([FieldError("", body, "must be a TPUTorchJob object")])
    operator_env = {topology.RAY_TPU_RESOURCE_PER_CHIP: topology.JOB_RESOURCE_PER_CHIP_REASON}
    fields, spec, tpu = parse_common(r, body, JOB, operator_env)
    groups = parse_groups(r, spec, fields.get("image"), operator_env)
    entrypoint = r.value(spec, "entrypoint", "spec.entrypoint", str, required=True, check=_entrypoint)
    # KubeRay writes runtimeEnv into the submitter's `bash -c` line inside double quotes: $ and `
    # would expand there (a value changed, or a command run) instead of reaching Ray as written.
    for where, text in strings_in(fields["runtime_env"] or {}, "spec.runtimeEnv"):
        if "$" in text or "`" in text:
            r.error(where, text, "must not contain $ or ` (KubeRay passes runtimeEnv through bash, where they "
                    "expand); set such values in spec.env, which reaches the pods as written")
    shutdown = r.value(spec, "shutdownAfterJobFinishes", "spec.shutdownAfterJobFinishes", bool, default=DEFAULTS["shutdownAfterJobFinishes"])
    suspend = r.value(spec, "suspend", "spec.suspend", bool, default=DEFAULTS["suspend"])
    deadline = r.value(spec, "activeDeadlineSeconds", "spec.activeDeadlineSeconds", int, check=between(1, INT32_MAX))
    backoff = r.value(spec, "backoffLimit", "spec.backoffLimit", int, default=DEFAULTS["backoffLimit"], check=between(0, 100))
    ttl = r.value(spec, "ttlSecondsAfterFinished", "spec.ttlSecondsAfterFinished", int, check=between(0, INT32_MAX))
    checkpoint = r.mapping(spec, "checkpoint", "spec.checkpoint", CHECKPOINT_FIELDS)
    storage_path = r.value(checkpoint, "storagePath", "spec.checkpoint.storagePath", str, required="checkpoint" in spec,
                           check=string(MAX_STORAGE_PATH, STORAGE_PATH, "a URI such as gs://bucket/runs or an absolute path on a mounted volume"))
    worker_retries = r.value(checkpoint, "workerRetries", "spec.checkpoint.workerRetries", int,
                             default=WORKER_RETRIES_DEFAULT, check=between(-1, MAX_RETRIES))
    retries_block = r.mapping(spec, "retries", "spec.retries", RETRY_FIELDS)
    retries = {k: r.value(retries_block, k, f"spec.retries.{k}", int, default=d, check=between(0, MAX_RETRIES))
               for k, d in RETRY_DEFAULTS.items()}
    hang_detection = _hang_detection(r, spec)
    # KubeRay's own rules: both only make sense when the RayCluster is deleted after the job.
    if ttl is not None and not shutdown:
        r.error("spec.ttlSecondsAfterFinished", ttl, "must not be set unless spec.shutdownAfterJobFinishes is true")
    if suspend and not shutdown:
        r.error("spec.suspend", suspend, "must not be true unless spec.shutdownAfterJobFinishes is true")
    if fields.get("queue_name") and not shutdown:  # Kueue's RayJob webhook refuses it otherwise
        r.error("spec.shutdownAfterJobFinishes", shutdown, "must be true when spec.queueName is set: Kueue "
                "admits a RayJob only with a cluster of its own that is deleted when the job ends")

    if tpu.slice is not None:
        pods = 2 + tpu.slice.hosts + sum(g.replicas * g.hosts for g in groups)
        check_pods(r, "spec.groups" if groups else "spec.tpu.topology", pods, max_pods,
                   "the head, the submitter, the slice's hosts and every group's pods")

    if r.errors:
        raise InvalidSpec(r.errors)
    return JobSpec(
        **common_fields(fields, tpu),
        chips_per_worker=tpu.chips_per_worker,
        entrypoint=entrypoint,
        suspend=suspend,
        active_deadline_seconds=deadline,
        backoff_limit=backoff,
        ttl_seconds_after_finished=ttl,
        shutdown_after_job_finishes=shutdown,
        groups=groups,
        uid=(body.get("metadata") or {}).get("uid") or None,
        storage_path=storage_path,
        worker_retries=worker_retries,
        retries=retries,
        hang_detection=hang_detection,
    )


def _hang_detection(r: Reader, spec: Mapping) -> HangDetection | None:
    if spec.get("hangDetection") is None:
        return None
    block = r.mapping(spec, "hangDetection", "spec.hangDetection", HANG_FIELDS)
    bounds = {"timeoutSeconds": between(MIN_HANG_TIMEOUT_S, MAX_HANG_TIMEOUT_S),
              "firstStepTimeoutSeconds": between(MIN_HANG_TIMEOUT_S, MAX_HANG_TIMEOUT_S),
              "stepTimeMultiple": between(0, MAX_STEP_TIME_MULTIPLE)}
    before = len(r.errors)
    values = {k: r.value(block, k, f"spec.hangDetection.{k}", int, default=HANG_DEFAULTS[k], check=bounds[k])
              for k in ("timeoutSeconds", "stepTimeMultiple")}
    timeout = values["timeoutSeconds"]
    # unset: the default, or the step timeout when that is longer (never an error for a field not given)
    first = r.value(block, "firstStepTimeoutSeconds", "spec.hangDetection.firstStepTimeoutSeconds", int,
                    default=max(timeout, HANG_DEFAULTS["firstStepTimeoutSeconds"]), check=bounds["firstStepTimeoutSeconds"])
    if len(r.errors) == before and first < timeout:
        r.error("spec.hangDetection.firstStepTimeoutSeconds", first,
                f"must be at least spec.hangDetection.timeoutSeconds ({timeout}): it bounds the first step of an "
                "attempt (compile, restore) and is every step's ceiling")
    return HangDetection(timeout, first, values["stepTimeMultiple"])


def kueue_errors(job: JobSpec, kueue: KueuePodSets | None) -> list[FieldError]:
    """What the installed Kueue (``kueue``; None: none installed) would not admit of this job, checked
    before its RayJob is created: a queued job's groups against Kueue's pod sets per Workload."""
    if not job.queue_name or kueue is None:
        return []
    error = kueue_groups_error(len(job.groups), kueue)
    return [error] if error else []
