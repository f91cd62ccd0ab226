"""The operator's Ray dashboard client (controller/dashboard.py): the driver log's tail, asked of
the head Service's dashboard through the proxy the environment names (as the local cluster's
stand-in dashboard is reached), bounded in size, an error for anything but 200."""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tputorch.controller.dashboard import Dashboard, DashboardError


class Proxy(BaseHTTPRequestHandler):
    answers: dict = {}
    seen: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        type(self).seen.append(self.path)
        u = urllib.parse.urlsplit(self.path)
        code, body = type(self).answers.get(dict(urllib.parse.parse_qsl(u.query)).get("submission_id"),
                                            (500, b"no such job"))
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


def test_the_tail_is_asked_of_the_head_services_dashboard_and_bounded(proxy):
    proxy.answers["demo-q8v2m"] = (200, b"old line\n" * 1000 + b"last line\n")
    text = read(Dashboard(lines=50, max_bytes=100), "demo-q8v2m")
    assert text.endswith("last line\n") and len(text) == 100
    assert proxy.seen == ["http://demo-x7k2p-head-svc.ml.svc.cluster.local:8265/api/v0/logs/file?"
                          "submission_id=demo-q8v2m&lines=50"]


def test_an_answer_other_than_200_is_an_error_naming_it(proxy):
    with pytest.raises(DashboardError, match="HTTP 500: no such job"):
        read(Dashboard(), "unknown")
