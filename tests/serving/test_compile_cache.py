"""Issue 35, item 3: where vLLM 0.29 keeps what it compiles, so that the operator's
VLLM_CACHE_ROOT on the cache volume (model.cacheVolume) serves a second start. Run on vLLM's CPU
build (the serving venv) with compilation on, twice on one VLLM_CACHE_ROOT, each run with an empty
TORCHINDUCTOR_CACHE_DIR of its own: whatever the second start does not compile again it read from
VLLM_CACHE_ROOT. (The serving chain itself runs enforce_eager: compiling costs it ~20 s a start.)

On TPU, vllm-torchtpu keeps its XLA graphs under the same root; not measurable here."""

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))  # serving_chain, imported when a test runs (conftest.py)


def start(python: str, model: Path, root: Path, inductor: Path, cwd: Path) -> tuple[float, str]:
    import serving_chain

    env = {**os.environ, **serving_chain.vllm_env(python), "VLLM_CACHE_ROOT": str(root), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    run = subprocess.run([python, str(HERE / "compile_cache.py"), str(model)], capture_output=True, text=True,
                         env=env, timeout=900, cwd=cwd)
    lines = [line for line in run.stdout.splitlines() if line.startswith("COMPILE-CACHE ")]
    assert run.returncode == 0 and lines, f"compile_cache.py failed ({run.returncode}): {run.stderr[-5000:]}"
    return json.loads(lines[-1][len("COMPILE-CACHE "):])["init_s"], run.stdout + run.stderr


def kernels(root: Path) -> dict[str, int]:
    """The compiled kernels (shared objects) under a directory, with their modification times."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*.so")}


def test_a_second_start_reuses_the_first_starts_compiled_kernels_from_vllm_cache_root(chain, tmp_path):
    python, model = chain
    root = tmp_path / "volume" / "vllm" / "v6e-2x2"  # as model.cacheVolume sets it
    cold_s, _ = start(python, model, root, tmp_path / "inductor-1", tmp_path)
    first = kernels(root)
    assert first and all(k.startswith("torch_compile_cache/") for k in first), sorted(first)
    assert not kernels(tmp_path / "inductor-1"), "the kernels went to torch's own cache, not VLLM_CACHE_ROOT"
    warm_s, log = start(python, model, root, tmp_path / "inductor-2", tmp_path)
    # Every kernel of the first start served the second: none compiled again, none added.
    assert kernels(root) == first
    assert not kernels(tmp_path / "inductor-2")
    # vLLM 0.29's CPU build fails to load its whole-graph (AOT) cache and traces the graph again
    # ("Compiling model again due to a load failure ... 'finalize_loading'"); the kernels above are
    # what it reuses all the same. Seen here so that a vLLM that fixes it shows up.
    aot_reloaded = "Compiling model again due to a load failure" not in log
    print(f"compile cache: cold start {cold_s} s, warm start {warm_s} s, {len(first)} kernels reused, "
          f"whole-graph cache {'loaded' if aot_reloaded else 'not loaded (vLLM 0.29 CPU)'}")
