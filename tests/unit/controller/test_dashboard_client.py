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
        elif u.path.startswith("/api/v0/") and not u.path.startswith("/api/v0/logs/"):  # a state-API list
            code, body = answer
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
    with pytest.raises(DashboardError, match="job info: HTTP 404: Job nobody does not exist") as info:
        read(Dashboard(), "nobody")
    assert info.value.status == 404 and not info.value.token_refused  # only 401/403 try another token
    proxy.answers["demo-p3n4d"] = (None, b"")
    with pytest.raises(DashboardError, match="no driver node yet"):
        read(Dashboard(), "demo-p3n4d")
    proxy.answers["demo-wr0ng"] = ("abcdef0123456789", b"")  # the tail's own refusal
    with pytest.raises(DashboardError, match="HTTP 500: 500 Internal Server Error"):
        read(Dashboard(), "demo-wr0ng")


# --- what a real (or a tenant's) head may answer (issue 34) ----------------------------------------

class Heads(BaseHTTPRequestHandler):
    """Ray heads behind the proxy, each named by its cluster: "big" sends a 40 KB job info in 500-byte
    writes, "moved" redirects to "collector" (which records what it was sent), "slow-*" answer after
    1.5 s, any other answers at once."""
    protocol_version = "HTTP/1.1"
    sent_to_collector: list = []

    def log_message(self, *args):
        pass

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (BrokenPipeError, ConnectionResetError):  # a client that gave up on a slow head
            self.close_connection = True

    def do_GET(self):
        import time
        u = urllib.parse.urlsplit(self.path)
        host = u.hostname or ""
        if host.startswith("collector"):
            type(self).sent_to_collector.append(dict(self.headers))
        if host.startswith("slow-"):
            time.sleep(1.5)
        if host.startswith("moved-"):
            self.send_response(302)
            self.send_header("Location", "http://collector.example/api/jobs/demo-q8v2m")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if u.path.startswith("/api/jobs/"):
            info = {"driver_node_id": NODE, "entrypoint": "python train.py " + "x" * (40 * 1024 if host.startswith("big-") else 0)}
            body = json.dumps(info).encode()
        else:
            body = b"last line\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for at in range(0, len(body), 500):
            self.wfile.write(body[at:at + 500])
            self.wfile.flush()
            if host.startswith("big-"):
                time.sleep(0.002)


@pytest.fixture
def heads(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Heads)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    Heads.sent_to_collector = []
    yield Heads
    server.shutdown()
    server.server_close()


def read_from(dashboard: Dashboard, cluster: str, token: str | None = None):
    async def go():
        try:
            return await dashboard.driver_log("ml", cluster, "demo-q8v2m", token)
        finally:
            await dashboard.close()
    return asyncio.run(go())


def test_a_job_info_sent_in_many_small_writes_is_read_whole(heads):
    assert read_from(Dashboard(), "big-x7k2p") == "last line\n"


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else(heads):
    with pytest.raises(DashboardError, match="job info: HTTP 302: a redirect to 'http://collector.example/.*not followed"):
        read_from(Dashboard(), "moved-x7k2p", token="secret-token")
    assert heads.sent_to_collector == []


def slow_and_fast(dashboard: Dashboard, slow_heads: int):
    async def go():
        try:
            slow = [asyncio.create_task(dashboard.driver_log("ml", f"slow-{i}", "demo-q8v2m")) for i in range(slow_heads)]
            await asyncio.sleep(0.1)  # the slow ones hold their connections
            fast = await dashboard.driver_log("ml", "fast-x7k2p", "demo-q8v2m")
            return fast, await asyncio.gather(*slow, return_exceptions=True)
        finally:
            await dashboard.close()
    return asyncio.run(go())


def test_the_wait_for_a_slot_is_not_part_of_a_reads_timeout(heads):
    """Slow heads that held every connection made the wait for one count in the other reads'
    timeouts (one pool of 8, a total timeout): a fast head's read behind them timed out."""
    fast, results = slow_and_fast(Dashboard(timeout=0.5, slots=2), 4)  # two waves of slow ones ahead of it
    assert fast == "last line\n" and all(isinstance(r, asyncio.TimeoutError) for r in results)


def state(dashboard: Dashboard, what: str):
    async def go():
        try:
            return await dashboard.state("ml", "demo-x7k2p", what, "tok")
        finally:
            await dashboard.close()
    return asyncio.run(go())


def test_a_state_api_list_is_asked_with_details_and_taken_out_of_rays_envelope(proxy):
    groups = [{"placement_group_id": "pg1", "state": "CREATED", "bundles": []}]
    proxy.answers["placement_groups"] = (200, json.dumps({"result": True, "msg": "", "data": {"result": {
        "total": 1, "num_after_truncation": 1, "num_filtered": 1, "result": groups}}}).encode())
    assert state(Dashboard(), "placement_groups") == groups
    assert proxy.seen == ["http://demo-x7k2p-head-svc.ml.svc.cluster.local:8265/api/v0/placement_groups?detail=1&limit=1000"]


@pytest.mark.parametrize("answer, said", [
    ((404, b"Not Found"), "nodes: HTTP 404: Not Found"),
    ((200, b'{"data": {"result": {"result": {"a": 1}}}}'), "nodes: not a list"),
    ((200, b'{"data": {}}'), "nodes: not a state API answer"),
])
def test_a_state_api_answer_that_is_no_list_is_an_error(proxy, answer, said):
    proxy.answers["nodes"] = answer
    with pytest.raises(DashboardError, match=said):
        state(Dashboard(), "nodes")
