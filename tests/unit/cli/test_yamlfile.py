"""The CLI's YAML reading: hostile files are refused with where and why, never a crash or a hang."""

import signal

import pytest

from tputorch.cli import main as cli
from tputorch.cli.yamlfile import MAX_DEPTH, YAMLFileError, load_documents

JOB = """apiVersion: tputorch.io/v1alpha1
kind: TPUTorchJob
metadata: {name: demo}
spec:
  tpu: {accelerator: v6e, topology: 4x4}
  image: img
  entrypoint: python train.py
"""
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.fixture
def alarm():
    """Fail instead of hanging: the alias bomb hung the CLI before."""
    def boom(*_):
        raise TimeoutError("took longer than 10 s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("text,fragment", [
    ("a: !!set {x, y}", "tag tag:yaml.org,2002:set is not allowed"),
    ("a: !!binary aGVsbG8=", "tag tag:yaml.org,2002:binary is not allowed"),
    ("a: !!python/object:os.system {}", "is not allowed"),
    ("a: {1: x, b: y}", "document.a: key 1 must be a string"),
    ("a: [.inf]", "document.a[0]: inf is not a number"),
    ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ("a: " + "[" * 150 + "]" * 150, f"nested deeper than {MAX_DEPTH} levels"),
])
def test_refused_with_where_and_why(text, fragment):
    with pytest.raises(YAMLFileError) as err:
        load_documents(text, "job.yaml")
    assert fragment in str(err.value)


def test_an_alias_bomb_is_refused_at_once(alarm):
    with pytest.raises(YAMLFileError) as err:
        load_documents(BOMB)
    assert "more than" in str(err.value)


def test_a_timestamp_stays_the_string_it_is_written_as():
    (doc,) = load_documents("when: 2026-12-01\nat: 2026-12-01T10:00:00Z\n")
    assert doc == {"when": "2026-12-01", "at": "2026-12-01T10:00:00Z"}


def test_ordinary_documents_load_as_they_are():
    assert load_documents("---\n" + JOB + "---\n\n---\n" + JOB)[1]["spec"]["tpu"] == {"accelerator": "v6e", "topology": "4x4"}


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("extra", [
    "  runtimeEnv: {env_vars: !!set {a, b}}\n",
    "  runtimeEnv: {created: 2026-12-01, 5: five}\n",
    "  runtimeEnv: {pip: " + "[" * 3000 + "]" * 3000 + "}\n",
    "  runtimeEnv:\n" + "\n".join("    " + line for line in BOMB.splitlines()) + "\n",
])
def test_the_cli_exits_1_with_a_message_for_each(tmp_path, capsys, alarm, command, extra):
    path = tmp_path / "job.yaml"
    path.write_text(JOB + extra)
    code = cli.main([command, str(path)])
    out, err = capsys.readouterr()
    assert code == 1 and out == "" and err.strip(), err
    assert "Traceback" not in err


def test_validate_refuses_a_job_whose_rayjob_would_not_fit(tmp_path, capsys):
    env = "".join(f"\n  - {{name: V{i}, value: {'x' * 20_000}}}" for i in range(30))
    path = tmp_path / "big.yaml"
    path.write_text(JOB + "  env:" + env + "\n")
    for command in ("validate", "render"):
        code = cli.main([command, str(path)])
        out, err = capsys.readouterr()
        assert code == 1 and out == "" and "spec: renders a RayJob of" in err, err[-500:]
