"""A stand-in for Cloud Storage (its JSON API) and for GKE's metadata server on 127.0.0.1: buckets
served from local directories (and written in memory), each under a bucket IAM policy enforced on
the identity whose token a call carries, with the bytes of object content it sends counted per object.

    with FakeGcs({"ckpt": Path("/tmp/ckpt")}, policy={"ckpt": {"roles/storage.objectUser": [principal("ml", "ray-tpu")]}}) as gcs:
        env = gcs.pod_env("ml", "ray-tpu")   # GCE_METADATA_HOST, CLOUD_STORAGE_EMULATOR_ENDPOINT, ...
        ...                                  # gs://ckpt/... through pyarrow or google-cloud-storage
        gcs.media_bytes()                    # {"ckpt/run/checkpoint_0/model.pt": 1234, ...}

A pod on GKE with Workload Identity reaches gs:// this way: google-cloud-cpp (under pyarrow's
GcsFileSystem, which Ray Train's storage path and Ray Serve LLM's CloudFileSystem use) finds no key
file, asks the metadata server for the pod's service account and a token, and sends it as a Bearer
token. GKE's metadata server knows the pod by its IP and hands it a token for its Kubernetes
ServiceAccount, which IAM knows as the principal
`principal://iam.googleapis.com/projects/N/locations/global/workloadIdentityPools/P.svc.id.goog/subject/ns/NS/sa/KSA`.
Here every simulated pod's identity (namespace, ServiceAccount) has a metadata server of its own on
a port of its own (`pod_env`, or `template_env` from a rendered pod template's serviceAccountName),
since processes on one host have one IP. GCE_METADATA_ROOT points google-cloud-cpp's metadata
client there and CLOUD_STORAGE_EMULATOR_ENDPOINT its storage client; the Python clients (google-auth
under google-cloud-storage, which vLLM's Run:ai streamer lists and pulls a model's small files with)
read GCE_METADATA_IP (its ping), GCE_METADATA_HOST and API_ENDPOINT_OVERRIDE (STORAGE_EMULATOR_HOST
in client_env: it makes google-cloud-storage's default client anonymous).

Without a `policy` (the serving tests' use), the main port's metadata server hands out one token,
TOKEN, of the Google service account SERVICE_ACCOUNT, which holds roles/storage.objectUser and
roles/storage.legacyBucketReader on every bucket (client_env points a process there).

What it answers, as google-cloud-cpp's and the Python clients' storage and metadata calls ask (read
in their requests):

- Metadata (`Metadata-Flavor: Google` required, as GKE's metadata server does):
  `GET /` (the root listing `computeMetadata/`, with a `Metadata-Flavor: Google` header: google-auth
  pings it to decide it runs on Google Cloud), `GET /computeMetadata/v1/project/project-id` (text),
  `GET /computeMetadata/v1/instance/service-accounts/default/?recursive=true` (email, scopes: a
  Workload Identity pod's email is the pool's name, as GKE's says) and
  `GET /computeMetadata/v1/instance/service-accounts/<email or default>/token`.
- Storage. Each call needs a permission on the bucket (ROLES: the permissions of the predefined
  roles the runbook grants, from Google's "IAM roles for Cloud Storage"); the policy's members hold
  their roles' permissions, `allUsers` (a bucket named in `public`: roles/storage.objectViewer)
  everyone's, `allAuthenticatedUsers` every token's. A call without the permission gets GCS's
  error: 401 without a token (or with one nobody issued), 403 naming the caller's principal and the
  permission otherwise (`error.code`, `error.message`, `error.errors[{message, domain, reason}]`).
  google-cloud-cpp reads anonymously whenever CLOUD_STORAGE_EMULATOR_ENDPOINT is set and its caller
  passes no credentials (its DefaultOptionsWithCredentials), as the Run:ai streamer's C++ reader
  does: only a public bucket serves it.
  Reads: `GET /storage/v1/b/<bucket>` (storage.buckets.get), `GET /storage/v1/b/<bucket>/o?prefix=&delimiter=`
  (storage.objects.list: `items` and `prefixes`; one page), `GET /storage/v1/b/<bucket>/o/<object>`
  (storage.objects.get: its resource, with size, generation, md5Hash and crc32c) and the same with
  `alt=media` (its bytes, with `x-goog-hash`, and a single `Range: bytes=a-b` / `bytes=a-` as a 206),
  also at `/download/storage/v1/b/...` (the media path google-cloud-storage uses).
  Writes (storage.objects.create, and storage.objects.delete to replace an existing object, as GCS
  wants): `POST /upload/storage/v1/b/<bucket>/o?uploadType=media&name=` (the body is the object),
  `uploadType=multipart` (multipart/related: the JSON resource, then the bytes) and
  `uploadType=resumable` (a session: its URI in `Location`, then `PUT`s of chunks with
  `Content-Range: bytes a-b/total|*` answered 308 with the `Range` held so far, the last one 200 with
  the resource; `bytes */total|*` asks the status), with `ifGenerationMatch` (0: only if absent)
  answered 412 when it fails. `DELETE /storage/v1/b/<bucket>/o/<object>` (storage.objects.delete).
  Unknown: a 404 in GCS's error shape. Not modelled: pagination, versions, rewrites and compose,
  IAM conditions, the XML API.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from loopback import LoopbackService
from tputorch.api import identity as runbook

PROJECT = "my-project"
PROJECT_NUMBER = "123456789012"
POOL = f"{PROJECT}.svc.id.goog"  # GKE's workload pool of the project (--workload-pool), in the principal too
SERVICE_ACCOUNT = f"serving@{PROJECT}.iam.gserviceaccount.com"
TOKEN = "ya29.fake-workload-identity-token"
UPDATED = "2026-01-01T00:00:00.000Z"

# The permissions that the predefined roles a bucket's policy names grant on objects and the bucket
# (Google's "IAM roles for Cloud Storage"; the folder, managed-folder and multipart-upload
# permissions that some also grant are not modelled). Not one of the object roles has
# storage.buckets.get: the legacy bucket roles do.
_OBJECTS_ALL = {"storage.objects.create", "storage.objects.delete", "storage.objects.get",
                "storage.objects.list", "storage.objects.update"}
ROLES: dict[str, frozenset[str]] = {
    "roles/storage.objectViewer": frozenset({"storage.objects.get", "storage.objects.list"}),
    "roles/storage.objectCreator": frozenset({"storage.objects.create"}),
    "roles/storage.objectUser": frozenset(_OBJECTS_ALL),
    "roles/storage.objectAdmin": frozenset(_OBJECTS_ALL),
    "roles/storage.legacyBucketReader": frozenset({"storage.buckets.get", "storage.objects.list"}),
    "roles/storage.legacyBucketWriter": frozenset({"storage.buckets.get", "storage.objects.list",
                                                   "storage.objects.create", "storage.objects.delete"}),
    "roles/storage.admin": frozenset(_OBJECTS_ALL | {"storage.buckets.get", "storage.buckets.update"}),
}
RUNBOOK_WRITER_ROLES = (runbook.OBJECT_ROLE, runbook.BUCKET_ROLE)  # docs/tasks/bucket-access.md


def principal(namespace: str, ksa: str) -> str:
    """The IAM principal of a Kubernetes ServiceAccount of this project under Workload Identity."""
    return runbook.principal(namespace, ksa, project_number=PROJECT_NUMBER, project=PROJECT)


def pod_service_account(template: dict) -> str:
    """The ServiceAccount a pod of this template runs as: its serviceAccountName, else `default`
    (the namespace's own, which Kubernetes fills in)."""
    return template.get("spec", {}).get("serviceAccountName") or "default"


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum GCS keeps for every object and clients verify downloads by."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


class StoredObject:
    def __init__(self, bucket: str, name: str, data: bytes, generation: int = 1, resource: dict | None = None):
        """`resource`: what the writer sent of the object's resource (its contentType, its custom
        `metadata`: pyarrow marks a folder's object with arrow/gcsfs: directory and reads it back)."""
        self.bucket, self.name, self.data, self.generation = bucket, name, data, generation
        self.content_type = (resource or {}).get("contentType") or "application/octet-stream"
        self.metadata = dict((resource or {}).get("metadata") or {})
        self.md5 = base64.b64encode(hashlib.md5(data).digest()).decode()  # noqa: S324 (GCS's own checksum)
        self.crc32c = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()

    def resource(self) -> dict:
        return {"kind": "storage#object", "id": f"{self.bucket}/{self.name}/{self.generation}", "name": self.name,
                "bucket": self.bucket, "generation": str(self.generation), "metageneration": "1",
                "size": str(len(self.data)), "contentType": self.content_type, "md5Hash": self.md5,
                "crc32c": self.crc32c, "storageClass": "STANDARD", "timeCreated": UPDATED, "updated": UPDATED,
                **({"metadata": self.metadata} if self.metadata else {})}


class Identity:
    """Who a token stands for: the IAM member a policy names, and how GCS's errors call it."""

    def __init__(self, member: str, token: str, email: str):
        self.member, self.token, self.email = member, token, email

    @property
    def caller(self) -> str:
        return self.member.removeprefix("serviceAccount:")


class _Denied(Exception):
    def __init__(self, status: int, message: str, reason: str):
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class FakeGcs(LoopbackService):
    thread_name = "fakegcs"

    def __init__(self, buckets: dict[str, Path], public: tuple[str, ...] = (),
                 policy: dict[str, dict[str, list[str]]] | None = None):
        """`policy`: per bucket, its IAM bindings as `gcloud storage buckets add-iam-policy-binding`
        writes them ({role: [member, ...]}); a bucket it does not name has none. Without it, every
        bucket grants the runbook's writer roles to SERVICE_ACCOUNT (whose token is TOKEN)."""
        self.public = set(public)
        self.buckets = {name: {p.relative_to(root).as_posix(): StoredObject(name, p.relative_to(root).as_posix(), p.read_bytes())
                               for p in sorted(Path(root).rglob("*")) if p.is_file()}
                        for name, root in buckets.items()}
        default = Identity(f"serviceAccount:{SERVICE_ACCOUNT}", TOKEN, SERVICE_ACCOUNT)
        if policy is None:
            policy = {name: {role: [default.member] for role in RUNBOOK_WRITER_ROLES} for name in buckets}
        self.policy = {name: {role: list(members) for role, members in policy.get(name, {}).items()} for name in buckets}
        for name in self.public:  # allUsers holds roles/storage.objectViewer, as a public bucket's policy says
            self.policy[name].setdefault("roles/storage.objectViewer", []).append("allUsers")
        unknown = {role for bindings in self.policy.values() for role in bindings} - ROLES.keys()
        assert not unknown, f"roles the stand-in does not know: {unknown}"
        self.default_identity = default
        self._tokens = {TOKEN: default}
        self._pods: dict[tuple[str, str], MetadataServer] = {}
        self._lock = threading.Lock()
        self._media: dict[str, int] = {}
        self._sessions: dict[str, dict] = {}  # resumable uploads: upload_id -> bucket, name, data so far
        self._ids = itertools.count(1)
        self.requests: list[dict] = []  # method, path, status, bytes (sent back), sent, auth, caller (its member): what was asked, in order

    def media_bytes(self) -> dict[str, int]:
        """Bytes of object content sent, per "<bucket>/<object>"."""
        with self._lock:
            return dict(self._media)

    def log(self) -> list[dict]:
        with self._lock:
            return list(self.requests)

    def _sent(self, entry: dict, key: str | None) -> None:
        with self._lock:
            self.requests.append(entry)
            if key and entry["bytes"]:
                self._media[key] = self._media.get(key, 0) + entry["bytes"]

    def stop(self) -> None:
        for server in self._pods.values():
            server.stop()
        self._pods.clear()
        super().stop()

    def client_env(self) -> dict[str, str]:
        """What points a process's Google clients here as SERVICE_ACCOUNT (the main port's metadata
        server): the metadata server (host:port, no scheme: GKE's is metadata.google.internal,
        169.254.169.254) and the storage endpoint, in google-cloud-cpp's spellings and in the Python
        clients' (google-auth pings GCE_METADATA_IP before it asks GCE_METADATA_HOST, else
        GCE_METADATA_ROOT; google-cloud-storage reads STORAGE_EMULATOR_HOST)."""
        host = self.url.removeprefix("http://")
        return {**self._metadata_env(host), "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.url, "STORAGE_EMULATOR_HOST": self.url}

    @staticmethod
    def _metadata_env(host: str) -> dict[str, str]:
        # GCE_METADATA_TIMEOUT: google-auth gives each metadata call 3 s; this stand-in answers from a
        # thread of a test process on a loaded 2-core machine (make test runs it beside the cluster
        # tests), where 3 s once ran out and the token fetch failed before the bucket could refuse.
        return {"GCE_METADATA_ROOT": host, "GCE_METADATA_HOST": host, "GCE_METADATA_IP": host,
                "GCE_METADATA_TIMEOUT": "30"}

    def pod_env(self, namespace: str, ksa: str) -> dict[str, str]:
        """What a process needs to act as a pod running as ServiceAccount `namespace/ksa` under
        Workload Identity: the metadata server of that identity (started on first use, on a port of
        its own) and the storage endpoint. For google-cloud-storage that is API_ENDPOINT_OVERRIDE,
        not STORAGE_EMULATOR_HOST: under the latter its Client() without credentials (smart_open's,
        which Ray's runtime_env downloads with) is anonymous, under the former it authenticates as
        on GKE (google-auth's default: the metadata server's token)."""
        key = (namespace, ksa)
        with self._lock:
            server = self._pods.get(key)
            if server is None:
                identity = Identity(principal(namespace, ksa), f"ya29.wi-{next(self._ids)}-{namespace}-{ksa}", POOL)
                self._tokens[identity.token] = identity
                server = self._pods[key] = MetadataServer(self, identity).start()
        return {**self._metadata_env(server.url.removeprefix("http://")), "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.url,
                "API_ENDPOINT_OVERRIDE": self.url}

    def template_env(self, namespace: str, template: dict) -> dict[str, str]:
        """pod_env for a pod of this (rendered) pod template in `namespace`."""
        return self.pod_env(namespace, pod_service_account(template))

    def listing(self, bucket: str, prefix: str, delimiter: str, include_trailing: bool) -> dict:
        """GCS's objects.list: with a delimiter, a name with it past the prefix is rolled into
        `prefixes`; with includeTrailingDelimiter, an object whose name ends there (a folder marker)
        is also in `items`. A folder that only its objects' names imply is never an item: pyarrow,
        which reads `items` alone, lists it only if it has a marker object."""
        items, prefixes = [], set()
        for name, obj in sorted(self.buckets[bucket].items()):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
                if include_trailing and rest.index(delimiter) == len(rest) - len(delimiter):
                    items.append(obj.resource())
            else:
                items.append(obj.resource())
        return {"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)}

    def allowed(self, bucket: str, identity: Identity | None, permission: str) -> bool:
        """Whether the bucket's policy grants `permission` to this caller (None: no token)."""
        members = {"allUsers"} | ({identity.member, "allAuthenticatedUsers"} if identity else set())
        return any(permission in ROLES[role] and members & set(held) for role, held in self.policy[bucket].items())

    def identity(self, auth: str | None) -> Identity | None:
        """Whose token an Authorization header carries (None: none, or one nobody issued)."""
        return self._tokens.get(auth.removeprefix("Bearer ")) if auth and auth.startswith("Bearer ") else None

    def check(self, bucket: str, auth: str | None, permission: str, resource: str) -> None:
        """Raises GCS's refusal unless the caller holds `permission` on the bucket."""
        identity = self.identity(auth)
        if auth and identity is None:
            raise _Denied(401, "Invalid Credentials", "authError")
        if self.allowed(bucket, identity, permission):
            return
        who = identity.caller if identity else "Anonymous caller"
        message = (f"{who} does not have {permission} access to the Google Cloud Storage {resource}. "
                   f"Permission '{permission}' denied on resource (or it may not exist).")
        raise _Denied(403, message, "forbidden") if identity else _Denied(401, message, "required")

    def store(self, bucket: str, name: str, data: bytes, resource: dict | None = None) -> StoredObject:
        with self._lock:
            old = self.buckets[bucket].get(name)
            obj = self.buckets[bucket][name] = StoredObject(bucket, name, data, old.generation + 1 if old else 1, resource)
        return obj


class MetadataServer(LoopbackService):
    """GKE's metadata server as one pod sees it: tokens of that pod's identity only."""

    thread_name = "fakegcs-metadata"

    def __init__(self, gcs: FakeGcs, identity: Identity):
        self.gcs, self.identity = gcs, identity


def _metadata(headers, path: str, identity: Identity) -> tuple[int, bytes, dict]:
    if headers.get("Metadata-Flavor") != "Google":
        return 403, b"Missing Metadata-Flavor: Google header", {"Content-Type": "text/plain"}
    google = {"Metadata-Flavor": "Google"}
    text = {**google, "Content-Type": "application/text"}
    if path == "/":
        return 200, b"computeMetadata/\n", text
    if path == "/computeMetadata/v1/project/project-id":
        return 200, PROJECT.encode(), text
    if path == "/computeMetadata/v1/project/numeric-project-id":
        return 200, PROJECT_NUMBER.encode(), text
    accounts = "/computeMetadata/v1/instance/service-accounts/"
    if path == accounts + "default/":
        return 200, json.dumps({"aliases": ["default"], "email": identity.email,
                                "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}).encode(), google
    if path in (accounts + "default/token", accounts + identity.email + "/token"):
        return 200, json.dumps({"access_token": identity.token, "expires_in": 3599, "token_type": "Bearer"}).encode(), google
    return 404, b"not found", {**google, "Content-Type": "text/plain"}


class _Handler(BaseHTTPRequestHandler):
    service: FakeGcs
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # the request log is gcs.requests
        pass

    def _gcs(self) -> FakeGcs:
        return self.service

    def _answer(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method in ("POST", "PUT") else b""
        gcs = self._gcs()
        entry = {"method": method, "path": url.path, "query": url.query, "auth": self.headers.get("Authorization"),
                 "range": self.headers.get("Range"), "status": 200, "bytes": 0, "sent": len(body),
                 "caller": getattr(gcs.identity(self.headers.get("Authorization")), "member", None)}
        key = None
        try:
            if url.path == "/" or url.path.startswith("/computeMetadata/"):
                status, out, headers = self._metadata(url.path)
            else:
                status, out, headers, key = self._storage(method, url.path, query, body)
        except _Denied as denied:
            status, out, headers = denied.status, _error(denied.status, denied.message, denied.reason), {}
        except Exception as exc:  # a stand-in bug must show as an answer, not a hung client
            status, out, headers = 500, _error(500, repr(exc)), {}
        entry["status"] = status
        if key:
            entry["bytes"] = len(out)
        gcs._sent(entry, key if status in (200, 206) else None)
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers, "Content-Length": str(len(out))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _metadata(self, path: str) -> tuple[int, bytes, dict]:
        return _metadata(self.headers, path, self.service.default_identity)

    def _storage(self, method: str, path: str, query: dict, body: bytes) -> tuple[int, bytes, dict, str | None]:
        gcs, auth = self.service, self.headers.get("Authorization")
        upload = path.startswith("/upload/storage/v1/b/")
        if path.startswith("/download/storage/v1/b/") and query.get("alt") == "media":
            path = path.removeprefix("/download")
        if upload:
            path = path.removeprefix("/upload")
        if not path.startswith("/storage/v1/b/"):
            return 404, _error(404, "Not Found"), {}, None
        parts = path.removeprefix("/storage/v1/b/").split("/", 2)
        bucket = parts[0]
        if bucket not in gcs.buckets:
            return 404, _error(404, "The specified bucket does not exist."), {}, None
        if len(parts) == 1 and method == "GET":
            gcs.check(bucket, auth, "storage.buckets.get", "bucket")
            return 200, json.dumps({"kind": "storage#bucket", "id": bucket, "name": bucket, "location": "US",
                                    "storageClass": "STANDARD", "timeCreated": UPDATED, "updated": UPDATED}).encode(), {}, None
        if len(parts) < 2 or parts[1] != "o":
            return 404, _error(404, "Not Found"), {}, None
        if upload:
            return self._upload(method, bucket, query, body)
        if len(parts) == 2 and method == "GET":
            gcs.check(bucket, auth, "storage.objects.list", "bucket")
            listing = gcs.listing(bucket, query.get("prefix", ""), query.get("delimiter", ""),
                                  query.get("includeTrailingDelimiter") == "true")
            return 200, json.dumps(listing).encode(), {}, None
        if len(parts) == 2:
            return 404, _error(404, "Not Found"), {}, None
        name = urllib.parse.unquote(parts[2])
        if method == "DELETE":
            gcs.check(bucket, auth, "storage.objects.delete", "object")
            with gcs._lock:
                gone = gcs.buckets[bucket].pop(name, None)
            return (204, b"", {}, None) if gone else (404, _error(404, f"No such object: {bucket}/{name}"), {}, None)
        if method != "GET":
            return 405, _error(405, f"{method} is not modelled here"), {}, None
        gcs.check(bucket, auth, "storage.objects.get", "object")
        obj = gcs.buckets[bucket].get(name)
        if obj is None:
            return 404, _error(404, "No such object: " + f"{bucket}/{name}"), {}, None
        if query.get("alt") != "media":
            return 200, json.dumps(obj.resource()).encode(), {}, None
        headers = {"Content-Type": "application/octet-stream", "x-goog-generation": str(obj.generation),
                   "x-goog-hash": f"crc32c={obj.crc32c},md5={obj.md5}"}
        key = f"{bucket}/{obj.name}"
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes="):].partition("-")
            start, end = int(first), min(int(last) if last else len(obj.data) - 1, len(obj.data) - 1)
            return 206, obj.data[start:end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(obj.data)}"}, key
        return 200, obj.data, headers, key

    def _may_write(self, bucket: str, name: str, query: dict) -> None:
        """GCS's checks before an object is written: storage.objects.create, and .delete when the
        name exists (a replacement), then the ifGenerationMatch precondition (0: must not exist)."""
        gcs, auth = self.service, self.headers.get("Authorization")
        gcs.check(bucket, auth, "storage.objects.create", "object")
        existing = gcs.buckets[bucket].get(name)
        if existing is not None:
            gcs.check(bucket, auth, "storage.objects.delete", "object")
        match = query.get("ifGenerationMatch")
        if match is not None and int(match) != (existing.generation if existing else 0):
            raise _Denied(412, "At least one of the pre-conditions you specified did not hold.", "conditionNotMet")

    def _upload(self, method: str, bucket: str, query: dict, body: bytes) -> tuple[int, bytes, dict, str | None]:
        gcs, kind = self.service, query.get("uploadType", "")
        if method == "PUT" and kind == "resumable":
            return self._resumable_chunk(query.get("upload_id", ""), body)
        if method != "POST":
            return 405, _error(405, f"{method} of an upload is not modelled here"), {}, None
        resource: dict = {}
        if kind == "media":
            name, data = query.get("name", ""), body
        elif kind == "multipart":
            resource, data = _multipart(self.headers.get("Content-Type", ""), body)
            name = query.get("name") or resource.get("name", "")
        elif kind == "resumable":
            resource = json.loads(body) if body.strip() else {}
            name = query.get("name") or resource.get("name", "")
            if not name:
                return 400, _error(400, "Required object name"), {}, None
            self._may_write(bucket, name, query)
            upload_id = f"session-{next(gcs._ids)}"
            with gcs._lock:
                gcs._sessions[upload_id] = {"bucket": bucket, "name": name, "data": bytearray(), "resource": resource}
            location = f"{gcs.url}/upload/storage/v1/b/{bucket}/o?uploadType=resumable&upload_id={upload_id}"
            return 200, b"", {"Location": location, "X-GUploader-UploadID": upload_id}, None
        else:
            return 400, _error(400, f"uploadType {kind!r} is not modelled here"), {}, None
        if not name:
            return 400, _error(400, "Required object name"), {}, None
        self._may_write(bucket, name, query)
        return 200, json.dumps(gcs.store(bucket, name, data, resource).resource()).encode(), {}, None

    def _resumable_chunk(self, upload_id: str, body: bytes) -> tuple[int, bytes, dict, str | None]:
        """A PUT to a resumable session: `Content-Range: bytes a-b/total` (a chunk; total `*` while
        unknown), `bytes */total` (the end, no bytes) or `bytes */*` (what is held so far)."""
        gcs = self.service
        session = gcs._sessions.get(upload_id)
        if session is None:
            return 404, _error(404, "No such upload session"), {}, None
        m = re.fullmatch(r"bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)", self.headers.get("Content-Range", f"bytes */{len(body)}"))
        if not m:
            return 400, _error(400, "Bad Content-Range"), {}, None
        first, _, total = m.groups()
        data = session["data"]
        if first is not None:
            if int(first) != len(data):  # a chunk must start where the held bytes end (a resend of them is dropped)
                data[int(first):] = b""
            data.extend(body)
        if total == "*" or int(total) != len(data):
            return 308, b"", ({"Range": f"bytes=0-{len(data) - 1}"} if data else {}), None
        with gcs._lock:
            gcs._sessions.pop(upload_id, None)
        obj = gcs.store(session["bucket"], session["name"], bytes(data), session["resource"])
        return 200, json.dumps(obj.resource()).encode(), {}, None


class _MetadataHandler(_Handler):
    """A pod's own metadata server: the metadata paths alone, logged with the storage's requests."""

    service: MetadataServer

    def _gcs(self) -> FakeGcs:
        return self.service.gcs

    def _metadata(self, path: str) -> tuple[int, bytes, dict]:
        return _metadata(self.headers, path, self.service.identity)

    def _storage(self, method, path, query, body):
        return 404, b"not found", {"Content-Type": "text/plain"}, None


def _multipart(content_type: str, body: bytes) -> tuple[dict, bytes]:
    """The JSON resource and the bytes of a multipart/related upload (its two parts, byte-exact)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type)
    assert boundary, f"no boundary in {content_type!r}"
    parts = body.split(b"--" + boundary.group(1).encode())[1:3]
    resource, data = (part.partition(b"\r\n\r\n")[2].removesuffix(b"\r\n") for part in parts)
    return json.loads(resource or b"{}"), data


def _error(code: int, message: str, reason: str = "") -> bytes:
    detail = {"message": message, **({"domain": "global", "reason": reason} if reason else {})}
    return json.dumps({"error": {"code": code, "message": message, "errors": [detail]}}).encode()


FakeGcs.handler = _Handler
MetadataServer.handler = _MetadataHandler
