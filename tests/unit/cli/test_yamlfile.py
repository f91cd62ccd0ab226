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


# --- the file itself: its size, its encoding, something in it -------------------------------

@pytest.mark.parametrize("content,fragment", [
    (b"\xff\xfe" + JOB.encode("utf-16-le"), "not UTF-8 text (byte 0 is b'\\xff'); save it as UTF-8"),
    (JOB.encode().replace(b"demo", b"d\xe9mo"), f"not UTF-8 text (byte {JOB.index('demo') + 1} is b'\\xe9')"),
    (b"", "holds no YAML document (the file is empty or only comments)"),
    (b"# nothing here\n---\n", "holds no YAML document"),
    (JOB.encode() + b"# " + b"x" * (1024 * 1024) + b"\n", "larger than 1024 KiB (1 MiB)"),
])
@pytest.mark.parametrize("command", ["validate", "render"])
def test_unreadable_files_are_a_clear_error_and_exit_1(command, content, fragment, tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_bytes(content)
    assert cli.main([command, str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{path}: ") and fragment in err and "Traceback" not in err


def test_a_file_at_the_size_cap_is_read(tmp_path, capsys):
    from tputorch.cli.yamlfile import MAX_FILE_BYTES
    body = JOB + "# "
    path = tmp_path / "spec.yaml"
    path.write_text(body + "x" * (MAX_FILE_BYTES - len(body) - 1) + "\n")
    assert path.stat().st_size == MAX_FILE_BYTES
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().err


def test_submit_f_refuses_a_non_utf8_file_naming_the_flag(tmp_path):
    from tputorch.cli.submit import InvalidFlags, job_from_file
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"\xff")
    with pytest.raises(InvalidFlags) as info:
        job_from_file(str(path), None, None)
    assert "-f" in str(info.value) and "not UTF-8 text" in str(info.value)


def test_stdin_is_read_under_the_same_rules(monkeypatch, capsys):
    import io
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\xc3\x28")))
    assert cli.main(["validate", "-"]) == 1
    assert "-: not UTF-8 text (byte 0" in capsys.readouterr().err
