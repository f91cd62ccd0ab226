"""The operator's Ray dashboard client (controller/dashboard.py): the driver log's tail, asked of
the head Service's dashboard through the proxy the environment names (as the local cluster's
stand-in dashboard is reached), bounded in size, an error for anything but 200."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tputorch.controller.dashboard import Dashboard, DashboardError


NODE = "6bbfb3cf6251bde8ce8a2905c6276b6954f9ad3eb308d37906c5eca6"


class Proxy(BaseHTTPRequestHandler):
    """Answers as a Ray head's dashboard behind the proxy: a job's info, and its driver log's tail
    for its driver's node only (Ray 2.60 refuses the tail without a node)."""
    answers: dict = {}
    seen: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        type(self).seen.append(self.path)
        u = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(u.query))
        answer = type(self).answers.get(query.get("submission_id") or u.path.rsplit("/", 1)[-1])
        if answer is None:
            code, body = 404, b"Job nobody does not exist."
        elif u.path.startswith("/api/jobs/"):
            code, body = 200, json.dumps({"status": "RUNNING", "driver_node_id": answer[0]}).encode()
        elif query.get("node_id") != NODE:
            code, body = 500, b"500 Internal Server Error\n\nServer got itself in trouble"
        else:
            code, body = 200, answer[1]
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def proxy(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    Proxy.seen, Proxy.answers = [], {}
    yield Proxy
    server.shutdown()
    server.server_close()


def read(dashboard: Dashboard, sid: str):
    async def go():
        try:
            return await dashboard.driver_log("ml", "demo-x7k2p", sid)
        finally:
            await dashboard.close()
    return asyncio.run(go())


def test_the_tail_is_asked_of_the_head_services_dashboard_for_the_drivers_node_and_bounded(proxy):
    proxy.answers["demo-q8v2m"] = (NODE, b"old line\n" * 1000 + b"last line\n")
    text = read(Dashboard(lines=50, max_bytes=100), "demo-q8v2m")
    assert text.endswith("last line\n") and len(text) == 100
    base = "http://demo-x7k2p-head-svc.ml.svc.cluster.local:8265"
    assert proxy.seen == [f"{base}/api/jobs/demo-q8v2m",
                          f"{base}/api/v0/logs/file?node_id={NODE}&submission_id=demo-q8v2m&lines=50"]


def test_an_unknown_job_or_one_without_a_driver_yet_is_an_error_naming_it(proxy):
    with pytest.raises(DashboardError, match="job info: HTTP 404: Job nobody does not exist"):
        read(Dashboard(), "nobody")
    proxy.answers["demo-p3n4d"] = (None, b"")
    with pytest.raises(DashboardError, match="no driver node yet"):
        read(Dashboard(), "demo-p3n4d")
    proxy.answers["demo-wr0ng"] = ("abcdef0123456789", b"")  # the tail's own refusal
    with pytest.raises(DashboardError, match="HTTP 500: 500 Internal Server Error"):
        read(Dashboard(), "demo-wr0ng")
