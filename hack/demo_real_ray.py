#!/usr/bin/env python3
"""`make demo REAL_RAY=1`: the demo's v6e 4x4 TPUTorchJob runs a real Ray Train job.

    demo_real_ray.py NAMESPACE JOB_YAML

Starts a real Ray 2.60 head on 127.0.0.1 with the job's four simulated TPU hosts
(tests/cluster/ray_backend.py), hands the namespace's dashboard calls to it (the local cluster's
stand-in dashboard forwards them and runs the submitter pod's `ray job submit` here), applies the
job with a small Ray Train V2 entrypoint (tests/cluster/realray_jobs/train_record.py, which takes
its shape from tputorch.train.scaling_config()), follows the TPUTorchJob to Succeeded and prints the
Ray job's own output. Ray is stopped at the end. Needs KUBECONFIG and TPUTORCH_DASHBOARD_URL
(eval "$(hack/cluster.sh env)") and an operator watching NAMESPACE.
"""

from __future__ import annotations

import json
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
        dashboard.set_backend(ns, ray.url)

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
        return 0 if phase == "Succeeded" else 1
    finally:
        ray.stop()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
