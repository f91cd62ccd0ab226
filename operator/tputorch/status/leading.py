"""The conditions every object's status starts with, whatever its kind: its spec is valid, its
child exists, that child still asks for Ray token auth, Kueue admitted it, its NetworkPolicy was
made. They come before the slice's, in this order, for a TPUTorchJob and a TPUTorchService alike,
so both derivations take them from here. Pure functions.
"""

from __future__ import annotations

from . import auth
from . import network as net
from ..api.phases import STORAGE_IDENTITY, VALIDATED
from .conditions import DEFAULT_SERVICE_ACCOUNT, STORAGE_ACCESS_DENIED, admitted_condition, child_created, condition
from .kueue import Admission


def leading_conditions(shape: str, created_type: str, child_kind: str, name: str, child: dict | None,
                       problem: tuple[str, str] | None, own_ray_token: bool, queue: Admission | None,
                       network: net.NetworkPolicyState | None, generation: int,
                       identity_warning: str | None = None, storage_denied: str | None = None) -> list[dict]:
    """Validated (``shape``: what the spec asks for), <Child>Created, RayAuth (when the stored child
    lost it), Admitted (with spec.queueName), NetworkPolicyReady (when the operator makes one) and
    StorageIdentity=False (``storage_denied``: Cloud Storage answered a pod 403, status/storage_access.py;
    else when the spec reaches Cloud Storage as the namespace's default account: on GKE a 403 after
    the slice is provisioned, unless that account is bound on purpose)."""
    conditions = [condition(VALIDATED, True, "Valid", shape, generation),
                  child_created(created_type, child_kind, name, child, problem, generation)]
    ray_auth = auth.ray_auth_condition(child_kind, child, own_ray_token, generation)
    if ray_auth is not None:
        conditions.append(ray_auth)
    if queue is not None:
        conditions.append(admitted_condition(queue, generation))
    if network is not None:
        conditions.append(net.ready_condition(network, generation))
    if storage_denied is not None:
        conditions.append(condition(STORAGE_IDENTITY, False, STORAGE_ACCESS_DENIED, storage_denied, generation))
    elif identity_warning is not None:
        conditions.append(condition(STORAGE_IDENTITY, False, DEFAULT_SERVICE_ACCOUNT, identity_warning, generation))
    return conditions
