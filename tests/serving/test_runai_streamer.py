"""Issue 37: a gs:// spec.model.source streamed by vLLM's Run:ai streamer (load_format runai_streamer,
the operator's default for gs://) instead of downloaded to every host's disk. vLLM 0.29's CPU build
(the serving venv, which has runai-model-streamer[gcs]) serves the tiny model from the stand-in GCS
(fakegcs.py) as the operator renders the service: the model Ray Serve LLM 2.60 hands vLLM for that
llm_config is the bucket URI, every byte of the safetensors is fetched from the bucket exactly once,
and no file holding the weights is written anywhere the engine may write (HOME, HF_HOME,
VLLM_CACHE_ROOT, TMPDIR).

What the streamer does with GCS (runai-model-streamer 0.17.1): its Python half lists the folder and
pulls config.json and the tokenizer's files into $VLLM_ASSETS_CACHE/model_streamer/<hash> with
google-cloud-storage (credentials: google-auth's default, the metadata server's token on GKE); its
C++ half (google-cloud-cpp 2.37) reads the safetensors in ranged GETs straight into memory. That C++
client reads anonymously whenever CLOUD_STORAGE_EMULATOR_ENDPOINT is set (as here: the stand-in's
bucket is public for it); on GKE it takes Google's default credentials, the metadata server's token."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "cluster"))
sys.path.insert(0, str(HERE))

import fakegcs  # noqa: E402
from tputorch import render  # noqa: E402
from tputorch.api import spec  # noqa: E402

BUCKET, FOLDER = "models", "tiny"
WEIGHTS = f"{BUCKET}/{FOLDER}/model.safetensors"  # as FakeGcs.media_bytes() keys it


def rendered_llm_config(source: str) -> dict:
    """The llm_config the operator writes for a service of this source streamed with the Run:ai
    streamer (engine.args.load_format, as docs/tasks/serving.md says to set it), as much of it as a CPU
    engine takes: the model's loading config and the load_format (the rest is the TPU slice's)."""
    body = {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService",
            "metadata": {"name": "tiny", "namespace": "ml", "uid": "u", "generation": 1},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/serve:1",
                     "model": {"source": source, "name": FOLDER}, "engine": {"args": {"load_format": "runai_streamer"}}}}
    serve = yaml.safe_load(render.rayservice(spec.parse_service(body))["spec"]["serveConfigV2"])
    (cfg,) = serve["applications"][0]["args"]["llm_configs"]
    return {"model_loading_config": cfg["model_loading_config"],
            "engine_kwargs": {"load_format": cfg["engine_kwargs"]["load_format"]}}


def fetched_ranges(log: list[dict], bucket: str, name: str) -> list[tuple[int, int]]:
    """The [start, end) byte ranges of an object's content that the stand-in sent, sorted."""
    ranges = []
    for r in log:
        b, _, obj = r["path"].removeprefix("/download").removeprefix("/storage/v1/b/").partition("/o/")
        if (b, urllib.parse.unquote(obj)) == (bucket, name) and r["bytes"]:
            start = int(r["range"].removeprefix("bytes=").split("-")[0]) if r["range"] else 0
            ranges.append((start, start + r["bytes"]))
    return sorted(ranges)


def written_weights(roots: list[Path], size: int) -> list[str]:
    """Files under the roots that could hold the checkpoint: safetensors, or as large as half of it."""
    return [str(p) for root in roots if root.exists() for p in root.rglob("*")
            if p.is_file() and (p.suffix == ".safetensors" or p.stat().st_size >= size // 2)]


def test_vllm_streams_a_gs_model_with_every_weight_byte_fetched_once_and_none_written(chain, tmp_path):
    import serving_chain  # when the test runs, not when it is collected (as conftest's chain does)

    python, model = chain
    shutil.copytree(model, tmp_path / "bucket" / FOLDER)
    size = (model / "model.safetensors").stat().st_size
    llm_config = rendered_llm_config(f"gs://{BUCKET}/{FOLDER}")
    assert llm_config["engine_kwargs"]["load_format"] == "runai_streamer"

    scratch = {name: tmp_path / name for name in ("home", "hf-home", "vllm-cache", "tmp")}
    for d in scratch.values():
        d.mkdir()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("GOOGLE_", "GCE_", "CLOUD_STORAGE", "STORAGE_EMULATOR", "XDG_", "VLLM_ASSETS"))}
    with fakegcs.FakeGcs({BUCKET: tmp_path / "bucket"}, public=(BUCKET,)) as gcs:
        env = {**base, **serving_chain.vllm_env(python), **gcs.client_env(), "HOME": str(scratch["home"]),
               "HF_HOME": str(scratch["hf-home"]), "VLLM_CACHE_ROOT": str(scratch["vllm-cache"]), "TMPDIR": str(scratch["tmp"])}
        t0 = time.monotonic()
        run = subprocess.run([python, str(HERE / "runai_streamer.py"), json.dumps(llm_config)], capture_output=True,
                             text=True, env=env, timeout=600, cwd=scratch["tmp"])
        wall_s = time.monotonic() - t0
        log, media = gcs.log(), gcs.media_bytes()
    lines = [line for line in run.stdout.splitlines() if line.startswith("RUNAI-STREAMER ")]
    assert run.returncode == 0 and lines, f"runai_streamer.py failed ({run.returncode}): {run.stderr[-5000:]}"
    out = json.loads(lines[-1][len("RUNAI-STREAMER "):])

    # Ray Serve LLM handed vLLM the bucket, not a local copy, and the engine answered.
    assert out["model"] == f"gs://{BUCKET}/{FOLDER}" and out["tokens"] >= 1, out
    # Every byte of the weights came from the bucket once: the ranges sent tile the object exactly.
    ranges = fetched_ranges(log, BUCKET, f"{FOLDER}/model.safetensors")
    assert media[WEIGHTS] == size, media
    assert ranges[0][0] == 0 and ranges[-1][1] == size and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges
    # The small files (config, tokenizer) were pulled, the weights never written to a disk.
    assert {"config.json", "tokenizer.json"} <= {k.rsplit("/", 1)[1] for k in media}, media
    assert written_weights(list(scratch.values()), size) == []
    # The Python half's calls carry the metadata server's token; the C++ reads are anonymous here
    # only because CLOUD_STORAGE_EMULATOR_ENDPOINT makes google-cloud-cpp so (module docstring).
    downloads = [r for r in log if r["path"].startswith("/download/")]
    assert downloads and all(r["auth"] == f"Bearer {fakegcs.TOKEN}" for r in downloads), downloads
    # vLLM pulls the small files twice into one directory: the model's (*.json, *.model, *.py), then
    # the tokenizer's (all but weights). Reported, not asserted: a few KB, vLLM's own business.
    sizes = {f"{BUCKET}/{FOLDER}/{p.name}": p.stat().st_size for p in model.iterdir()}
    small = {k.rsplit("/", 1)[1]: f"{v} B ({v / sizes[k]:g}x)" for k, v in media.items() if k != WEIGHTS}
    print(f"runai streamer: engine up in {out['init_s']} s (run {wall_s:.1f} s); {WEIGHTS} {media[WEIGHTS]} bytes "
          f"in {len(ranges)} ranged GETs, each byte once; small files {small}")
