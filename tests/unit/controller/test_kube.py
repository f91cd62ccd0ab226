"""The API adapter's own pieces that need no API server."""

from types import SimpleNamespace

from tputorch.controller.kube import throttle_credential_refresh


def test_the_credential_refresh_runs_at_most_once_per_interval_and_stays_throttled():
    runs, t = [], [0.0]

    def loader_hook(cfg):  # as kubernetes.config's loaders do: refresh, then install a new hook
        runs.append(t[0])
        cfg.refresh_api_key_hook = lambda c: loader_hook(c)
    cfg = SimpleNamespace(refresh_api_key_hook=loader_hook)
    throttle_credential_refresh(cfg, 10.0, clock=lambda: t[0])
    for now in (0.0, 0.1, 9.9, 10.0, 15.0, 20.5, 20.6):
        t[0] = now
        cfg.refresh_api_key_hook(cfg)
    assert runs == [0.0, 10.0, 20.5]


def test_no_hook_no_throttle():
    cfg = SimpleNamespace(refresh_api_key_hook=None)
    throttle_credential_refresh(cfg)
    assert cfg.refresh_api_key_hook is None


def test_a_call_is_sent_once_not_again_by_urllib3_within_its_fence():
    """Issue 34: the write fence bounded each urllib3 attempt, and urllib3 retried: a fenced DELETE
    to an API server that dropped the connection ran 4x its budget. One attempt; the reconcile
    retries with backoff, and a new attempt is fenced anew."""
    import asyncio
    import socket
    import threading

    from kubernetes import client

    from tputorch.controller.kind import RAYJOB
    from tputorch.controller.kube import Kube

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []

    def drop_every_connection():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()
    threading.Thread(target=drop_every_connection, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
    configuration.proxy = None
    kube = Kube(configuration, 1, 1, fence=lambda: 5.0)
    try:
        try:
            asyncio.run(kube.delete(RAYJOB, "ml", "demo", "uid-1"))
        except Exception:  # noqa: BLE001 - the dropped connection, however urllib3 names it
            pass
        assert len(accepted) == 1
    finally:
        server.close()
        kube.pool.shutdown()


def test_writes_go_out_as_json_and_answers_come_back_parsed_or_raw():
    """Issue 40: RawApi sends a body as json.dumps makes it (not through the client's sanitize
    walk) under the content type each write needs, and an answer other than 2xx is an ApiException."""
    import asyncio
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import pytest
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from tputorch.controller.kind import RAYJOB, TPUTORCHJOB
    from tputorch.controller.kube import Kube

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, self.headers.get("Content-Type"), json.loads(body) if body else None))
            status = 409 if self.path.endswith("/taken") or "taken" in body.decode() else 200
            data = json.dumps({"kind": "Status", "message": "exists"} if status == 409 else
                              {"metadata": {"name": "a", "uid": "u-1"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        do_POST = do_PATCH = do_GET = do_DELETE = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    configuration.proxy = None
    kube = Kube(configuration, 1, 1)
    try:
        created = asyncio.run(kube.create(RAYJOB, "ml", {"metadata": {"name": "a"}, "spec": {"n": [1, "x"]}}))
        assert created == {"metadata": {"name": "a", "uid": "u-1"}}
        asyncio.run(kube.patch(RAYJOB, "ml", "a", {"spec": {"suspend": False}}))
        asyncio.run(kube.patch(RAYJOB, "ml", "a", [{"op": "test", "path": "/metadata/uid", "value": "u-1"}]))
        asyncio.run(kube.patch_status(TPUTORCHJOB, "ml", "a", {"phase": "Running"}, uid="u-1"))
        asyncio.run(kube.create_secret("ml", {"metadata": {"name": "s"}, "stringData": {"t": "x"}}))
        assert asyncio.run(kube.get(RAYJOB, "ml", "a"))["metadata"]["uid"] == "u-1"
        with pytest.raises(ApiException) as refused:
            asyncio.run(kube.create(RAYJOB, "ml", {"metadata": {"name": "taken"}}))
        assert refused.value.status == 409 and "exists" in refused.value.body
    finally:
        server.shutdown()
        kube.pool.shutdown()
        kube.report_pool.shutdown()
    assert seen[0] == ("POST", "/apis/ray.io/v1/namespaces/ml/rayjobs", "application/json",
                       {"metadata": {"name": "a"}, "spec": {"n": [1, "x"]}})
    assert seen[1][:3] == ("PATCH", "/apis/ray.io/v1/namespaces/ml/rayjobs/a", "application/merge-patch+json")
    assert seen[2][2] == "application/json-patch+json"
    assert seen[3][:3] == ("PATCH", "/apis/tputorch.io/v1alpha1/namespaces/ml/tputorchjobs/a/status",
                           "application/json-patch+json")
    assert seen[3][3][0] == {"op": "test", "path": "/metadata/uid", "value": "u-1"}
    assert seen[4][:2] == ("POST", "/api/v1/namespaces/ml/secrets")
    assert seen[5][:2] == ("GET", "/apis/ray.io/v1/namespaces/ml/rayjobs/a") and seen[5][3] is None
