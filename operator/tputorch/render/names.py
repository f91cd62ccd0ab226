"""The vocabulary a child and its pods carry: the operator's labels and annotations, Kueue's labels
(from the spec alone), the names of the worker group, Serve app and port, and the labels of a child
and its Ray pods."""

from __future__ import annotations

from ..api.spec import JobSpec, ServiceSpec

MANAGED_BY = "tputorch-operator"
JOB_LABEL = "tputorch.io/job"
SERVICE_LABEL = "tputorch.io/service"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# Kueue's labels on the child: the LocalQueue and the WorkloadPriorityClass. They come from the spec
# alone (spec.queueName, spec.priorityClassName): one from metadata.labels would let a user pick any
# queue or cluster-wide priority past the spec's rules.
KUEUE_LABEL_PREFIX = "kueue.x-k8s.io/"
QUEUE_LABEL = KUEUE_LABEL_PREFIX + "queue-name"
PRIORITY_CLASS_LABEL = KUEUE_LABEL_PREFIX + "priority-class"
# On a queued autoscaled RayService (Kueue >= 0.18, its ElasticJobsViaWorkloadSlices gate): Kueue admits
# Ray's autoscaler on it and admits each scale-up as a new workload slice. Kueue reads it from the
# RayService's own metadata (workloadslicing.Enabled) and refuses a change of it on update.
KUEUE_ELASTIC_JOB_ANNOTATION = KUEUE_LABEL_PREFIX + "elastic-job"
# The labels of metadata.labels that pass on to the child: the user's own (no prefix) and these.
# A prefixed label is some controller's interface (Kueue's queue and priority class, ...): set on
# the child it would act for the user beyond what the spec allows, so it stays on the object.
PASSED_LABELS = frozenset({
    "app.kubernetes.io/part-of", "app.kubernetes.io/component", "app.kubernetes.io/version",
    "app.kubernetes.io/instance",
})
SPEC_HASH_ANNOTATION = "tputorch.io/spec-hash"
# KubeRay 1.5: a RayService not Ready this long after creation is failed for good and its RayClusters
# deleted (Ready=False, reason InitializingTimeout).
INITIALIZING_TIMEOUT_ANNOTATION = "ray.io/initializing-timeout"
# The annotations the operator writes on a RayService (a RayJob gets none but its stamp, render/stamp.py).
RAYSERVICE_ANNOTATIONS = (SPEC_HASH_ANNOTATION, INITIALIZING_TIMEOUT_ANNOTATION)
WORKER_GROUP = "tpu-slice"
SERVE_APP = "llm"  # the one Serve application of a service (KubeRay reports it under this name)
SERVE_PORT = 8000

Spec = JobSpec | ServiceSpec


def pod_labels(spec: Spec) -> dict[str, str]:
    # Never app.kubernetes.io/name: KubeRay sets it to kuberay and GKE's TPU webhook looks for it.
    owner = SERVICE_LABEL if isinstance(spec, ServiceSpec) else JOB_LABEL
    return {MANAGED_BY_LABEL: MANAGED_BY, owner: spec.name}


def passed_labels(labels: dict[str, str]) -> dict[str, str]:
    """The object's labels that the child carries too (PASSED_LABELS)."""
    return {k: v for k, v in labels.items() if "/" not in k or k in PASSED_LABELS}


def kueue_labels(spec: Spec) -> dict[str, str]:
    """Kueue's labels on the child: from spec fields only, the one place they are made."""
    labels = {}
    if spec.queue_name:
        labels[QUEUE_LABEL] = spec.queue_name
    if spec.priority_class_name:
        labels[PRIORITY_CLASS_LABEL] = spec.priority_class_name
    return labels


def object_labels(spec: Spec) -> dict[str, str]:
    """Labels of the RayJob / RayService: the user's that may pass, ours, and Kueue's from the spec."""
    return {**passed_labels(spec.labels), **pod_labels(spec), **kueue_labels(spec)}
