"""Step, once at startup: whether the cluster's TPUTorchJob and TPUTorchService CRDs are this
release's (api/crd.py's outdated()). Helm never upgrades a chart's crds/: after a `helm upgrade`
they stay the previous release's until applied by hand, and the API server then prunes or refuses
what only this release's schema has (a spec field added since is dropped without a word). The
operator runs on, its status writes being of a shape both schemas accept
(tests/unit/api/test_crd_upgrade.py), and says what to apply in its log and in a Warning Event on
its own Pod; `tputorch doctor` fails the same way."""

from __future__ import annotations

import logging
import os
from typing import Awaitable, Callable

from ..api import crd
from ..status.conditions import Event

log = logging.getLogger("tputorch")

REASON = "CRDsOutdated"


def own_pod() -> dict | None:
    """The operator's Pod as an Event's ``regarding`` (the chart passes POD_NAME and POD_NAMESPACE);
    None outside a Pod."""
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not name or not namespace:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}


async def check(read: Callable[[str], Awaitable[dict | None]], record: Callable[[dict, list], None],
                pod: dict | None) -> list[str]:
    """Read each of our CRDs (``read(name)``: the CRD, None when not installed; it raises when the
    CRD cannot be read) and say, for each one not this release's, why and what to apply: a log
    warning, and a Warning Event on ``pod`` through ``record`` (the event recorder's). The messages said."""
    said = []
    for name, kind in crd.NAMES.items():
        try:
            installed = await read(name)
        except Exception as err:  # a courtesy check: the operator runs without it
            log.warning("could not read the CRD %s to check it is tputorch-operator %s's: %s", name, crd.RELEASE, err)
            continue
        why = f"the {kind} CRD ({name}) is not installed" if installed is None else crd.outdated(installed)
        if why is None:
            continue
        message = f"{why}. To fix: {crd.apply_commands()}"
        said.append(message)
        log.warning("%s", message)
        if pod is not None:
            record(pod, [Event("Warning", REASON, message)])
    return said
