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

    from tputorch.controller.kinds import RAYJOB
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
