"""`tputorch submit` / `serve` without a cluster: objects from flags, local validation, exit codes."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tputorch.cli import main as cli, submit
from tputorch.api import spec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch, tmp_path):
    """No kubeconfig anywhere: a command that tried to reach a cluster would fail with exit 1."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def flags(*argv) -> argparse.Namespace:
    return cli.build_parser().parse_args(["submit", *argv])


@pytest.mark.parametrize("value, expected", [
    ("v6e-4x4", ("v6e", "4x4")),
    ("v5p-2x2x2", ("v5p", "2x2x2")),
    ("tpu-v6e-slice-2x4", ("tpu-v6e-slice", "2x4")),
    ("tpu7x-2x2x1", ("tpu7x", "2x2x1")),
])
def test_split_tpu(value, expected):
    assert submit.split_tpu(value) == expected


@pytest.mark.parametrize("value", ["v6e", "4x4", "v6e-4x", "v6e_4x4", "-4x4", ""])
def test_split_tpu_refuses_what_is_not_accel_topology(value):
    with pytest.raises(submit.InvalidFlags) as err:
        submit.split_tpu(value)
    assert "--tpu" in str(err.value) and "ACCELERATOR-TOPOLOGY" in str(err.value)


def test_job_from_flags_is_the_job_a_user_would_write():
    body, errors = submit.job_from_flags(flags(
        "--tpu", "v6e-4x4", "--image", "img:1", "--name", "llama", "--chips-per-worker", "2", "--spot",
        "--env", "A=1", "--env", "B=x=y", "--", "python", "train.py", "--note", "two words"), "team-a")
    assert errors == []
    assert body == {
        "apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4", "chipsPerWorker": 2, "spot": True},
                 "image": "img:1", "entrypoint": "python train.py --note 'two words'",
                 "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "x=y"}]},
    }
    job = submit.validate_job(body)
    assert (job.slice.hosts, job.workers, job.namespace) == (4, 8, "team-a")


def test_default_name_is_valid_and_differs():
    one, _ = submit.job_from_flags(flags("--tpu", "tpu-v6e-slice-2x2", "--image", "i", "--", "python", "t.py"), "ns")
    two, _ = submit.job_from_flags(flags("--tpu", "tpu-v6e-slice-2x2", "--image", "i", "--", "python", "t.py"), "ns")
    assert one["metadata"]["name"].startswith("tpu-v6e-slice-")
    assert one["metadata"]["name"] != two["metadata"]["name"]
    submit.validate_job(one)  # a DNS-1035 label the operator accepts


def test_working_dir_uri_goes_to_the_runtime_env_and_a_local_dir_is_refused(tmp_path):
    body, errors = submit.job_from_flags(flags("--tpu", "v6e-2x2", "--image", "i", "--working-dir",
                                               "gs://bucket/code.zip", "--", "python", "t.py"), "ns")
    assert errors == [] and body["spec"]["runtimeEnv"] == {"working_dir": "gs://bucket/code.zip"}
    _, errors = submit.job_from_flags(flags("--tpu", "v6e-2x2", "--image", "i", "--working-dir", str(tmp_path),
                                            "--", "python", "t.py"), "ns")
    assert [e.flag for e in errors] == ["--working-dir"]
    assert "local directory" in errors[0].message and "image" in errors[0].message


def test_invalid_submit_lists_every_error_and_exits_2_without_a_cluster(capsys):
    code, out, err = run(capsys, "submit", "--tpu", "v6e-3x3", "--image", "i", "--chips-per-worker", "3",
                         "--env", "NOEQUALS", "--env", "TPU_VISIBLE_CHIPS=0", "--", "python", "t.py")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert "--env: 'NOEQUALS' must be NAME=VALUE" in lines
    assert any(line.startswith("spec.tpu.topology: '3x3'") for line in lines)
    assert any(line.startswith("spec.tpu.chipsPerWorker: 3") for line in lines)
    assert not any(line.startswith("spec.env") for line in lines), "a bad --env hides the spec.env errors"


def test_missing_flags_are_named_once(capsys):
    code, _, err = run(capsys, "submit")
    assert code == 2
    lines = err.strip().splitlines()
    assert sorted(line.split(":")[0] for line in lines) == ["--image", "--tpu", "command"]


def test_forbidden_env_is_refused_as_the_operator_refuses_it(capsys):
    code, _, err = run(capsys, "submit", "--tpu", "v6e-4x4", "--image", "i", "--env", "TPU_VISIBLE_CHIPS=0",
                       "--", "python", "t.py")
    assert code == 2 and "spec.env[0].name: 'TPU_VISIBLE_CHIPS'" in err


def test_dry_run_prints_the_job_and_its_rayjob(capsys):
    code, out, err = run(capsys, "submit", "--tpu", "v6e-4x4", "--image", "img", "--name", "demo", "-n", "team",
                         "--dry-run", "--", "python", "train.py")
    assert code == 0, err
    job, rayjob = yaml.safe_load_all(out)
    assert job["kind"] == "TPUTorchJob" and job["metadata"] == {"name": "demo", "namespace": "team"}
    assert rayjob["kind"] == "RayJob" and rayjob["metadata"]["namespace"] == "team"
    assert rayjob["spec"]["entrypoint"] == "python train.py"
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] == 4


def test_dry_run_from_file_keeps_the_file_and_applies_overrides(capsys):
    code, out, err = run(capsys, "submit", "-f", str(EXAMPLES / "v6e-4x4.yaml"), "--name", "other", "--dry-run")
    assert code == 0, err
    job, rayjob = yaml.safe_load_all(out)
    want = yaml.safe_load((EXAMPLES / "v6e-4x4.yaml").read_text())
    assert job["spec"] == want["spec"] and job["metadata"]["name"] == "other" == rayjob["metadata"]["name"]


def test_file_must_hold_one_job(capsys, tmp_path):
    docs = [yaml.safe_load((EXAMPLES / n).read_text()) for n in ("v6e-4x4.yaml", "v6e-2x2-single-host.yaml")]
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump_all(docs))
    code, _, err = run(capsys, "submit", "-f", str(two))
    assert code == 2 and "exactly one TPUTorchJob" in err
    code, _, err = run(capsys, "submit", "-f", str(EXAMPLES / "v6e-4x4.yaml"), "--tpu", "v6e-2x2")
    assert code == 2 and "must not be combined" in err


def test_a_valid_job_without_a_cluster_exits_1_saying_so(capsys):
    code, _, err = run(capsys, "submit", "--tpu", "v6e-4x4", "--image", "i", "--", "python", "t.py")
    assert code == 1 and "kubeconfig" in err.lower()


def test_serve_dry_run_builds_the_service_and_its_rayservice(capsys):
    code, out, err = run(capsys, "serve", "--tpu", "v6e-2x4", "--image", "vllm:tpu", "--model", "meta-llama/Llama-3.1-8B",
                         "--tp", "8", "--hf-token-secret", "hf:token", "--min-replicas", "1", "--max-replicas", "2",
                         "--name", "llama", "-n", "team", "--dry-run")
    assert code == 0, err
    service, rayservice = yaml.safe_load_all(out)
    assert service == {
        "apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService",
        "metadata": {"name": "llama", "namespace": "team"},
        "spec": {"tpu": {"accelerator": "v6e", "topology": "2x4"}, "image": "vllm:tpu",
                 "model": {"source": "meta-llama/Llama-3.1-8B", "hfTokenSecret": {"name": "hf", "key": "token"}},
                 "engine": {"tensorParallelSize": 8}, "replicas": {"min": 1, "max": 2}},
    }
    assert rayservice["kind"] == "RayService" and rayservice["metadata"] == {**rayservice["metadata"], "name": "llama", "namespace": "team"}
    assert spec.parse_service(service).tensor_parallel_size == 8


def test_serve_is_validated_by_the_operators_service_parser(capsys):
    code, _, err = run(capsys, "serve", "--tpu", "v6e", "--image", "i", "--model", "m", "--min-replicas", "3",
                       "--max-replicas", "1", "--hf-token-secret", "nokey")
    assert code == 2
    lines = err.strip().splitlines()
    assert any(line.startswith("--tpu: 'v6e'") for line in lines)
    assert "--hf-token-secret: 'nokey' must be SECRET:KEY, the Secret and its key holding the token" in lines
    assert "spec.replicas.max: 1 must be at least spec.replicas.min (3)" in lines
    assert not any(line.startswith(("spec.tpu", "spec.model.hfTokenSecret")) for line in lines), "covered by the flags' errors"
    code, _, err = run(capsys, "serve", "--tpu", "v6e-2x4", "--image", "i", "--model", "m", "--tp", "3")
    assert code == 2 and err.startswith("spec.engine.tensorParallelSize: 3")
    code, _, err = run(capsys, "serve", "--tpu", "v6e-2x4", "--image", "i", "--model", "m", "--lora-path", "s3://b/a")
    assert code == 2 and err.startswith("spec.lora.path: 's3://b/a' must be gs://<bucket>[/<folder>]"), err


def test_serve_with_lora_adapters(capsys):
    code, out, err = run(capsys, "serve", "--tpu", "v6e-2x4", "--image", "i", "--model", "m", "--served-model-name", "qwen3",
                         "--lora-path", "gs://my-adapters/qwen3", "--name", "q", "--dry-run")
    assert code == 0, err
    service, rayservice = yaml.safe_load_all(out)
    assert service["spec"]["lora"] == {"path": "gs://my-adapters/qwen3"}
    assert spec.parse_service(service).lora == spec.Lora(path="gs://my-adapters/qwen3", max_adapters=4, max_rank=16)
    assert "dynamic_lora_loading_path: gs://my-adapters/qwen3" in rayservice["spec"]["serveConfigV2"]


def docs_reference_serve() -> list[str]:
    """The `tputorch serve` command docs/getting-started.md gives for the reference service, as argv
    (its image the example's in place of the reader's, without --dry-run)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import doccmds

    (text,) = [c.text for c in doccmds.all_commands([ROOT / "docs" / "getting-started.md"])
               if c.text.startswith("tputorch serve ")]
    example = yaml.safe_load((EXAMPLES / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
    argv = shlex.split(text.replace("$SERVE_IMAGE@$SERVE_DIGEST", example["spec"]["image"]))[1:]
    assert "--dry-run" in argv
    return [a for a in argv if a != "--dry-run"]


def test_serve_flags_express_the_reference_service():
    """Issue 58: the docs' command makes examples/serve/qwen3-moe-v6e-4x4.yaml's service."""
    a = cli.build_parser().parse_args([*docs_reference_serve(), "-n", "default"])
    body, errors = submit.service_from_flags(a, "default")
    assert errors == []
    example = yaml.safe_load((EXAMPLES / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
    example["metadata"]["namespace"] = "default"
    assert body["metadata"]["name"] == example["metadata"]["name"]
    assert body["spec"] == example["spec"]
    assert spec.parse_service(body) == spec.parse_service(example)


def test_serve_service_account_worker_disk_and_engine_args(capsys):
    code, out, err = run(capsys, "serve", "--tpu", "v6e-2x4", "--image", "i", "--model", "/models/m", "--name", "m",
                         "--service-account", "ray-tpu", "--worker-ephemeral-storage", "200Gi",
                         "--engine-arg", 'compilation_config={"level": 3}', "--engine-arg", "max_num_seqs=64",
                         "--engine-arg", "tokenizer_mode=", "--dry-run")
    assert code == 0, err
    service, rayservice = yaml.safe_load_all(out)
    assert service["spec"]["serviceAccountName"] == "ray-tpu"
    assert service["spec"]["worker"] == {"ephemeralStorage": "200Gi"}
    assert service["spec"]["engine"] == {"args": {"compilation_config": {"level": 3}, "max_num_seqs": 64, "tokenizer_mode": ""}}
    worker = rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["serviceAccountName"] == "ray-tpu"
    assert worker["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "200Gi"


@pytest.mark.parametrize("argv, line", [
    (["--engine-arg", "max_num_seqs"], "--engine-arg: 'max_num_seqs' must be KEY=VALUE"),
    (["--engine-arg", "=3"], "--engine-arg: '=3' must be KEY=VALUE"),
    (["--engine-arg", "max_num_seqs=1", "--engine-arg", "max_num_seqs=2"], "--engine-arg: 'max_num_seqs=2' gives max_num_seqs a second time"),
    (["--engine-arg", "compilation_config={level: 3"], "--engine-arg: 'compilation_config={level: 3' has a VALUE that is not a YAML value"),
    (["--engine-arg", "no_such_arg=1"], "spec.engine.args.no_such_arg"),
    (["--engine-arg", "max_model_len=8192"], "spec.engine.args.max_model_len"),
    (["--worker-memory", "lots"], "spec.worker.memory: 'lots'"),
])
def test_serve_flags_that_cannot_be_read_are_refused(capsys, argv, line):
    code, _, err = run(capsys, "serve", "--tpu", "v6e-2x4", "--image", "i", "--model", "m", *argv)
    assert code == 2 and err.startswith(line), err


def test_the_operator_never_imports_rich():
    """The operator image installs the package without the `cli` extra: `run` must not need rich."""
    code = ("import sys, tputorch.cli.main, tputorch.controller.handlers; "
            "sys.exit(1 if any(m == 'rich' or m.startswith('rich.') for m in sys.modules) else 0)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


def test_submit_parses_the_example_like_validate_does():
    body = submit.job_from_file(str(EXAMPLES / "v6e-4x4.yaml"), None, None)
    assert submit.validate_job(body) == spec.parse(yaml.safe_load((EXAMPLES / "v6e-4x4.yaml").read_text()))


def test_the_in_cluster_fallback_says_so(monkeypatch, capsys):
    from kubernetes import config

    from tputorch.cli import client as client_mod

    def no_kubeconfig(*_, **__):
        raise config.ConfigException("Invalid kube-config file. No configuration found.")

    monkeypatch.setattr(config, "list_kube_config_contexts", no_kubeconfig)  # what ~/.kube/config missing does
    monkeypatch.setattr(config, "new_client_from_config", no_kubeconfig)
    monkeypatch.setattr(config, "load_incluster_config", lambda: None)
    monkeypatch.setattr(client_mod, "_incluster_namespace", lambda: "team-a")
    api = client_mod.connect()
    assert api.namespace == "team-a"
    err = capsys.readouterr().err
    assert "no kubeconfig found (Invalid kube-config file. No configuration found.)" in err
    assert "using this pod's ServiceAccount (in-cluster config), namespace team-a" in err
