"""Ray's state API log tail for a job's driver (`GET /api/v0/logs/file?submission_id=<id>&lines=<n>`,
what the operator reads a running job's progress from), as the stand-in answers it for one
RayCluster: the log lines a test gave the job (control API `PUT /_control/jobs/<ns>/<rayjob>/log`),
in the shape the real Ray 2.60 head answers (recorded/driver-log.json, recorded by
tests/cluster/realray_jobs/record_driver_log.py): plain text with its headers, and for a
submission id the head does not know, its status and message. Called with the state lock held."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from .state import State, owner_name

RECORDED = Path(__file__).resolve().parent / "recorded" / "driver-log.json"
MAX_LINES = 10000  # kept per job


@functools.cache
def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def handle(state: State, method: str, media: str, query: dict, ns: str, cluster: str):
    """-> (HTTP status, {"_text", "_headers", "_rayjob"})."""
    shape = recorded()
    sid = query.get("submission_id") or ""
    job = state.cluster(ns, cluster)["jobs"].get(sid) if sid else None
    if not (query.get("node_id") or query.get("node_ip")):  # Ray 2.60 refuses it, whatever the id
        refused = shape["without_node"]
        return refused["status"], {"_text": refused["body"], "_headers": refused["headers"],
                                   "_rayjob": owner_name(sid) if sid else None}
    if method != "GET" or media != "file" or job is None:
        unknown = shape["unknown"]
        text = unknown["body"].replace(unknown["query"]["submission_id"], sid)
        return unknown["status"], {"_text": text, "_headers": unknown["headers"], "_rayjob": owner_name(sid) if sid else None}
    try:
        lines = int(query.get("lines", 1000))
    except ValueError:
        return 400, {"_text": f"lines {query.get('lines')!r} is not an integer", "_headers": {"Content-Type": "text/plain"}}
    log = job.get("log_lines") or []
    kept = log if lines < 0 else log[-lines:] if lines else []
    return 200, {"_text": "".join(line + "\n" for line in kept), "_headers": shape["running"]["headers"],
                 "_rayjob": job["rayjob"]}


def set_lines(job: dict, lines: list, append: bool) -> dict:
    """A test's driver log for this job (what its script printed), appended or replaced."""
    new = [str(line) for line in lines]
    job["log_lines"] = ((job.get("log_lines") or []) + new if append else new)[-MAX_LINES:]
    return {"submission_id": job["submission_id"], "lines": len(job["log_lines"])}
