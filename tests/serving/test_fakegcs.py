"""The Cloud Storage and metadata stand-in (fakegcs.py) answers pyarrow's GcsFileSystem, the gs://
reader under Ray Serve LLM's CloudFileSystem, as GCS and GKE's metadata server do: the token comes
from the metadata server and every storage call carries it, downloads are checksum-verified by the
client, and an implied folder (no marker object) is not listed while its files still read. The
client runs in a subprocess because google-cloud-cpp reads its endpoints from the environment.
Ray's own calls over it (an adapter's download by Ray Serve LLM) run on the real serving chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyarrow.fs")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fakegcs  # noqa: E402

CLIENT = """
import json, sys, pyarrow.fs as pafs
fs = pafs.GcsFileSystem(retry_time_limit=__import__("datetime").timedelta(seconds=5))
def names(base):
    return sorted((i.path, i.type.name) for i in fs.get_file_info(pafs.FileSelector(base, recursive=False)))
out = {"root": names("adapters/tiny"), "marked": names("adapters/marked"),
       "tree": sorted(i.path for i in fs.get_file_info(pafs.FileSelector("adapters/tiny", recursive=True))
                      if i.type.name == "File")}
with fs.open_input_stream("adapters/tiny/pirate/adapter_model.safetensors") as f:
    out["read"] = len(f.read())
try:
    fs.open_input_stream("adapters/tiny/nope/x").read()
except OSError as e:
    out["missing"] = str(e)[:200]
print(json.dumps(out))
"""


@pytest.fixture
def bucket(tmp_path) -> Path:
    (tmp_path / "tiny" / "pirate").mkdir(parents=True)
    (tmp_path / "tiny" / "pirate" / "adapter_config.json").write_text("{}")
    (tmp_path / "tiny" / "pirate" / "adapter_model.safetensors").write_bytes(os.urandom(70_000))
    (tmp_path / "marked" / "a1").mkdir(parents=True)
    (tmp_path / "marked" / "a1" / "w").write_bytes(b"x")
    return tmp_path


def run(gcs: fakegcs.FakeGcs, code: str) -> dict:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GCE_", "CLOUD_STORAGE"))},
           "HOME": "/nonexistent", **gcs.client_env()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_pyarrow_reads_the_bucket_with_the_metadata_servers_token(bucket):
    with fakegcs.FakeGcs({"adapters": bucket}) as gcs:
        gcs.buckets["adapters"]["marked/a1/"] = fakegcs.StoredObject("adapters", "marked/a1/", b"")  # a folder marker
        seen = run(gcs, CLIENT)
        log = gcs.log()
    # An implied folder is no item of a listing: pyarrow (and so Ray's list_subfolders) sees nothing
    # under tiny/, though its files are there; a folder with a marker object is listed.
    assert seen["root"] == [], seen
    assert seen["marked"] == [["adapters/marked/a1", "Directory"]], seen
    assert seen["tree"] == ["adapters/tiny/pirate/adapter_config.json", "adapters/tiny/pirate/adapter_model.safetensors"]
    assert seen["read"] == 70_000 and "nope/x" in seen["missing"], seen
    token = [r for r in log if r["path"].endswith("/token")]
    storage = [r for r in log if r["path"].startswith("/storage/")]
    assert token and storage and all(r["auth"] == f"Bearer {fakegcs.TOKEN}" for r in storage), log
    assert gcs.media_bytes() == {"adapters/tiny/pirate/adapter_model.safetensors": 70_000}


def test_storage_refuses_a_caller_without_the_token_and_metadata_wants_its_header(bucket):
    import urllib.error
    import urllib.request

    with fakegcs.FakeGcs({"adapters": bucket}) as gcs:
        for url, headers, code in ((f"{gcs.url}/storage/v1/b/adapters/o", {}, 401),
                                   (f"{gcs.url}/computeMetadata/v1/instance/service-accounts/default/token", {}, 403),
                                   (f"{gcs.url}/storage/v1/b/other/o", {"Authorization": f"Bearer {fakegcs.TOKEN}"}, 404)):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            assert err.value.code == code, url


def test_listing_follows_gcs_delimiter_rules():
    gcs = fakegcs.FakeGcs({})
    gcs.buckets["b"] = {n: fakegcs.StoredObject("b", n, b"") for n in ("a/x", "a/d/", "a/d/y", "a/e/z", "c")}
    assert gcs.listing("b", "a/", "/", False) == {"kind": "storage#objects", "items": [gcs.buckets["b"]["a/x"].resource()],
                                                  "prefixes": ["a/d/", "a/e/"]}
    with_marker = gcs.listing("b", "a/", "/", True)
    assert [i["name"] for i in with_marker["items"]] == ["a/d/", "a/x"] and with_marker["prefixes"] == ["a/d/", "a/e/"]
    assert [i["name"] for i in gcs.listing("b", "a/", "", False)["items"]] == ["a/d/", "a/d/y", "a/e/z", "a/x"]
    assert fakegcs.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_what_google_auth_and_a_public_bucket_answer(bucket):
    """google-auth's ping (the root, answered with the Metadata-Flavor header), the project id, a
    download at the media path google-cloud-storage asks, and a public bucket's objects read by a
    caller without a token (its bucket resource still refused, as objectViewer grants no buckets.get)."""
    import urllib.error
    import urllib.request

    def get(url, headers=None):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
                return resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as err:
            return err.code, b"", err.headers

    flavor, token = {"Metadata-Flavor": "Google"}, {"Authorization": f"Bearer {fakegcs.TOKEN}"}
    with fakegcs.FakeGcs({"adapters": bucket, "open": bucket}, public=("open",)) as gcs:
        status, body, headers = get(gcs.url + "/", flavor)
        assert (status, headers["Metadata-Flavor"]) == (200, "Google")
        assert get(gcs.url + "/computeMetadata/v1/project/project-id", flavor)[:2] == (200, fakegcs.PROJECT.encode())
        media = "/storage/v1/b/adapters/o/tiny%2Fpirate%2Fadapter_config.json?alt=media"
        assert get(gcs.url + "/download" + media, token)[:2] == (200, b"{}")
        assert get(gcs.url + "/download" + media)[0] == 401  # a private bucket wants the token
        assert get(gcs.url + media.replace("adapters", "open"))[:2] == (200, b"{}")
        assert get(gcs.url + "/storage/v1/b/open/o?prefix=tiny/")[0] == 200
        assert get(gcs.url + "/storage/v1/b/open")[0] == 401
        assert gcs.media_bytes() == {"adapters/tiny/pirate/adapter_config.json": 2, "open/tiny/pirate/adapter_config.json": 2}
