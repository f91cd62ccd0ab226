"""A stand-in for the Hugging Face Hub on 127.0.0.1 that serves model repos from local directories
and counts the bytes of file content it sends, so that a test can tell a download from a cache hit.
Clients reach it through HF_ENDPOINT (huggingface_hub reads it at import).

    with FakeHub({"tputorch/tiny": Path("/models/tiny")}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp)}
        ...
        hub.full_bytes()    # {"tputorch/tiny/model.safetensors": 1612345, ...}: whole-file GETs
        hub.range_bytes()   # the same for Range GETs (huggingface_hub's safetensors header peek)

What it answers is what huggingface_hub 2.4 (which transformers 5 and vLLM 0.29 call) asks for a
model repo, read in its file_download.py, hf_api.py and utils/_http.py:

- `HEAD|GET /<repo>/resolve/<revision>/<path>`: the file, with `X-Repo-Commit` (required),
  `ETag` (the git blob id; for LFS files the sha256, also as `X-Linked-Etag` with `X-Linked-Size`),
  `Content-Length`, and a single `Range: bytes=a-b` / `bytes=a-` as a 206. A missing file is a 404
  with `X-Error-Code: EntryNotFound` and `X-Repo-Commit` (huggingface_hub caches the absence).
- `GET /api/models/<repo>` and `/api/models/<repo>/revision/<revision>`: the repo's info (`sha`,
  `siblings`), which snapshot_download and HfApi.resolve_revision read the commit from.
- `GET /api/models/<repo>/tree/<revision>[/<path>]?recursive=`: the listing snapshot_download and
  list_repo_files read (one page: the Hub pages by `Link` header only past 1000 entries).
- An unknown repo is a 404 `RepoNotFound`, an unknown revision a 404 `RevisionNotFound`.

The revision is `main` or the commit id (one commit per repo, derived from its files). Not modelled:
the real Hub's redirect of LFS files to its CDN (or Xet storage), auth, gated repos, pagination,
datasets and spaces."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from loopback import LoopbackService

# What the Hub's default .gitattributes stores in LFS: the weights.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx")
CHUNK = 1 << 16


def client_env(hub_url: str, hf_home: Path | str, base: dict | None = None) -> dict[str, str]:
    """An environment whose Hugging Face clients use the hub at `hub_url` and the cache `hf_home`
    (and nothing of the caller's HF_* settings, offline mode included)."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"}
    no_proxy = ",".join(p for p in (env.get("NO_PROXY"), "127.0.0.1") if p)
    return {**env, "HF_ENDPOINT": hub_url, "HF_HOME": str(hf_home), "HF_HUB_DISABLE_TELEMETRY": "1",
            "NO_PROXY": no_proxy, "no_proxy": no_proxy}


class RepoFile:
    def __init__(self, path: Path, rel: str):
        data = path.read_bytes()
        self.path, self.rel, self.size = path, rel, len(data)
        self.blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's object id
        self.sha256 = hashlib.sha256(data).hexdigest() if rel.endswith(LFS_SUFFIXES) else None

    def tree_entry(self) -> dict:
        entry = {"type": "file", "oid": self.blob_id, "size": self.size, "path": self.rel}
        if self.sha256:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


class Repo:
    def __init__(self, repo_id: str, root: Path):
        self.id = repo_id
        self.files = {p.relative_to(root).as_posix(): RepoFile(p, p.relative_to(root).as_posix())
                      for p in sorted(root.rglob("*")) if p.is_file()}
        listing = "\n".join(f"{f.rel} {f.blob_id}" for f in self.files.values())
        self.commit = hashlib.sha1(f"{repo_id}\n{listing}".encode()).hexdigest()

    def has_revision(self, revision: str) -> bool:
        return revision in ("main", self.commit)

    def info(self) -> dict:
        return {"id": self.id, "modelId": self.id, "sha": self.commit, "private": False, "gated": False,
                "disabled": False, "tags": [], "siblings": [{"rfilename": rel} for rel in self.files]}

    def tree(self, under: str, recursive: bool) -> list[dict] | None:
        """Entries under `under` ("" for the root), or None when no file lies under it."""
        prefix = f"{under}/" if under else ""
        inside = [f for rel, f in self.files.items() if rel.startswith(prefix)]
        if under and not inside:
            return None
        entries, folders = [], set()
        for f in inside:
            rest = f.rel[len(prefix):]
            if recursive or "/" not in rest:
                entries.append(f.tree_entry())
            parts = rest.split("/")[:-1]
            for depth in range(1, (len(parts) if recursive else min(1, len(parts))) + 1):
                folders.add(prefix + "/".join(parts[:depth]))
        for folder in sorted(folders):
            entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                            "path": folder})
        return entries


class FakeHub(LoopbackService):
    thread_name = "fakehub"

    def __init__(self, repos: dict[str, Path]):
        self.repos = {repo_id: Repo(repo_id, Path(root)) for repo_id, root in repos.items()}
        self._lock = threading.Lock()
        self._full: dict[str, int] = {}
        self._ranged: dict[str, int] = {}
        self.requests: list[dict] = []  # method, path, range, status, bytes: what was asked, in order

    # -- what was sent -----------------------------------------------------------------------------
    def full_bytes(self) -> dict[str, int]:
        """Bytes of file content sent by whole-file GETs, per "<repo>/<path>"."""
        with self._lock:
            return dict(self._full)

    def range_bytes(self) -> dict[str, int]:
        """Bytes of file content sent by Range GETs (a file's first bytes peeked at), per "<repo>/<path>"."""
        with self._lock:
            return dict(self._ranged)

    def bytes_sent(self) -> int:
        """Every byte of file content sent (whole-file and Range GETs)."""
        with self._lock:
            return sum(self._full.values()) + sum(self._ranged.values())

    def file_sizes(self, repo_id: str) -> dict[str, int]:
        """The size of each file of `repo_id`, keyed as full_bytes() keys them."""
        return {f"{repo_id}/{rel}": f.size for rel, f in self.repos[repo_id].files.items()}

    def log(self) -> list[dict]:
        with self._lock:
            return list(self.requests)

    def _sent(self, entry: dict, key: str | None, ranged: bool) -> None:
        with self._lock:
            self.requests.append(entry)
            if key and entry["method"] == "GET" and entry["bytes"]:
                counts = self._ranged if ranged else self._full
                counts[key] = counts.get(key, 0) + entry["bytes"]

    # -- the server --------------------------------------------------------------------------------
    def repo_of(self, path: str) -> tuple[Repo | None, str]:
        """The served repo `path` starts with ("<org>/<name>/..."), and the rest of the path."""
        for repo_id, repo in self.repos.items():
            if path == repo_id or path.startswith(repo_id + "/"):
                return repo, path[len(repo_id) + 1:]
        return None, path


class _Handler(BaseHTTPRequestHandler):
    service: FakeHub
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects of the Hub

    def log_message(self, *args) -> None:  # the request log is hub.requests
        pass

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def _answer(self, send_body: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(url.path).lstrip("/")
        query = urllib.parse.parse_qs(url.query)
        entry = {"method": self.command, "path": self.path, "range": self.headers.get("Range"), "status": 0,
                 "bytes": 0}
        key, ranged = None, False
        try:
            if path.startswith("api/models/"):
                self._api(path[len("api/models/"):], query, entry, send_body)
            else:
                key, ranged = self._resolve(path, entry, send_body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.service._sent(entry, key, ranged)

    # /api/models/<repo>[/revision/<rev> | /tree/<rev>[/<path>]]
    def _api(self, path: str, query: dict, entry: dict, send_body: bool) -> None:
        repo, rest = self.service.repo_of(path)
        if repo is None:
            return self._error(entry, 404, "RepoNotFound", f"Repository not found: {path}", None, send_body)
        if rest == "":
            return self._json(entry, repo.info(), repo.commit, send_body)
        m = re.fullmatch(r"(revision|tree)/([^/]+)(?:/(.*))?", rest)
        if not m or (m[1] == "revision" and m[3]):
            return self._error(entry, 404, None, f"Not found: {path}", repo.commit, send_body)
        if not repo.has_revision(m[2]):
            return self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {m[2]}", None, send_body)
        if m[1] == "revision":
            return self._json(entry, repo.info(), repo.commit, send_body)
        recursive = (query.get("recursive") or ["false"])[0].lower() in ("1", "true")
        entries = repo.tree((m[3] or "").strip("/"), recursive)
        if entries is None:
            return self._error(entry, 404, "EntryNotFound", f"{m[3]} does not exist", repo.commit, send_body)
        return self._json(entry, entries, repo.commit, send_body)

    # /<repo>/resolve/<rev>/<path>
    def _resolve(self, path: str, entry: dict, send_body: bool) -> tuple[str | None, bool]:
        repo, rest = self.service.repo_of(path)
        m = re.fullmatch(r"resolve/([^/]+)/(.+)", rest)
        if repo is None or not m:
            self._error(entry, 404, "RepoNotFound", f"Repository not found: {path}", None, send_body)
            return None, False
        if not repo.has_revision(m[1]):
            self._error(entry, 404, "RevisionNotFound", f"Invalid rev id: {m[1]}", None, send_body)
            return None, False
        f = repo.files.get(m[2])
        if f is None:
            self._error(entry, 404, "EntryNotFound", f"{m[2]} does not exist", repo.commit, send_body)
            return None, False
        start, end = 0, f.size - 1
        wanted = self.headers.get("Range")
        if wanted:
            r = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
            if not r or int(r[1]) >= f.size:
                self._error(entry, 416, None, f"Range {wanted} of {f.size} bytes", repo.commit, send_body)
                return None, False
            start, end = int(r[1]), min(int(r[2]) if r[2] else f.size - 1, f.size - 1)
        self.send_response(206 if wanted else 200)
        entry["status"] = 206 if wanted else 200
        etag = f.sha256 or f.blob_id
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        if f.sha256:
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("X-Linked-Size", str(f.size))
        self.send_header("Accept-Ranges", "bytes")
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if send_body:
            with open(f.path, "rb") as fh:
                fh.seek(start)
                left = end - start + 1
                while left > 0:
                    chunk = fh.read(min(CHUNK, left))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
                    entry["bytes"] += len(chunk)  # counted as sent, chunk by chunk
        return f"{repo.id}/{f.rel}", bool(wanted)

    def _json(self, entry: dict, body, commit: str | None, send_body: bool, code: int = 200,
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        entry["status"] = code
        self.send_response(code)
        for header, value in (headers or {}).items():
            self.send_header(header, value)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.wfile.write(data)

    def _error(self, entry: dict, code: int, error_code: str | None, message: str, commit: str | None,
               send_body: bool) -> None:
        # huggingface_hub reads X-Error-Code (RepoNotFound, EntryNotFound, ...) to pick its exception.
        headers = {"X-Error-Code": error_code} if error_code else {}
        self._json(entry, {"error": message}, commit, send_body, code, {**headers, "X-Error-Message": message})


def main(argv: list[str]) -> int:
    """By hand: run a command twice against the fake Hub with one fresh HF_HOME, printing what it
    asked and the bytes sent after each run (how vLLM's calls were looked at).

        python tests/serving/fakehub.py tputorch/tiny=/path/to/model -- python -c '...'
    """
    if "--" not in argv:
        print(main.__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    repos = dict(a.split("=", 1) for a in argv[:split])
    command = argv[split + 1:]
    with FakeHub({k: Path(v) for k, v in repos.items()}) as hub, tempfile.TemporaryDirectory() as hf_home:
        for n in (1, 2):
            seen = len(hub.log())
            rc = subprocess.run(command, env=client_env(hub.url, hf_home)).returncode
            print(f"--- run {n}: exit {rc}")
            for r in hub.log()[seen:]:
                print(f"{r['method']:4} {r['status']} {r['bytes']:>9} {r['path']}" + (f" ({r['range']})" if r["range"] else ""))
            print(f"whole files: {hub.full_bytes()}\nranges: {hub.range_bytes()}")
        for repo_id in repos:
            print(f"sizes: {hub.file_sizes(repo_id)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


FakeHub.handler = _Handler
