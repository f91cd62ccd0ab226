"""Records what Ray 2.60's dashboard really answers for the tail of a job driver's log
(`GET /api/v0/logs/file?node_id=<driver node>&submission_id=<id>&lines=<n>`, the state API's
get_log, after `GET /api/jobs/<id>` for the driver's node), the calls the operator makes for a
running job's progress: the shape the stand-in dashboard replays
(hack/fakedash/recorded/driver-log.json).

A real head with a simulated v6e 2x2 host (tests/cluster/ray_backend.py) runs train_progress.py
with the environment the operator renders; recorded: the tail while the job runs (Ray Train
workers' report() lines as they reach the driver's log), once it has finished, and the answer for
a submission id the head does not know.

    .venv/bin/python tests/cluster/realray_jobs/record_driver_log.py hack/fakedash/recorded/driver-log.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from ray_backend import RealRay, http_json, wait  # noqa: E402

from tputorch import render  # noqa: E402
from tputorch.api import spec  # noqa: E402
from tputorch.train import PROGRESS_MARKER  # noqa: E402

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
LINES = 20


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with _no_proxy.open(urllib.request.Request(url), timeout=60) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def tail(url: str, submission_id: str, node: bool | str = True) -> dict:
    """The log tail as the operator asks for it: the job's driver node from its info, then the tail
    (`node=False`: without the node, which Ray 2.60 refuses; a string: that node)."""
    query = {"submission_id": submission_id, "lines": LINES}
    if node is True:
        code, _, raw = get(f"{url}/api/jobs/{submission_id}")
        node = (json.loads(raw) if code == 200 else {}).get("driver_node_id") or ""
    if node:
        query = {"node_id": node, **query}
    code, headers, body = get(f"{url}/api/v0/logs/file?{urllib.parse.urlencode(query)}")
    return {"query": query, "status": code,
            "headers": {k: headers[k] for k in ("Content-Type", "Content-Disposition") if headers.get(k)},
            "body": body.decode(errors="replace")}


def main(out: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="record-driver-log-"))
    gate, storage = work / "gate", work / "storage"
    gate.mkdir()
    body = {"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob",
            "metadata": {"name": "progress", "namespace": "ml", "uid": "0c0ffee0-0000-4000-8000-000000000000"},
            "spec": {"tpu": {"accelerator": "v6e", "topology": "2x2"}, "image": "example.com/ray-torch-tpu:2.60.0",
                     "entrypoint": f"python {HERE / 'train_progress.py'} --steps 3 --gate {gate}",
                     "checkpoint": {"storagePath": str(storage)}}}
    rayjob = render.rayjob(spec.parse(body))
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in head.get("env", []) if "value" in e}
    ray = RealRay(work).start()
    try:
        ray.attach(rayjob)
        sid = "progress-r3c0d"  # KubeRay's form: <rayjob>-<5 characters>
        http_json("POST", f"{ray.url}/api/jobs/", {"entrypoint": rayjob["spec"]["entrypoint"], "submission_id": sid,
                                                    "runtime_env": {"env_vars": env}}, 60)
        def reported():
            answer = tail(ray.url, sid)
            print(f"  {answer['status']}: {answer['body'][-300:]!r}", flush=True)
            return answer if PROGRESS_MARKER in answer["body"] else None
        running = wait(reported, 600, "the first progress line in the driver's log", interval=5)
        for step in (2, 3):
            (gate / f"step-{step}").touch()
        wait(lambda: ray.job(sid)["status"] in ("SUCCEEDED", "FAILED"), 600, "the job's end", interval=1)
        record = {"ray_version": ray.job(sid).get("driver_info", {}).get("ray_version") or "2.60.0",
                  "recorded": time.strftime("%Y-%m-%d"), "running": running, "finished": tail(ray.url, sid),
                  "unknown": tail(ray.url, "nobody-zzzzz", running["query"]["node_id"]),
                  "job_info_unknown": dict(zip(("status", "headers", "body"), (lambda r: (r[0], dict(r[1]), r[2].decode()))(
                      get(f"{ray.url}/api/jobs/nobody-zzzzz")))), "without_node": tail(ray.url, sid, node=False),
                  "job": ray.job(sid)["status"], "job_info_keys": sorted(ray.job(sid))}
    finally:
        ray.stop()
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"recorded into {out}: running {running['status']}, unknown {record['unknown']['status']}, job {record['job']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
