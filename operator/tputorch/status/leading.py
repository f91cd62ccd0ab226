"""The conditions every object's status starts with, whatever its kind: its spec is valid, its
child exists, that child still asks for Ray token auth, Kueue admitted it, its NetworkPolicy was
made. They come before the slice's, in this order, for a TPUTorchJob and a TPUTorchService alike,
so both derivations take them from here. Pure functions.
"""

from __future__ import annotations

from . import auth
from . import network as net
from ..api.phases import VALIDATED
from .conditions import admitted_condition, child_created, condition
from .kueue import Admission


def leading_conditions(shape: str, created_type: str, child_kind: str, name: str, child: dict | None,
                       problem: tuple[str, str] | None, own_ray_token: bool, queue: Admission | None,
                       network: net.NetworkPolicyState | None, generation: int) -> list[dict]:
    """Validated (``shape``: what the spec asks for), <Child>Created, RayAuth (when the stored child
    lost it), Admitted (with spec.queueName) and NetworkPolicyReady (when the operator makes one)."""
    conditions = [condition(VALIDATED, True, "Valid", shape, generation),
                  child_created(created_type, child_kind, name, child, problem, generation)]
    ray_auth = auth.ray_auth_condition(child_kind, child, own_ray_token, generation)
    if ray_auth is not None:
        conditions.append(ray_auth)
    if queue is not None:
        conditions.append(admitted_condition(queue, generation))
    if network is not None:
        conditions.append(net.ready_condition(network, generation))
    return conditions
