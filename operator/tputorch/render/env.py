"""The environment of every Ray container: a job's Ray Train shape (read by train.py), a service's
vLLM-on-TPU settings."""

from __future__ import annotations

import json

from .. import train, watchdog
from ..api import topology
from ..api.service import cache_env
from ..api.spec import HF_TOKEN_ENV, JobSpec, ServiceSpec
from . import groups as _groups

def attempt_env(attempt: int, started: str | None) -> list[dict]:
    """Which attempt the script runs in, and (from attempt 2 on) when its RayJob was created: what
    train.checkpoint() tells an earlier attempt's late checkpoint by."""
    return [{"name": train.ENV_ATTEMPT, "value": str(attempt)}] + \
        ([{"name": train.ENV_ATTEMPT_STARTED, "value": started}] if started else [])


def started_of(rayjob: dict) -> str | None:
    """The attempt's start a rendered RayJob carries (attempt_env), from its head container."""
    head = (((rayjob.get("spec") or {}).get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template") or {}
    for container in (head.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == train.ENV_ATTEMPT_STARTED:
                return env.get("value")
    return None


def slice_env(job: JobSpec, attempt: int = 1, started: str | None = None) -> list[dict]:
    """The environment that hands the Ray Train shape to the user's script (read by train.py), and
    the attempt it runs in (attempt_env)."""
    s = job.slice
    return [
        {"name": train.ENV_JOB_NAME, "value": job.name},
        {"name": train.ENV_NUM_WORKERS, "value": str(job.workers)},
        {"name": train.ENV_TOPOLOGY, "value": s.topology},
        {"name": train.ENV_ACCELERATOR_TYPE, "value": s.generation.ray_accelerator_type},
        {"name": train.ENV_CHIPS_PER_WORKER, "value": str(job.chips_per_worker)},
        {"name": train.ENV_NUM_HOSTS, "value": str(s.hosts)},
        {"name": train.ENV_CHIPS_PER_HOST, "value": str(s.chips_per_host)},
        {"name": train.ENV_RUN_NAME, "value": job.run_name},
        {"name": train.ENV_WORKER_RETRIES, "value": str(job.worker_retries)},
        *attempt_env(attempt, started),
    ] + ([{"name": train.ENV_STORAGE_PATH, "value": job.storage_path}] if job.storage_path else []) + \
        _groups.groups_env(job) + hang_env(job)


def hang_env(job: JobSpec) -> list[dict]:
    """spec.hangDetection for the workers' watchdog (watchdog.py) (nothing without it: such a job renders as before)."""
    h = job.hang_detection
    if h is None:
        return []
    value = {"timeoutSeconds": h.timeout_s, "firstStepTimeoutSeconds": h.first_step_timeout_s,
             "stepTimeMultiple": h.step_time_multiple}
    return [{"name": watchdog.ENV_HANG_DETECTION, "value": json.dumps(value, separators=(",", ":"), sort_keys=True)}]


def serving_env(svc: ServiceSpec) -> list[dict]:
    """What vLLM on a TPU slice needs in the environment of every Ray node."""
    # vllm-torchtpu 0.29 picks its executor from this on every slice, one host or many: "ray" runs
    # the engine on the slice's per-host bundles; unset, it runs inside the Serve replica's process.
    env = [{"name": "TPU_MULTIHOST_BACKEND", "value": "ray"},
           # and builds its mesh from this (the Ray executor's own table lacks some slices).
           {"name": "TORCH_TPU_TOPOLOGY", "value": topology.torch_tpu_topology(svc.slice)}]
    per_chip = topology.ray_tpu_resource_per_chip(svc.slice.generation, serving=True)
    if per_chip is not None:
        env.append({"name": topology.RAY_TPU_RESOURCE_PER_CHIP, "value": str(per_chip)})
    if svc.hf_token_secret:
        name, key = svc.hf_token_secret
        env.append({"name": HF_TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    if svc.cache_path:
        env += [{"name": k, "value": v} for k, v in cache_env(svc.cache_path, svc.slice).items()]
    return env
