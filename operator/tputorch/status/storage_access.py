"""A 403 from Cloud Storage at run time, found in what the pods wrote (the driver's log, the Ray
job's failure message, the Serve application's message, a pod's Event), and said as the
StorageIdentity=False (StorageAccessDenied) condition: the principal refused, the bucket and the role
the runbook grants (api/identity.py).

The shapes read, each as its client writes it:
  - Cloud Storage's JSON API error, quoted by every client (google-cloud-storage's `Forbidden: 403
    GET https://storage.googleapis.com/storage/v1/b/BUCKET...: PRINCIPAL does not have
    storage.buckets.get access to the Google Cloud Storage bucket. Permission 'storage.buckets.get'
    denied on resource (or it may not exist).`, newer ones naming the resource
    `'//storage.googleapis.com/projects/_/buckets/BUCKET/objects/OBJECT'`);
  - google-cloud-cpp's status, which pyarrow's GcsFileSystem (Ray Train's checkpoints) raises:
    `google::cloud::Status(PERMISSION_DENIED: Permanent error ...: <the JSON API's message>)`;
  - gcsfuse's Go client, in the sidecar's log and the CSI driver's FailedMount Event:
    `googleapi: Error 403: <the JSON API's message or "Access denied.">, forbidden`.
Any other 403 (a Hugging Face download, the Ray dashboard) is not Cloud Storage's and is not read.
The text is a pod's output, so nothing in it is trusted: it is bounded, and what is kept of it is
checked against the shapes of a principal, a bucket and a permission.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from ..api import identity

MAX_TEXT = 256 * 1024  # of a log tail or a message, the last this many characters are read
MAX_EXCERPT = 300  # of the line that says it, kept in the condition's message

# "PRINCIPAL does not have PERMISSION access to ...": the JSON API's wording, whichever client quotes it.
_MAX_WHO = 512  # a principal's characters: a principal:// of the longest names GKE makes is under 300
_DENIED = re.compile(r"(?:(?P<who>[\w.@:/%+=-]{3,512})|(?P<anon>Anonymous caller)|Caller) does not have "
                     r"(?P<perm>storage\.[a-z]+\.[a-zA-Z]+) access to")
# The status lines that say 403 for Cloud Storage without the JSON API's wording (gcsfuse's "Access
# denied.", a FailedMount naming Cloud Storage's URL): plain substrings, no regex over a long line.
_FORBIDDEN = ("googleapi: Error 403:", "google::cloud::Status(PERMISSION_DENIED")
_CSI_DENIED = "code = PermissionDenied desc = "
_BUCKET = re.compile(r"//storage\.googleapis\.com/projects/_/buckets/(?P<a>[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9])"
                     r"|storage\.googleapis\.com/(?:upload/)?storage/v1/b/(?P<b>[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9])"
                     r"|gs://(?P<c>[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9])"
                     r"|\bbucket(?::\s*|\s+\")(?P<d>[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9])")
_CONTROL = re.compile(r"\x1b\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f]")  # colours first, then the rest
_PRINCIPAL = re.compile(r"^(principal://iam\.googleapis\.com/[\w./-]+|[\w.+-]+@[\w.-]+|serviceAccount:[\w.@-]+)$")


@dataclass(frozen=True)
class Denial:
    principal: str | None  # as Cloud Storage named it; None when it did not (or "anonymous")
    bucket: str | None  # as the text names it
    permission: str | None  # storage.objects.create, ...
    excerpt: str  # the line that says it, bounded


def find(text: object) -> Denial | None:
    """The last Cloud Storage 403 in ``text`` (a log tail, a message), or None."""
    if not isinstance(text, str) or not text:
        return None
    lines = _CONTROL.sub("", text[-MAX_TEXT:]).splitlines()
    for at in range(len(lines) - 1, -1, -1):
        line = lines[at]
        denied = _denied(line)
        if denied is None and not _forbidden(line):
            continue
        who = denied and (denied.group("who") or "").strip(":")
        principal = "anonymous" if denied and denied.group("anon") else (who if who and _PRINCIPAL.match(who) else None)
        # the bucket: on the line itself, else on the lines just before (a traceback names the path)
        bucket = next((b for near in (line, *reversed(lines[max(0, at - 5):at])) if (b := _bucket(near))), None)
        excerpt = line.strip()
        if len(excerpt) > MAX_EXCERPT:
            start = max(0, (denied.start() if denied else 0) - 60)
            excerpt = excerpt[start:start + MAX_EXCERPT] + "..."
        return Denial(principal, bucket, denied.group("perm") if denied else None, excerpt)
    return None


def _forbidden(line: str) -> bool:
    return any(words in line for words in _FORBIDDEN) or (_CSI_DENIED in line and "storage.googleapis.com" in line)


def _denied(line: str) -> re.Match | None:
    """The JSON API's "... does not have ... access to" on ``line``, searched for only around where the
    words are: a long line of one token must cost no backtracking over all of it."""
    words = line.find(" does not have storage.")
    if words < 0:
        return None
    return _DENIED.search(line, max(0, words - _MAX_WHO - 20), words + 80)


def _bucket(line: str) -> str | None:
    found = _BUCKET.search(line)
    return next((g for g in found.groups() if g), None) if found else None


def role_for(permission: str | None) -> tuple[str, ...]:
    """The role(s) the runbook grants that carry ``permission``: objects' rights come with
    roles/storage.objectUser, the bucket's metadata with roles/storage.legacyBucketReader; both
    when the message named no permission."""
    if permission and permission.startswith("storage.objects."):
        return (identity.OBJECT_ROLE,)
    if permission and permission.startswith("storage.buckets."):
        return (identity.BUCKET_ROLE,)
    return (identity.OBJECT_ROLE, identity.BUCKET_ROLE)


def message(denial: Denial, where: str, namespace: str, service_account: str | None, buckets: tuple[str, ...]) -> str:
    """The condition's message: who was refused what on which bucket (``where``: what said so), and
    the runbook's binding that grants it. The principal is the pod's Kubernetes ServiceAccount as
    GKE names it when the message did not name one; the bucket the spec's own when the text did not."""
    account = service_account or "default"
    principal = denial.principal if denial.principal not in (None, "anonymous") else identity.principal(namespace, account)
    bucket = denial.bucket or (buckets[0] if len(buckets) == 1 else None)
    roles = role_for(denial.permission)
    on = f"gs://{bucket}" if bucket else ("one of " + ", ".join(f"gs://{b}" for b in buckets) if buckets else "a bucket")
    refused = f"{denial.permission} on {on}" if denial.permission else f"access to {on}"
    if denial.principal == "anonymous":
        who = "an anonymous caller (no Workload Identity token: the pod's node pool runs no GKE metadata server?)"
    elif not principal.startswith("principal://"):
        who = (f"{principal} (a Google service account, not the pods' Workload Identity principal: the node's own "
               "when its pool runs without the GKE metadata server, --workload-metadata=GKE_METADATA, or one the "
               "ServiceAccount's iam.gke.io/gcp-service-account annotation names)")
    else:
        who = principal
    fix = identity.bind_commands(namespace, account, bucket or "BUCKET", roles)
    return (f"Cloud Storage refused {who} {refused} ({where}: {denial.excerpt!r}); the pods run as ServiceAccount "
            f"{namespace}/{account}: grant it {' and '.join(roles)} on the bucket as the runbook does "
            f"({identity.RUNBOOK_STEP}): {fix}")


def said(spec, found: Iterable[tuple[str, Denial | None]]) -> str | None:
    """The StorageAccessDenied condition's message for the first (what said it, its 403) found, or
    None; ``spec`` a JobSpec or ServiceSpec (its namespace, ServiceAccount and buckets)."""
    for where, denial in found:
        if denial is not None:
            return message(denial, where, spec.namespace, spec.service_account_name, spec.gcs_buckets)
    return None
