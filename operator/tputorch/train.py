"""Helper for training scripts: the Ray Train scaling and run configs of the job the operator rendered.

The operator puts the slice's shape, the run's name and its checkpoint storage into every Ray
container's environment (see ``render``); this module turns them back into
``ray.train.ScalingConfig`` and ``ray.train.RunConfig`` so a script carries no TPU numbers and
resumes from the last checkpoint after any retry.
Ray is imported lazily: the operator process imports this package but never Ray.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

from . import timestamps, watchdog

# The environment contract between render/env.py (writer) and this module (reader).
ENV_NUM_WORKERS = "TPUTORCH_NUM_WORKERS"
ENV_TOPOLOGY = "TPUTORCH_TOPOLOGY"
ENV_ACCELERATOR_TYPE = "TPUTORCH_ACCELERATOR_TYPE"
ENV_CHIPS_PER_WORKER = "TPUTORCH_CHIPS_PER_WORKER"
ENV_NUM_HOSTS = "TPUTORCH_NUM_HOSTS"
ENV_CHIPS_PER_HOST = "TPUTORCH_CHIPS_PER_HOST"
ENV_JOB_NAME = "TPUTORCH_JOB_NAME"
ENV_GROUPS = "TPUTORCH_GROUPS"  # JSON list of spec.groups' shapes; set only when the job has groups

# spec.groups: every group's Ray nodes carry the Ray label GROUP_LABEL=<group name>, the training
# slice's nodes GROUP_LABEL=TRAIN_GROUP, and only the training slice's nodes the Ray resource
# TRAIN_RESOURCE (one per chip). Ray Train refuses label_selector with use_tpu (it reserves a slice
# itself), so scaling_config() asks for TRAIN_RESOURCE instead: its workers can only be placed on
# the training slice, never on a rollout slice of the same shape.
GROUP_LABEL = "tputorch.io/group"
TRAIN_GROUP = "tpu-slice"
TRAIN_RESOURCE = "tputorch-train-slice"

# The run: the same name on every attempt of one TPUTorchJob (derived from its uid), and where
# Ray Train keeps its checkpoints (spec.checkpoint.storagePath; unset without one).
ENV_RUN_NAME = "TPUTORCH_RUN_NAME"
ENV_STORAGE_PATH = "TPUTORCH_STORAGE_PATH"
ENV_WORKER_RETRIES = "TPUTORCH_WORKER_RETRIES"
# The attempt: its number (1, 2, ...: status.attempts) and when the operator created its RayJob
# (RFC 3339, set from attempt 2 on), which is after every pod of the earlier attempts was gone.
ENV_ATTEMPT = "TPUTORCH_ATTEMPT"
ENV_ATTEMPT_STARTED = "TPUTORCH_ATTEMPT_STARTED"
# What report() stamps on each checkpoint it is given (Ray Train's checkpoint metadata).
STAMP_ATTEMPT = "tputorch.attempt"
STAMP_WRITTEN = "tputorch.written"  # UNIX seconds


class MissingSliceEnvironment(RuntimeError):
    """The script runs outside a TPUTorchJob (or the environment was edited)."""


# Ray's accelerator types for TPUs are TPU-V4, TPU-V5LITEPOD, TPU-V5P, TPU-V6E, TPU-V7X: the
# resource TPU nodes register is accelerator_type:<that>. Ray 2.60 also accepts "v6e", asks for
# accelerator_type:v6e, which no node has, and the job waits forever without an error.
def _check_accelerator_type(value: Any) -> None:
    if not (isinstance(value, str) and value.startswith("TPU-V") and value == value.upper()):
        raise ValueError(
            f"accelerator_type {value!r} matches no Ray TPU node: use Ray's form such as 'TPU-V6E' "
            "(nodes register the resource accelerator_type:TPU-V6E; Ray accepts 'v6e' but then never "
            "schedules the workers)"
        )


@dataclass(frozen=True)
class SliceShape:
    num_workers: int
    topology: str
    accelerator_type: str
    chips_per_worker: int

    fenced: bool = False  # the job has spec.groups: ask for the training slice's own resource

    def scaling_config_kwargs(self) -> dict[str, Any]:
        return {
            "use_tpu": True,
            "num_workers": self.num_workers,
            "topology": self.topology,
            "accelerator_type": self.accelerator_type,
            "resources_per_worker": {"TPU": self.chips_per_worker, **self.fence(self.chips_per_worker)},
        }

    def fence(self, units: float) -> dict[str, float]:
        """The training slice's own Ray resource, when the job has groups (else nothing)."""
        return {TRAIN_RESOURCE: units} if self.fenced else {}


@dataclass(frozen=True)
class GroupShape:
    """One of spec.groups as the operator rendered it."""

    name: str
    kind: str  # "tpu", "gpu" or "cpu"
    replicas: int  # slices (tpu) or pods
    hosts_per_replica: int
    labels: dict  # Ray node labels of its nodes: label_selector=group.labels places work there
    accelerator_type: str | None = None  # tpu: TPU-V6E ...
    topology: str | None = None
    chips: int | None = None  # per slice
    chips_per_host: int | None = None
    pod_type: str | None = None  # tpu: v6e-8 ...
    gpu_type: str | None = None  # gpu: nvidia-l4 ...
    gpus_per_host: int | None = None

    @property
    def hosts(self) -> int:
        return self.replicas * self.hosts_per_replica


def groups(environ: Mapping[str, str] | None = None) -> dict[str, GroupShape]:
    """spec.groups by name (empty for a job without groups)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_GROUPS)
    if not raw:
        return {}
    shapes = {}
    for g in json.loads(raw):
        shapes[g["name"]] = GroupShape(
            name=g["name"], kind=g["kind"], replicas=g["replicas"], hosts_per_replica=g["hostsPerReplica"],
            labels=dict(g["labels"]), accelerator_type=g.get("acceleratorType"), topology=g.get("topology"),
            chips=g.get("chips"), chips_per_host=g.get("chipsPerHost"), pod_type=g.get("podType"),
            gpu_type=g.get("gpuType"), gpus_per_host=g.get("gpusPerHost"),
        )
    return shapes


def training_label_selector() -> dict[str, str]:
    """The Ray label of the training slice's nodes (for actors and tasks; Ray Train itself is kept
    there by scaling_config())."""
    return {GROUP_LABEL: TRAIN_GROUP}


def slice_shape(environ: Mapping[str, str] | None = None) -> SliceShape:
    """Read the slice shape the operator wrote; raise a clear error naming what is missing."""
    env = os.environ if environ is None else environ
    names = (ENV_NUM_WORKERS, ENV_TOPOLOGY, ENV_ACCELERATOR_TYPE, ENV_CHIPS_PER_WORKER)
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise MissingSliceEnvironment(
            f"environment variables {', '.join(missing)} are not set: scaling_config() reads the "
            "slice shape that the tputorch operator puts into a TPUTorchJob's Ray containers"
        )
    try:
        num_workers = int(env[ENV_NUM_WORKERS])
        chips_per_worker = int(env[ENV_CHIPS_PER_WORKER])
    except ValueError as err:
        raise MissingSliceEnvironment(f"slice environment is not numeric: {err}") from None
    return SliceShape(
        num_workers=num_workers,
        topology=env[ENV_TOPOLOGY],
        accelerator_type=env[ENV_ACCELERATOR_TYPE],
        chips_per_worker=chips_per_worker,
        fenced=bool(env.get(ENV_GROUPS)),
    )


def scaling_config(environ: Mapping[str, str] | None = None, **overrides: Any):
    """``ray.train.ScalingConfig`` for this job's slice; ``overrides`` are passed through to it."""
    from ray.train import ScalingConfig  # lazy: only training scripts have Ray

    kwargs = slice_shape(environ).scaling_config_kwargs()
    kwargs.update(overrides)
    if kwargs.get("use_tpu"):
        _check_accelerator_type(kwargs.get("accelerator_type"))
    return ScalingConfig(**kwargs)


def cpu_scaling_config(environ: Mapping[str, str] | None = None, **overrides: Any):
    """A CPU ``ScalingConfig`` with as many workers as this job's slice: for running a TPU
    script's training loop on CPU (the examples' ``--cpu``), never as a fallback for TPUs.

    Without ``use_tpu`` or ``use_gpu``, ``TorchTrainer`` joins the workers with ``gloo``.
    """
    from ray.train import ScalingConfig  # lazy: only training scripts have Ray

    shape = slice_shape(environ)
    kwargs: dict[str, Any] = {"num_workers": shape.num_workers}
    if shape.fenced:  # a job with groups: on the training slice's hosts only
        kwargs["resources_per_worker"] = {"CPU": 1, **shape.fence(shape.chips_per_worker)}
    kwargs.update(overrides)
    if kwargs.get("use_tpu") or kwargs.get("use_gpu"):
        raise ValueError("cpu_scaling_config() runs on CPUs only: use scaling_config() for the slice's TPUs")
    return ScalingConfig(**kwargs)


def run_config(environ: Mapping[str, str] | None = None, *, max_preemption_failures: int | None = None,
               relax_collectives_on_preemption: bool | None = None, preemption_grace_s: float | None = None,
               **overrides: Any):
    """``ray.train.RunConfig`` for this job: the run name that every attempt of the TPUTorchJob
    shares, its checkpoint storage (spec.checkpoint.storagePath) and a ``FailureConfig`` with the
    worker-level retries of one attempt (spec.checkpoint.workerRetries). Because the name and the
    storage stay the same, ``ray.train.get_checkpoint()`` in the training function returns the last
    checkpoint of an earlier attempt.

    Ray 2.60's preemption options of ``FailureConfig`` are passed through when given:
    ``max_preemption_failures`` (node preemptions Ray Train recovers from inside one attempt, counted
    apart from workerRetries; Ray's default -1 is unlimited), ``relax_collectives_on_preemption``
    and ``preemption_grace_s`` (let the surviving workers commit a just-in-time checkpoint; the
    training function learns of a preemption from ``preemption()`` below, over
    ``ray.train.get_preemption_info()``). A spot slice
    that GKE reclaims takes every host of the slice, so that is an attempt's end and spec.retries'
    business; these options matter when part of a slice is drained. ``overrides`` are passed through
    to RunConfig (a ``failure_config`` there replaces the one built here)."""
    from ray.train import FailureConfig, RunConfig  # lazy: only training scripts have Ray

    env = os.environ if environ is None else environ
    kwargs: dict[str, Any] = {}
    if env.get(ENV_RUN_NAME):
        kwargs["name"] = env[ENV_RUN_NAME]
    if env.get(ENV_STORAGE_PATH):
        kwargs["storage_path"] = env[ENV_STORAGE_PATH]
    failure: dict[str, Any] = {}
    if env.get(ENV_WORKER_RETRIES):
        try:
            failure["max_failures"] = int(env[ENV_WORKER_RETRIES])
        except ValueError:
            raise MissingSliceEnvironment(f"{ENV_WORKER_RETRIES} is not an integer: {env[ENV_WORKER_RETRIES]!r}") from None
    preemption = {"max_preemption_failures": max_preemption_failures,
                  "relax_collectives_on_preemption": relax_collectives_on_preemption,
                  "preemption_grace_s": preemption_grace_s}
    failure.update({k: v for k, v in preemption.items() if v is not None})
    if failure:
        kwargs["failure_config"] = FailureConfig(**failure)
    kwargs.update(overrides)
    return RunConfig(**kwargs)


# --- attempts and the checkpoint to resume from ---------------------------------------------------
# Every attempt of a job shares one Ray Train run (run_config()), so ray.train.get_checkpoint()
# returns the latest checkpoint any attempt persisted. The operator starts attempt N only once every
# pod of the earlier attempts is gone from the API; a pod's object goes once its kubelet stopped its
# containers, so an earlier attempt writes nothing after attempt N started unless its pod was removed
# behind the kubelet's back (a force deletion, a Node object deleted while its VM runs on). Such a
# late checkpoint is never resumed from: report() stamps each checkpoint with the attempt that wrote
# it and when, and checkpoint() skips one written by an earlier attempt after this attempt started
# (ENV_ATTEMPT_STARTED, the operator's clock at its RayJob's creation; a checkpoint written before it
# came from a pod still shutting down, which the operator waited for, and is resumed from as usual).
# The rule reads only the stamp and one time, decided once by the operator: no storage listing, no
# lock, no run per attempt (which would end Ray Train's own resume of ray.train.get_checkpoint()).


class StaleCheckpoint(RuntimeError):
    """Every checkpoint of the run was written by an earlier attempt after this one started."""


def attempt(environ: Mapping[str, str] | None = None) -> int:
    """This attempt's number (1 for the first, and outside a TPUTorchJob)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_ATTEMPT, "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def checkpoint_stamp(environ: Mapping[str, str] | None = None, now: float | None = None) -> dict[str, Any]:
    """The metadata report() puts on a checkpoint: the attempt that writes it and when."""
    return {STAMP_ATTEMPT: attempt(environ), STAMP_WRITTEN: time.time() if now is None else now}


def stale(metadata: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether a checkpoint with this metadata was written by an earlier attempt after this one
    started (see above). One without a stamp (not reported through report()) cannot be told: not stale."""
    env = os.environ if environ is None else environ
    started = timestamps.parse(env.get(ENV_ATTEMPT_STARTED))
    by, written = metadata.get(STAMP_ATTEMPT), metadata.get(STAMP_WRITTEN)
    if started is None or not isinstance(by, int) or not isinstance(written, (int, float)):
        return False
    return by < attempt(env) and written >= started.timestamp()


def newest_fresh(checkpoints: list[tuple[Any, Mapping[str, Any]]], environ: Mapping[str, str] | None = None) -> Any:
    """Of (checkpoint, metadata) pairs, newest first, the first not stale; StaleCheckpoint when all are."""
    for found, metadata in checkpoints:
        if not stale(metadata, environ):
            return found
    raise StaleCheckpoint(
        f"every checkpoint of the run was written by an earlier attempt after attempt {attempt(environ)} started "
        f"(a pod of it was removed while it still ran: force-deleted, or its Node deleted); none is resumed from")


def checkpoint(environ: Mapping[str, str] | None = None):
    """The checkpoint to resume from, in the training function: ``ray.train.get_checkpoint()``
    unless an earlier attempt wrote it after this attempt started, then the newest reported
    checkpoint that was not (by its stamp's time); None when the run has none."""
    import ray.train  # lazy: only training scripts have Ray

    latest = ray.train.get_checkpoint()
    if latest is None or not stale(latest.get_metadata(), environ):
        return latest
    reported = [(r.checkpoint, r.checkpoint.get_metadata()) for r in ray.train.get_all_reported_checkpoints()]
    reported.sort(key=lambda pair: pair[1].get(STAMP_WRITTEN) or 0, reverse=True)
    return newest_fresh(reported, environ)


@dataclass(frozen=True)
class Preemption:
    """A preemption Ray Train saw coming (Ray 2.60's ``ray.train.PreemptionInfo``), as a training
    loop acts on it: how long is left, which workers go, and whether this worker is one of them."""
    seconds_left: float | None  # until the earliest reclaim deadline; None: no deadline was reported
    nodes: tuple[str, ...]  # the Ray node ids being preempted, sorted
    ranks: tuple[int, ...]  # the world ranks of the workers on them, sorted
    this_worker: bool  # the calling worker's world rank is among ``ranks``


def preemption(now: float | None = None) -> Preemption | None:
    """``ray.train.get_preemption_info()`` (Ray 2.60) inside the training function: None until a
    node of one of the run's workers is being preempted (part of a slice drained; see run_config()'s
    ``preemption_grace_s`` and ``relax_collectives_on_preemption``), then a Preemption. React by
    reporting a checkpoint at once and training on: Ray Train restarts from it once the node is gone.
    Ray's call is a barrier: every worker must call this the same number of times (once per step,
    say), never on rank 0 alone. ``now``: the current UNIX time in seconds (default: the clock)."""
    import ray.train  # lazy: only training scripts have Ray

    info = ray.train.get_preemption_info()
    if info is None:
        return None
    ranks = tuple(info.preempted_ranks)
    left = None
    if info.deadline_ms is not None:
        left = max(0.0, info.deadline_ms / 1000.0 - (time.time() if now is None else now))
    rank = ray.train.get_context().get_world_rank()
    return Preemption(seconds_left=left, nodes=tuple(info.preempted_node_ids), ranks=ranks, this_worker=rank in ranks)


# --- progress: what the operator shows in the TPUTorchJob's status --------------------------------
# Ray 2.60's dashboard keeps no Train metrics, but it serves the tail of the job driver's log, and
# Ray Train workers' prints reach that log. So report() prints one line, on world rank 0 only:
# PROGRESS_MARKER followed by a small JSON object, which the operator reads back
# (status/progress.py parses it; the limits below are the parser's too).
PROGRESS_MARKER = "tputorch.progress "
MAX_PROGRESS_METRICS = 16  # numeric metrics per line, beside step and epoch
MAX_METRIC_NAME = 63
MAX_CHECKPOINT_PATH = 2048
MAX_PROGRESS_LINE = 4096  # characters of the JSON object
# Metric names with a printer column of their own on the TPUTorchJob (api/crd.py); any other name
# is shown by `tputorch describe` only. The RL ones: the mean reward of the step's rollouts, and the
# oldest policy weight version a rollout engine ran them with (a stale engine holds it below the step).
LOSS_METRIC = "loss"
REWARD_METRIC = "reward_mean"
WEIGHT_VERSION_METRIC = "weight_version"


def count_of(value: Any) -> int | None:
    """A step or epoch as the operator keeps it (a JSON-exact count), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53 else None


# --- the goodput ledger's clock -------------------------------------------------------------------
# report() also keeps, per process, where its time went from its first report on (status/goodput.py
# reads it back from the progress line's "timing"): the time between reports is step time
# (compute_s), the time ray.train.report spent persisting a checkpoint is checkpoint_s, and the
# time in restoring() is restore_s. compute_s + checkpoint_s is the time from the first report's
# entry to the last one's return, exactly: nothing of it is left uncounted. Times are this host's
# clock, in UNIX seconds. A line without "timing" (an older tputorch.train) still reads.
TIMING_KEYS = ("attempt", "at", "first", "compute_s", "checkpoint_s", "restore_s", "step_s", "checkpoint_step")


@dataclass
class StepClock:
    first: float | None = None  # when the first report() was entered: the end of the first step(s)
    last: float | None = None  # when the last report() returned
    compute_s: float = 0.0
    checkpoint_s: float = 0.0
    restore_s: float = 0.0
    step_s: float | None = None  # seconds per step over the steps between the last two reports
    last_step: int | None = None  # the last report's step
    checkpoint_step: int | None = None  # the step of the last checkpoint this process persisted

    def reported(self, entered: float, returned: float, step: int | None, saved: bool) -> None:
        """One report(): entered before ray.train.report, returned after it; ``saved``: it
        persisted a checkpoint, so its time in ray.train.report was the checkpoint's."""
        inside = max(0.0, returned - entered)
        between = 0.0 if self.last is None else max(0.0, entered - self.last)
        if self.first is None:
            self.first = entered
        self.compute_s += between + (0.0 if saved else inside)
        self.checkpoint_s += inside if saved else 0.0
        if step is not None and self.last_step is not None and step > self.last_step and between > 0:
            self.step_s = between / (step - self.last_step)
        if step is not None:
            self.last_step = step
            if saved:
                self.checkpoint_step = step
        self.last = returned

    def timing(self, attempt_number: int) -> dict[str, Any]:
        """The progress line's "timing" (empty before the first report)."""
        if self.first is None or self.last is None:
            return {}
        out = {"attempt": attempt_number, "at": round(self.last, 3), "first": round(self.first, 3),
               "compute_s": round(self.compute_s, 3), "checkpoint_s": round(self.checkpoint_s, 3),
               "restore_s": round(self.restore_s, 3)}
        if self.step_s is not None:
            out["step_s"] = round(self.step_s, 6)
        if self.checkpoint_step is not None:
            out["checkpoint_step"] = self.checkpoint_step
        return out


CLOCK = StepClock()  # this process's: report() and restoring() add to it


@contextlib.contextmanager
def restoring(environ: Mapping[str, str] | None = None):
    """``with restoring() as ckpt:`` in the training function, around loading the state from
    ``ckpt`` (checkpoint(): None on a first run): its time is the ledger's ``restore``."""
    started = time.time()
    try:
        yield checkpoint(environ)
    finally:
        CLOCK.restore_s += max(0.0, time.time() - started)


def progress_line(metrics: Mapping[str, Any], step: int | None = None, epoch: int | None = None,
                  checkpoint: str | None = None, timing: Mapping[str, Any] | None = None) -> str:
    """The line report() prints: step and epoch (from the arguments, else from ``metrics``), at
    most MAX_PROGRESS_METRICS finite numeric metrics whose names are short, the checkpoint's
    persisted path, and the process's timing (StepClock.timing). What does not fit the operator's
    limits is left out, never truncated."""
    step = count_of(metrics.get("step") if step is None else step)
    epoch = count_of(metrics.get("epoch") if epoch is None else epoch)
    numbers: dict[str, float | int] = {}
    for name, value in metrics.items():
        if len(numbers) >= MAX_PROGRESS_METRICS:
            break
        if name in ("step", "epoch") or not (isinstance(name, str) and 0 < len(name) <= MAX_METRIC_NAME):
            continue
        if hasattr(value, "item") and callable(value.item):  # a 0-d numpy/torch number
            try:
                value = value.item()
            except (TypeError, ValueError, RuntimeError):
                continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if isinstance(value, int) and abs(value) >= 2**53:
            value = float(value)
        numbers[name] = value
    record: dict[str, Any] = {"step": step, "epoch": epoch, "metrics": numbers}
    if checkpoint and len(checkpoint) <= MAX_CHECKPOINT_PATH:
        record["checkpoint"] = checkpoint
    if timing:
        record["timing"] = {k: timing[k] for k in TIMING_KEYS if k in timing}
    text = json.dumps(record, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_PROGRESS_LINE:  # long metric names: keep step, epoch, checkpoint
        record["metrics"] = {}
        text = json.dumps(record, separators=(",", ":"), sort_keys=True)
    return PROGRESS_MARKER + text


def checkpoint_uri(checkpoint: Any) -> str | None:
    """Where a persisted ``ray.train.Checkpoint`` is: its path with the scheme of its filesystem
    (pyarrow's GCS and S3 paths carry none), a local path as it is."""
    path = getattr(checkpoint, "path", None)
    if not isinstance(path, str) or not path:
        return None
    fs = getattr(getattr(checkpoint, "filesystem", None), "type_name", "")
    scheme = {"gcs": "gs://", "s3": "s3://", "hdfs": "hdfs://"}.get(fs, "")
    return path if "://" in path or not scheme else scheme + path


def report(metrics: dict[str, Any], checkpoint=None, *, step: int | None = None, epoch: int | None = None,
           **kwargs: Any) -> None:
    """``ray.train.report(metrics, checkpoint, **kwargs)``, and on world rank 0 one progress line
    for the operator (status.progress, status.lastCheckpoint). Call it on every worker, as
    ray.train.report. ``step``/``epoch`` default to ``metrics["step"]``/``metrics["epoch"]``;
    the checkpoint's path is the one Ray Train persisted it to (when rank 0 reports one). A
    checkpoint is stamped with the attempt that writes it (checkpoint() reads the stamp)."""
    import ray.train  # lazy: only training scripts have Ray

    dog = watchdog.of_this_process()  # spec.hangDetection's watchdog (None without it)
    if dog is not None:
        # ray.train.report() waits for every worker and uploads the checkpoint: a peer's hang shows in the
        # peer, a save may be long; only a report that outlasts every step's ceiling counts here.
        dog.reporting()
    if checkpoint is not None and os.environ.get(ENV_ATTEMPT):
        checkpoint.update_metadata(checkpoint_stamp())  # which attempt wrote it, and when (checkpoint())
    before = ray.train.get_checkpoint() if checkpoint is not None else None
    entered = time.time()
    ray.train.report(metrics, checkpoint=checkpoint, **kwargs)
    step_number = count_of(metrics.get("step") if step is None else step)
    CLOCK.reported(entered, time.time(), step_number, checkpoint is not None)
    rank = ray.train.get_context().get_world_rank()
    if dog is not None:
        dog.step_ended(rank, step_number)
    if rank != 0:
        return
    persisted = None
    if checkpoint is not None:
        after = ray.train.get_checkpoint()  # Ray Train's persisted copy, once uploaded
        if after is not None and after is not before and after is not checkpoint:
            persisted = checkpoint_uri(after)
    print(progress_line(metrics, step, epoch, persisted, CLOCK.timing(attempt())), flush=True)


def pause_hang_watchdog() -> None:
    """Disarm this worker's hang watchdog (watchdog.py) until its next report(): call it before a
    long phase that reports no step (a final evaluation or save) in a job with spec.hangDetection."""
    watchdog.pause()
