"""A stand-in for Cloud Storage (its JSON API) and for GKE's metadata server on 127.0.0.1: buckets
served from local directories, read only by a caller holding the token the metadata server gave out,
with the bytes of object content it sends counted per object.

    with FakeGcs({"my-adapters": Path("/tmp/adapters")}) as gcs:
        env = gcs.client_env()   # GCE_METADATA_ROOT, CLOUD_STORAGE_EMULATOR_ENDPOINT, ...
        ...                      # gs://my-adapters/... through pyarrow (Ray's gs:// reader)
        gcs.media_bytes()        # {"my-adapters/qwen3/a1/adapter_model.safetensors": 1234, ...}

A pod on GKE with Workload Identity reads gs:// the same way: google-cloud-cpp (under pyarrow's
GcsFileSystem, which Ray Serve LLM's CloudFileSystem uses) finds no key file, asks the metadata
server for the pod's service account and a token, and sends it as a Bearer token. GCE_METADATA_ROOT
points its metadata client here, and
CLOUD_STORAGE_EMULATOR_ENDPOINT its storage client. The Python clients (google-auth under
google-cloud-storage, which vLLM's Run:ai streamer lists and pulls a model's small files with) do the
same from GCE_METADATA_IP (its ping), GCE_METADATA_HOST/GCE_METADATA_ROOT and STORAGE_EMULATOR_HOST.

What it answers, as google-cloud-cpp's and the Python clients' storage and metadata calls ask (read
in their requests):

- Metadata (`Metadata-Flavor: Google` required, as GKE's metadata server does):
  `GET /` (the root listing `computeMetadata/`, with a `Metadata-Flavor: Google` header: google-auth
  pings it to decide it runs on Google Cloud), `GET /computeMetadata/v1/project/project-id` (text),
  `GET /computeMetadata/v1/instance/service-accounts/default/?recursive=true` (email, scopes) and
  `GET /computeMetadata/v1/instance/service-accounts/<email or default>/token`.
- Storage, each with the Bearer token or a 401; but a bucket named in `public` (allUsers holds
  roles/storage.objectViewer on it) also lists and serves its objects to a caller that sends no
  Authorization at all, as GCS does (the bucket's own resource still wants the token: objectViewer
  grants no storage.buckets.get). google-cloud-cpp reads anonymously whenever
  CLOUD_STORAGE_EMULATOR_ENDPOINT is set and its caller passes no credentials (its
  DefaultOptionsWithCredentials), as the Run:ai streamer's C++ reader does:
  `GET /storage/v1/b/<bucket>` (the bucket), `GET /storage/v1/b/<bucket>/o?prefix=&delimiter=`
  (a listing: `items` and `prefixes`; one page), `GET /storage/v1/b/<bucket>/o/<object>` (its
  resource, with size, generation, md5Hash and crc32c) and the same with `alt=media` (its bytes, with
  `x-goog-hash`, and a single `Range: bytes=a-b` / `bytes=a-` as a 206). Unknown: a 404 in GCS's
  error shape. A download may also be asked at `/download/storage/v1/b/...?alt=media` (the JSON
  API's media path, which google-cloud-storage uses). Nothing is writable. Not modelled: pagination,
  versions, IAM, the XML API.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from loopback import LoopbackService

PROJECT = "my-project"
SERVICE_ACCOUNT = f"serving@{PROJECT}.iam.gserviceaccount.com"
TOKEN = "ya29.fake-workload-identity-token"
UPDATED = "2026-01-01T00:00:00.000Z"


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
    def __init__(self, bucket: str, name: str, data: bytes):
        self.bucket, self.name, self.data = bucket, name, data
        self.md5 = base64.b64encode(hashlib.md5(data).digest()).decode()  # noqa: S324 (GCS's own checksum)
        self.crc32c = base64.b64encode(crc32c(data).to_bytes(4, "big")).decode()

    def resource(self) -> dict:
        return {"kind": "storage#object", "id": f"{self.bucket}/{self.name}/1", "name": self.name,
                "bucket": self.bucket, "generation": "1", "metageneration": "1", "size": str(len(self.data)),
                "contentType": "application/octet-stream", "md5Hash": self.md5, "crc32c": self.crc32c,
                "storageClass": "STANDARD", "timeCreated": UPDATED, "updated": UPDATED}


class FakeGcs(LoopbackService):
    thread_name = "fakegcs"

    def __init__(self, buckets: dict[str, Path], public: tuple[str, ...] = ()):
        self.public = set(public)
        self.buckets = {name: {p.relative_to(root).as_posix(): StoredObject(name, p.relative_to(root).as_posix(), p.read_bytes())
                               for p in sorted(Path(root).rglob("*")) if p.is_file()}
                        for name, root in buckets.items()}
        self._lock = threading.Lock()
        self._media: dict[str, int] = {}
        self.requests: list[dict] = []  # method, path, status, bytes, auth: what was asked, in order

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

    def client_env(self) -> dict[str, str]:
        """What points a pod's Google clients here: the metadata server (host:port, no scheme: GKE's
        is metadata.google.internal, 169.254.169.254) and the storage endpoint, in google-cloud-cpp's
        spellings and in the Python clients' (google-auth pings GCE_METADATA_IP before it asks
        GCE_METADATA_ROOT; google-cloud-storage reads STORAGE_EMULATOR_HOST)."""
        host = self.url.removeprefix("http://")
        return {"GCE_METADATA_ROOT": host, "GCE_METADATA_IP": host,
                "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.url, "STORAGE_EMULATOR_HOST": self.url}

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


class _Handler(BaseHTTPRequestHandler):
    service: FakeGcs
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # the request log is gcs.requests
        pass

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        entry = {"method": "GET", "path": url.path, "query": url.query, "auth": self.headers.get("Authorization"),
                 "range": self.headers.get("Range"), "status": 200, "bytes": 0}
        key = None
        try:
            if url.path == "/" or url.path.startswith("/computeMetadata/"):
                status, body, headers = self._metadata(url.path)
            else:
                status, body, headers, key = self._storage(url.path, query)
        except Exception as exc:  # a stand-in bug must show as an answer, not a hung client
            status, body, headers = 500, _error(500, repr(exc)), {}
        entry["status"] = status
        if key:
            entry["bytes"] = len(body)
        self.service._sent(entry, key if status in (200, 206) else None)
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _metadata(self, path: str) -> tuple[int, bytes, dict]:
        if self.headers.get("Metadata-Flavor") != "Google":
            return 403, b"Missing Metadata-Flavor: Google header", {"Content-Type": "text/plain"}
        google = {"Metadata-Flavor": "Google"}
        text = {**google, "Content-Type": "application/text"}
        if path == "/":
            return 200, b"computeMetadata/\n", text
        if path == "/computeMetadata/v1/project/project-id":
            return 200, PROJECT.encode(), text
        accounts = "/computeMetadata/v1/instance/service-accounts/"
        if path == accounts + "default/":
            return 200, json.dumps({"aliases": ["default"], "email": SERVICE_ACCOUNT,
                                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}).encode(), google
        if path in (accounts + "default/token", accounts + SERVICE_ACCOUNT + "/token"):
            return 200, json.dumps({"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}).encode(), google
        return 404, b"not found", {**google, "Content-Type": "text/plain"}

    def _storage(self, path: str, query: dict) -> tuple[int, bytes, dict, str | None]:
        if path.startswith("/download/storage/v1/b/") and query.get("alt") == "media":
            path = path.removeprefix("/download")
        parts = path.removeprefix("/storage/v1/b/").split("/", 2)
        auth = self.headers.get("Authorization")
        anonymous_read = auth is None and parts[0] in self.service.public and len(parts) > 1
        if auth != f"Bearer {TOKEN}" and not anonymous_read:
            return 401, _error(401, "Anonymous caller does not have storage.objects.get access."), {}, None
        if not path.startswith("/storage/v1/b/") or parts[0] not in self.service.buckets:
            return 404, _error(404, "The specified bucket does not exist."), {}, None
        bucket = parts[0]
        if len(parts) == 1:
            return 200, json.dumps({"kind": "storage#bucket", "id": bucket, "name": bucket, "location": "US",
                                    "storageClass": "STANDARD", "timeCreated": UPDATED, "updated": UPDATED}).encode(), {}, None
        if parts[1] != "o":
            return 404, _error(404, "Not Found"), {}, None
        if len(parts) == 2:
            listing = self.service.listing(bucket, query.get("prefix", ""), query.get("delimiter", ""),
                                       query.get("includeTrailingDelimiter") == "true")
            return 200, json.dumps(listing).encode(), {}, None
        obj = self.service.buckets[bucket].get(urllib.parse.unquote(parts[2]))
        if obj is None:
            return 404, _error(404, "No such object: " + f"{bucket}/{urllib.parse.unquote(parts[2])}"), {}, None
        if query.get("alt") != "media":
            return 200, json.dumps(obj.resource()).encode(), {}, None
        headers = {"Content-Type": "application/octet-stream", "x-goog-generation": "1",
                   "x-goog-hash": f"crc32c={obj.crc32c},md5={obj.md5}"}
        key = f"{bucket}/{obj.name}"
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes="):].partition("-")
            start, end = int(first), min(int(last) if last else len(obj.data) - 1, len(obj.data) - 1)
            return 206, obj.data[start:end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(obj.data)}"}, key
        return 200, obj.data, headers, key


def _error(code: int, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message, "errors": [{"message": message}]}}).encode()


FakeGcs.handler = _Handler
