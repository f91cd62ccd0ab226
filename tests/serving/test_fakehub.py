"""The fake Hub (fakehub.py) answers huggingface_hub and transformers as the Hub does, and its byte
counts tell a download from a cache hit: a first run with an empty HF_HOME fetches every byte of
the files it needs, a second run with the same HF_HOME fetches none (only metadata). The clients
run in subprocesses because huggingface_hub reads HF_ENDPOINT and HF_HOME at import. vLLM's own
calls (which go through the same huggingface_hub) are checked on the real serving chain
(tests/cluster/test_real_serving.py) and by hand with `python tests/serving/fakehub.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fakehub  # noqa: E402
import tinymodel  # noqa: E402

REPO_ID = "tputorch/tiny"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tinymodel.make(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def hub(model):
    with fakehub.FakeHub({REPO_ID: model}) as hub:
        yield hub


def run(hub: fakehub.FakeHub, hf_home: Path, code: str) -> dict:
    """Run `code` (which prints one JSON line last) against the fake Hub with HF_HOME `hf_home`."""
    out = subprocess.run([sys.executable, "-c", code], env=fakehub.client_env(hub.url, hf_home),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def file_gets(hub: fakehub.FakeHub, since: int) -> list[dict]:
    return [r for r in hub.log()[since:] if r["method"] == "GET" and "/resolve/" in r["path"]]


def test_snapshot_download_fetches_every_byte_once_and_then_nothing(hub, tmp_path):
    code = ("import json; from huggingface_hub import snapshot_download, hf_hub_download\n"
            f"d = snapshot_download({REPO_ID!r}); c = hf_hub_download({REPO_ID!r}, 'config.json')\n"
            "print(json.dumps({'dir': d, 'config': c}))")
    first = run(hub, tmp_path, code)
    sizes = hub.file_sizes(REPO_ID)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {k.split("/")[-1] for k in sizes}
    # Every file of the repo, each byte sent once, whole (no Range).
    assert hub.full_bytes() == sizes and hub.range_bytes() == {}
    assert hub.bytes_sent() == sum(sizes.values())
    snapshot = Path(first["dir"])
    assert all((snapshot / k.removeprefix(REPO_ID + "/")).stat().st_size == n for k, n in sizes.items())

    seen = len(hub.log())
    second = run(hub, tmp_path, code)
    assert second == first
    assert hub.full_bytes() == sizes and hub.range_bytes() == {}, "the second run downloaded again"
    assert file_gets(hub, seen) == []
    # What the second run still asks: the commit of main, and a HEAD for the file asked by name.
    assert {(r["method"], r["path"].split("?")[0]) for r in hub.log()[seen:]} == {
        ("GET", f"/api/models/{REPO_ID}/revision/main"), ("HEAD", f"/{REPO_ID}/resolve/main/config.json")}

    # Another, empty HF_HOME downloads it all again: the counts are per cache, not per server.
    run(hub, tmp_path / "other", code)
    assert hub.full_bytes() == {k: 2 * n for k, n in sizes.items()}


def test_transformers_loads_config_and_tokenizer_from_the_hub_then_from_its_cache(hub, tmp_path):
    code = ("import json; from transformers import AutoConfig, AutoTokenizer\n"
            f"c = AutoConfig.from_pretrained({REPO_ID!r}); t = AutoTokenizer.from_pretrained({REPO_ID!r})\n"
            "print(json.dumps({'model_type': c.model_type, 'vocab': len(t),"
            " 'chat': t.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False)}))")
    first = run(hub, tmp_path, code)
    assert first["model_type"] == "llama" and first["chat"] == "<|user|>hi</s>", first
    needed = {f"{REPO_ID}/{f}" for f in ("config.json", "tokenizer_config.json", "tokenizer.json", "chat_template.jinja")}
    sizes = hub.file_sizes(REPO_ID)
    assert hub.full_bytes() == {k: sizes[k] for k in needed}, "not the config and tokenizer files, each once"
    # transformers asks for files the repo does not have: 404 EntryNotFound, which huggingface_hub caches.
    missing = {r["path"].rsplit("/", 1)[-1] for r in hub.log() if r["status"] == 404 and "/resolve/" in r["path"]}
    assert "special_tokens_map.json" in missing, hub.log()

    seen = len(hub.log())
    assert run(hub, tmp_path, code) == first
    assert file_gets(hub, seen) == [] and hub.full_bytes() == {k: sizes[k] for k in needed}
    # Not even a HEAD: huggingface_hub kept the absent files' 404s, and the tree listing of the commit.
    assert [r for r in hub.log()[seen:] if r["method"] == "HEAD"] == []


def test_range_reads_and_the_hubs_errors(hub, tmp_path):
    """huggingface_hub's safetensors header read (vLLM calls it at each engine start for a model
    with tied embeddings) is a Range GET, counted apart from downloads; unknown repos, files and
    revisions get the Hub's error codes, which huggingface_hub turns into its own errors."""
    code = ("import json; from huggingface_hub import HfApi, hf_hub_download, errors\n"
            f"meta = HfApi().get_safetensors_metadata({REPO_ID!r})\n"
            "out = {'tensors': len(meta.files_metadata['model.safetensors'].tensors)}\n"
            f"for name, call in [('repo', lambda: hf_hub_download('tputorch/nothing', 'config.json')),\n"
            f"                   ('file', lambda: hf_hub_download({REPO_ID!r}, 'nothing.json')),\n"
            f"                   ('revision', lambda: hf_hub_download({REPO_ID!r}, 'config.json', revision='v9'))]:\n"
            "    try:\n"
            "        call(); out[name] = None\n"
            "    except Exception as exc:\n"
            "        out[name] = type(exc).__name__\n"
            "print(json.dumps(out))")
    out = run(hub, tmp_path, code)
    assert out["tensors"] > 0
    assert (out["repo"], out["file"], out["revision"]) == (
        "RepositoryNotFoundError", "RemoteEntryNotFoundError", "RevisionNotFoundError"), out
    assert hub.full_bytes() == {}
    assert hub.range_bytes() == {f"{REPO_ID}/model.safetensors": 100_001}  # bytes=0-100000
