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
