"""The informers' stores the reconcile's steps read (each step is given this one object, so that a
store set after the controller was made, as the handlers do, is seen by every step)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .informer import Informer


@dataclass
class Stores:
    parents: dict[str, Informer]  # kind -> its objects' informer
    children: dict[str, Informer]  # kind -> its children's (RayJobs, RayServices)
    pods: Informer | None
    workloads: Informer | None = None  # None: Kueue is not read
    priority_classes: Informer | None = None
    workload_crd: Informer | None = None  # Kueue's Workload CRD (its pod-set cap); None: not read
    extras: dict[str, Informer] = field(default_factory=dict)  # resource plural -> its informer
