"""Readiness: whether the operator holds a full view of what it decides from, and which store it
lacks. kopf's /healthz is liveness (the loop answers, the election holds): a store that cannot be
listed (a Kueue conversion webhook left behind answers 500) is no reason to restart the process,
but it is one not to count the replica as ready (a rolling update then keeps the working ones).
"""

from __future__ import annotations

from typing import Iterable


def describe(store) -> str:
    """A store by name, with why its last list failed when it did."""
    error = getattr(store, "list_error", None)
    return f"{store.what} ({error})" if error else store.what


def not_listed(stores: Iterable) -> list:
    return [s for s in stores if not s.synced.is_set()]


def readiness(required: Iterable, optional: Iterable) -> tuple[bool, str]:
    """(ready, what it says): not ready while a store the reconcile needs (the kinds, their
    children, pods) has never been listed; a missing optional store (Kueue's, NetworkPolicies)
    is named but keeps the replica ready, as the operator runs without it."""
    lacking, degraded = not_listed(required), not_listed(optional)
    lines = [f"not listed (required): {describe(s)}" for s in lacking]
    lines += [f"not listed (optional, running without): {describe(s)}" for s in degraded]
    return not lacking, "\n".join(lines) or "every store listed"


async def serve(host: str, port: int, path: str, check):
    """Serve ``check() -> (ready, text)`` at ``path``: 200 when ready, else 503; returns the aiohttp
    runner (``cleanup()`` stops it)."""
    from aiohttp import web

    async def handle(_request):
        ready, text = check()
        return web.Response(status=200 if ready else 503, text=text + "\n")

    app = web.Application()
    app.router.add_get(path, handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
