"""Helper for training scripts: the Ray Train scaling config for the slice the operator rendered.

The operator puts the slice's shape into every Ray container's environment (see ``render.py``);
this module turns it back into ``ray.train.ScalingConfig`` so a script carries no TPU numbers.
Ray is imported lazily: the operator process imports this package but never Ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

# The environment contract between render.py (writer) and this module (reader).
ENV_NUM_WORKERS = "TPUTORCH_NUM_WORKERS"
ENV_TOPOLOGY = "TPUTORCH_TOPOLOGY"
ENV_ACCELERATOR_TYPE = "TPUTORCH_ACCELERATOR_TYPE"
ENV_CHIPS_PER_WORKER = "TPUTORCH_CHIPS_PER_WORKER"
ENV_NUM_HOSTS = "TPUTORCH_NUM_HOSTS"
ENV_CHIPS_PER_HOST = "TPUTORCH_CHIPS_PER_HOST"
ENV_JOB_NAME = "TPUTORCH_JOB_NAME"


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

    def scaling_config_kwargs(self) -> dict[str, Any]:
        return {
            "use_tpu": True,
            "num_workers": self.num_workers,
            "topology": self.topology,
            "accelerator_type": self.accelerator_type,
            "resources_per_worker": {"TPU": self.chips_per_worker},
        }


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

    kwargs: dict[str, Any] = {"num_workers": slice_shape(environ).num_workers}
    kwargs.update(overrides)
    if kwargs.get("use_tpu") or kwargs.get("use_gpu"):
        raise ValueError("cpu_scaling_config() runs on CPUs only: use scaling_config() for the slice's TPUs")
    return ScalingConfig(**kwargs)
