"""Which Cloud Storage a spec reaches, and whether it names the identity GKE will check.

On GKE a pod reaches Cloud Storage as its Kubernetes ServiceAccount (Workload Identity Federation:
the principal `.../subject/ns/NS/sa/KSA`). Without `spec.serviceAccountName` the pods run as the
namespace's `default` account, which the runbook never binds to a bucket, so the first checkpoint (or
the `working_dir` download, before the driver starts) fails with a 403 after the slice has been
provisioned. That is not refused here: a namespace's `default` account may be bound on purpose. It is
said before the slice is paid for (`tputorch validate`/`submit`, and a condition on the object).

Read from the spec as the user wrote it (a dict), so the one rule covers both kinds and every field
that can carry a `gs://` URL.
"""

from __future__ import annotations

import re

GCS_URL = re.compile(r"gs://[a-z0-9][-a-z0-9_.]*[a-z0-9](?:/[^\s'\"]*)?")

# The Workload Identity task (docs/tasks/bucket-access.md; getting-started step 4): the account it creates, the
# principal GKE names a pod of it by, and the roles it grants that principal on the bucket.
RUNBOOK_ACCOUNT = "ray-tpu"
RUNBOOK_STEP = "docs/tasks/bucket-access.md#a-bucket-and-workload-identity-for-the-ray-pods"
PRINCIPAL = ("principal://iam.googleapis.com/projects/{project_number}/locations/global/workloadIdentityPools/"
             "{project}.svc.id.goog/subject/ns/{namespace}/sa/{account}")
OBJECT_ROLE = "roles/storage.objectUser"  # read, write and delete objects: checkpoints, working_dir
BUCKET_ROLE = "roles/storage.legacyBucketReader"  # storage.buckets.get: pyarrow's and the streamer's bucket read
READ_ROLE = "roles/storage.objectViewer"  # a bucket the pods only read (LoRA adapters, a model)


def principal(namespace: str, account: str, project_number: str = "PROJECT_NUMBER", project: str = "PROJECT_ID") -> str:
    """The principal GKE's Workload Identity Federation gives a pod of ServiceAccount ``account`` in
    ``namespace`` (the project's number and id left as placeholders unless known)."""
    return PRINCIPAL.format(project_number=project_number, project=project, namespace=namespace, account=account)


def bind_commands(namespace: str, account: str, bucket: str = "BUCKET", roles: tuple[str, ...] = (OBJECT_ROLE, BUCKET_ROLE)) -> str:
    """The runbook's commands that bind ``account`` to ``bucket`` (its name, without gs://)."""
    member = principal(namespace, account)
    return "; ".join(f"gcloud storage buckets add-iam-policy-binding gs://{bucket} --member={member} --role={role}"
                     for role in roles)


def _field(obj: object, key: str) -> object:
    """obj[key] when obj is a mapping, else None: a spec the parser refuses must not crash this."""
    return obj.get(key) if isinstance(obj, dict) else None


def gcs_references(spec: dict) -> list[tuple[str, str]]:
    """(field, gs:// value) for every place of ``spec`` that reaches a bucket with the pods' identity,
    in the spec's order: the entrypoint, env values, the checkpoint path, runtimeEnv's working_dir and
    py_modules, the model source, the LoRA path, and gcs volumes. Values of the wrong type are skipped
    (the parser names them)."""
    found: list[tuple[str, str]] = []

    def urls(field: str, value: object) -> None:
        if isinstance(value, str):
            found.extend((field, url) for url in GCS_URL.findall(value))

    def items(value: object) -> list:
        return value if isinstance(value, list) else []

    urls("spec.entrypoint", _field(spec, "entrypoint"))
    for i, item in enumerate(items(_field(spec, "env"))):
        urls(f"spec.env[{i}] ({_field(item, 'name')})", _field(item, "value"))
    urls("spec.checkpoint.storagePath", _field(_field(spec, "checkpoint"), "storagePath"))
    runtime_env = _field(spec, "runtimeEnv")
    urls("spec.runtimeEnv.working_dir", _field(runtime_env, "working_dir"))
    for i, module in enumerate(items(_field(runtime_env, "py_modules"))):
        urls(f"spec.runtimeEnv.py_modules[{i}]", module)
    urls("spec.model.source", _field(_field(spec, "model"), "source"))
    urls("spec.lora.path", _field(_field(spec, "lora"), "path"))
    for i, volume in enumerate(items(_field(spec, "volumes"))):
        bucket = _field(_field(volume, "gcs"), "bucket")
        if isinstance(bucket, str) and bucket:
            found.append((f"spec.volumes[{i}].gcs.bucket", f"gs://{bucket}"))
    return found


def buckets(spec: dict) -> tuple[str, ...]:
    """The buckets ``spec`` reaches (names without gs://), each once, in the spec's order."""
    return tuple(dict.fromkeys(url[len("gs://"):].split("/", 1)[0] for _, url in gcs_references(spec)))


def missing_identity(spec: dict) -> str | None:
    """The warning for a spec that reaches Cloud Storage without naming its ServiceAccount, or None."""
    if _field(spec, "serviceAccountName"):
        return None
    refs = gcs_references(spec)
    if not refs:
        return None
    field, value = refs[0]
    more = f" (and {len(refs) - 1} more)" if len(refs) > 1 else ""
    return (f"{field} is {value}{more} but spec.serviceAccountName is unset: on GKE the pods reach Cloud "
            "Storage as the namespace's default ServiceAccount, which the bucket's IAM policy must then "
            "grant (else a 403 after the slice is provisioned); set spec.serviceAccountName to the account "
            "bound through Workload Identity (docs/tasks/bucket-access.md: ray-tpu)")
