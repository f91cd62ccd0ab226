"""JobSpec -> KubeRay RayJob, ServiceSpec -> KubeRay RayService. Pure and deterministic.

Decisions live in the modules, one object each (job.py, service.py and network.py beside
api/ and status/'s of the same name); the objects' shapes live in templates/ (the RayCluster
both kinds run on is one macro, templates/_cluster.json.j2):

- names.py: the labels and annotations the operator writes and reads back, and their values
- raytoken.py: Ray's token auth (authOptions) and a child's token Secret
- env.py: the environment of the Ray containers (a job's Ray Train shape, a service's vLLM)
- volumes.py: spec.volumes and spec.gcsFuseSidecar in a pod (volumes, mounts, GKE's annotations, disk)
- cluster.py: the RayCluster of either kind (head, TPU worker group, resources, autoscaler)
- groups.py: a job's spec.groups, the extra worker groups of its RayCluster
- job.py: the RayJob (its submitter and cluster)
- serveconfig.py: Ray Serve's config of a service (serveConfigV2)
- service.py: the RayService, and the patches that bring a live one (and its RayCluster) to it
- network.py: the NetworkPolicy of a Ray cluster
- output.py: the templates, the size limit of a child, its spec hash, YAML for the CLI
- stamp.py: the record a child keeps of the rendering it was made with (the upgrade rule)

The package's entry points are here, a spec in and its child out (what the controller, the CLI,
the tests and the benchmarks call): rayjob, rayservice, and render_any for either kind.
"""

from __future__ import annotations

from ..api.spec import ServiceSpec
from .job import rayjob
from .names import Spec
from .service import rayservice

__all__ = ["rayjob", "rayservice", "render_any"]


def render_any(spec: Spec) -> dict:
    """The child of either kind."""
    return rayservice(spec) if isinstance(spec, ServiceSpec) else rayjob(spec)
