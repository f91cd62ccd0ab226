"""The CLI, called as users call it."""

import json
import pathlib
import subprocess
import sys

import pytest
import yaml

from tputorch.api import topology
from tputorch.cli import main as cli

ROOT = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_render_example_prints_a_rayjob(capsys):
    code, out, err = run(capsys, "render", str(EXAMPLES / "v6e-4x4.yaml"))
    assert code == 0, err
    rayjob = yaml.safe_load(out)
    assert rayjob["kind"] == "RayJob"
    assert rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["numOfHosts"] == 4


def test_render_lists_every_error_and_fails(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchJob", "metadata": {"name": "x"},
                                   "spec": {"tpu": {"accelerator": "v6e", "topology": "3x3", "slices": 2}, "image": "i"}}))
    code, out, err = run(capsys, "render", str(bad))
    assert code == 1 and out == ""
    assert "spec.tpu.topology: '3x3'" in err and "spec.tpu.slices: 2 must be 1" in err and "spec.entrypoint: is required" in err


def test_render_multi_document_file(tmp_path, capsys):
    docs = [yaml.safe_load((EXAMPLES / n).read_text()) for n in ("v6e-4x4.yaml", "v6e-2x2-single-host.yaml")]
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump_all(docs))
    code, out, _ = run(capsys, "render", str(both))
    assert code == 0
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == [d["metadata"]["name"] for d in docs]


def test_validate(capsys, tmp_path):
    code, out, _ = run(capsys, "validate", str(EXAMPLES / "v6e-4x4.yaml"))
    assert code == 0 and "valid; v6e 4x4, 4 host(s) x 4 chips, 16 worker(s)" in out
    other = tmp_path / "other.yaml"
    other.write_text("kind: Deployment\n")
    code, _, err = run(capsys, "validate", str(other))
    assert code == 1 and "kind must be TPUTorchJob or TPUTorchService" in err
    code, _, err = run(capsys, "validate", str(tmp_path / "missing.yaml"))
    assert code == 1 and "No such file" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    code, _, err = run(capsys, "validate", str(broken))
    assert code == 1 and "broken.yaml" in err


def test_topologies_table_and_json(capsys):
    code, out, _ = run(capsys, "topologies", "--accelerator", "v6e")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["ACCELERATOR", "TOPOLOGY", "CHIPS", "HOSTS"]
    assert any(line.split()[:4] == ["v6e", "4x4", "16", "4"] for line in lines)
    assert lines[0].split()[-2:] == ["TRAINS", "SERVES"]
    # The two 2x4 layouts: one 8-chip VM serves; two 4-chip VMs train only (Ray Serve LLM maps 2x4 to 8-chip hosts).
    assert ["v6e", "2x4", "8", "1", "8", "ct6e-standard-8t", "v6e-8", "8", "yes", "yes"] in [line.split() for line in lines]
    assert ["v6e", "2x4", "8", "2", "4", "ct6e-standard-4t", "v6e-8", "8", "yes", "no"] in [line.split() for line in lines]
    code, out, _ = run(capsys, "topologies", "-o", "json")
    rows = json.loads(out)
    tpu7x = next(r for r in rows if (r["accelerator"], r["topology"]) == ("tpu7x", "2x2x2"))
    assert (tpu7x["machineType"], tpu7x["podType"], tpu7x["trains"], tpu7x["serves"]) == ("tpu7x-standard-4t", "v7x-16", True, False)
    assert len(rows) == len(topology.all_slices())
    assert {"accelerator": "v5p", "topology": "2x2x2", "hosts": 2} .items() <= next(r for r in rows if r["topology"] == "2x2x2" and r["accelerator"] == "v5p").items()
    code, _, err = run(capsys, "topologies", "--accelerator", "v99")
    assert code == 2 and "must be one of" in err


def test_crd_command_prints_the_crd(capsys):
    code, out, _ = run(capsys, "crd")
    docs = list(yaml.safe_load_all(out))
    assert code == 0 and [d["spec"]["names"]["kind"] for d in docs] == ["TPUTorchJob", "TPUTorchService"]
    code, out, _ = run(capsys, "crd", "--kind", "TPUTorchService")
    assert code == 0 and yaml.safe_load(out)["metadata"]["name"] == "tputorchservices.tputorch.io"


def test_python_dash_m_works_the_same():
    proc = subprocess.run([sys.executable, "-m", "tputorch", "validate", str(EXAMPLES / "v6e-2x2-single-host.yaml")],
                          capture_output=True, text=True, cwd=ROOT / "operator", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "1 host(s) x 4 chips, 4 worker(s)" in proc.stdout


def test_every_example_is_valid(capsys):
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        if "apiVersion: tputorch.io/" not in path.read_text():
            continue  # examples/kueue's queues and flavors: the API server checks them (tests/cluster/test_kueue.py)
        code, _, err = run(capsys, "validate", str(path))
        assert code == 0, f"{path}: {err}"


def test_render_and_validate_take_both_kinds_in_one_file(tmp_path, capsys):
    both = tmp_path / "both.yaml"
    both.write_text((EXAMPLES / "v6e-4x4.yaml").read_text() + "---\n" + (EXAMPLES / "serve" / "qwen3-moe-v6e-4x4.yaml").read_text())
    code, out, err = run(capsys, "render", str(both))
    assert code == 0, err
    rayjob, rayservice = yaml.safe_load_all(out)
    assert (rayjob["kind"], rayservice["kind"]) == ("RayJob", "RayService")
    assert "build_openai_app" in rayservice["spec"]["serveConfigV2"]
    code, out, err = run(capsys, "validate", str(both))
    assert code == 0, err
    assert out.splitlines()[1] == ("qwen3-moe: valid TPUTorchService; model qwen3-30b-a3b, 1-1 replica(s) of a v6e 4x4, "
                                   "4 host(s) x 4 chips, tensor parallel 16 x pipeline parallel 1")


def test_validate_lists_every_service_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "tputorch.io/v1alpha1", "kind": "TPUTorchService", "metadata": {"name": "s"},
                                   "spec": {"tpu": {"accelerator": "v6e", "topology": "4x4"}, "image": "i", "model": {"source": "m"},
                                            "engine": {"tensorParallelSize": 8}, "replicas": {"min": 2, "max": 1}}}))
    code, _, err = run(capsys, "validate", str(bad))
    assert code == 1
    assert "spec.engine.tensorParallelSize: 8 x spec.engine.pipelineParallelSize 1 = 8 chips" in err
    assert "spec.replicas.max: 1 must be at least spec.replicas.min (2)" in err


def test_validate_shows_rl_groups_and_names_every_group_error(capsys, tmp_path):
    code, out, _ = run(capsys, "validate", str(EXAMPLES / "rl" / "tpu-gpu.yaml"))
    assert code == 0
    assert out.strip() == ("grpo-tpu-gpu: valid; v6e 2x2, 1 host(s) x 4 chips, 4 worker(s) x 1 chip(s); "
                           "group rollout (2 pod(s) x 1 nvidia-l4); group reward (1 CPU pod(s))")
    body = yaml.safe_load((EXAMPLES / "rl" / "tpu-tpu.yaml").read_text())
    body["spec"]["groups"] += [{"name": "reward", "gpu": {"type": "nvidia-l4", "count": 3}}]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(body))
    code, _, err = run(capsys, "validate", str(bad))
    assert code == 1
    assert "spec.groups[2].name: 'reward' must be unique within spec.groups" in err
    assert "spec.groups[2].gpu.count: 3 must be one of 1, 2, 4, 8" in err


def test_validate_and_render_bound_the_pods_per_job(capsys, tmp_path, monkeypatch):
    example = str(EXAMPLES / "v6e-4x4.yaml")  # head, submitter and 4 hosts: 6 pods
    assert run(capsys, "validate", "--max-pods-per-job", "6", example)[0] == 0
    for command in ("validate", "render"):
        code, out, err = run(capsys, command, "--max-pods-per-job", "5", example)
        assert code == 1 and out == ""
        assert "spec.tpu.topology: '6 pods' must make at most 5 pods per job" in err
    monkeypatch.setenv("TPUTORCH_MAX_PODS_PER_JOB", "5")  # the operator's setting, read by the CLI too
    assert run(capsys, "validate", example)[0] == 1


def test_network_policy_flags_take_namespaces_labels_and_cidrs_and_refuse_the_rest():
    build_parser = cli.build_parser
    args = build_parser().parse_args(["run", "--network-policy-mode", "strict",
                                      "--network-policy-peer", "ray-system:app.kubernetes.io/name=kuberay-operator",
                                      "--network-policy-peer", "10.128.0.0/20", "--network-policy-peer", "*:app=kuberay",
                                      "--network-policy-metrics-peer", "gmp-system"])
    assert args.network_policy_mode == "strict"
    assert [p.selector() for p in args.network_policy_peer] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ray-system"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}},
        {"ipBlock": {"cidr": "10.128.0.0/20"}},
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "kuberay"}}}]
    for bad in ("10.128.0.1/20", "Ray_System", "ray-system:app", "ray-system:app=a b", "10.0.0/8"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--network-policy-peer", bad])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--network-policy-mode", "closed"])
