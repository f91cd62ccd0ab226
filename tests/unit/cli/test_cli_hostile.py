"""Specs the API server (or the container runtime) would refuse only later, at pod creation, fed to
`tputorch validate` and `tputorch render` as files: both refuse each alike (exit 1, nothing on
stdout), name the field, and never show a traceback."""

from __future__ import annotations

import pytest
import yaml

from tputorch.cli import main as cli

from ..jobs import body
from ..services import service_body

V5P_BIG = {"accelerator": "v5p", "topology": "16x16x24"}
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def emptydir(path: str) -> dict:
    return {"volumes": [{"name": "scratch", "mountPath": path, "emptyDir": {}}]}


# (case, the spec's overrides, the field every refusal must name, a piece of what is allowed)
JOB_CASES = [
    ("group-cpu-zero", {"groups": [{"name": "reward", "cpu": "0"}]}, "spec.groups[0].cpu", "greater than zero"),
    ("group-cpu-int-zero", {"groups": [{"name": "reward", "cpu": 0}]}, "spec.groups[0].cpu", "greater than zero"),
    ("group-memory-zero", {"groups": [{"name": "reward", "memory": "0"}]}, "spec.groups[0].memory", "greater than zero"),
    ("group-memory-bytes", {"groups": [{"name": "reward", "memory": "1.5"}]}, "spec.groups[0].memory", "at least 256Mi"),
    ("group-memory-number", {"groups": [{"name": "reward", "memory": 64}]}, "spec.groups[0].memory", "at least 256Mi"),
    ("worker-memory-bytes", {"worker": {"memory": "1.5"}}, "spec.worker.memory", "at least 256Mi"),
    ("122880-pods", {"groups": [{"name": f"g{i}", "tpu": V5P_BIG, "replicas": 16} for i in range(5)]},
     "spec.groups", "at most 4096 pods per job"),
    ("cap-sys-admin-no-escalation", {"securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]},
                                                         "allowPrivilegeEscalation": False}},
     "spec.securityContext.allowPrivilegeEscalation", "must not be false with privileged or CAP_SYS_ADMIN"),
    ("sys-admin-no-escalation", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}, "allowPrivilegeEscalation": False}},
     "spec.securityContext.allowPrivilegeEscalation", "CAP_SYS_ADMIN"),
    ("privileged-no-escalation", {"securityContext": {"privileged": True, "allowPrivilegeEscalation": False}},
     "spec.securityContext.allowPrivilegeEscalation", "privileged"),
    ("mount-proc", emptydir("/proc"), "spec.volumes[0].mountPath", "must not be /proc"),
    ("mount-under-proc", emptydir("/proc/sys/kernel"), "spec.volumes[0].mountPath", "must not be /proc"),
    ("mount-proc-double-slash", emptydir("//proc"), "spec.volumes[0].mountPath", "must not be /proc"),
    ("mount-proc-dot", emptydir("/./proc/"), "spec.volumes[0].mountPath", "must not be /proc"),
    ("mount-token-dir", emptydir(TOKEN_DIR), "spec.volumes[0].mountPath", "ServiceAccount token"),
    ("mount-token-file", emptydir(TOKEN_DIR + "/token"), "spec.volumes[0].mountPath", "ServiceAccount token"),
    ("mount-token-dir-run", emptydir("/run/secrets/kubernetes.io/serviceaccount"), "spec.volumes[0].mountPath", "ServiceAccount token"),
    ("image-newline", {"image": "example.com/img:1\n"}, "spec.image", "no whitespace"),
    ("image-inner-newline", {"image": "example.com/img:1\nexample.com/other:2"}, "spec.image", "no whitespace"),
    ("image-leading-space", {"image": " example.com/img:1"}, "spec.image", "no whitespace"),
    ("image-tab", {"image": "example.com/img\t:1"}, "spec.image", "no whitespace"),
    ("group-image-newline", {"groups": [{"name": "gen", "image": "cuda:12\n"}]}, "spec.groups[0].image", "no whitespace"),
    ("selector-value-newline", {"nodeSelector": {"pool": "a\n"}}, "spec.nodeSelector.pool", "label value"),
    ("ray-version-newline", {"rayVersion": "2.60.0\n"}, "spec.rayVersion", "Ray release"),
    ("queue-newline", {"queueName": "team-a\n"}, "spec.queueName", "label value"),
]
SERVICE_CASES = [
    ("service-image-newline", {"image": "example.com/vllm:1\n"}, "spec.image", "no whitespace"),
    ("service-mount-proc", emptydir("/proc"), "spec.volumes[0].mountPath", "must not be /proc"),
    ("service-cap-sys-admin", {"securityContext": {"capabilities": {"add": ["CAP_SYS_ADMIN"]}, "allowPrivilegeEscalation": False}},
     "spec.securityContext.allowPrivilegeEscalation", "CAP_SYS_ADMIN"),
    ("service-too-many-pods", {"tpu": V5P_BIG, "replicas": {"min": 1, "max": 3}}, "spec.replicas.max", "at most 4096 pods"),
]
CASES = [(name, body(**o), f, a) for name, o, f, a in JOB_CASES] + \
        [(name, service_body(**o), f, a) for name, o, f, a in SERVICE_CASES]


@pytest.mark.parametrize("doc,field,allowed", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_validate_and_render_refuse_alike_naming_the_field(doc, field, allowed, tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    answers = {}
    for command in ("validate", "render"):
        code = cli.main([command, str(path)])  # an exception here is the traceback a user would see
        out, err = capsys.readouterr()
        assert code in (1, 2) and out == "", (command, code, out)
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if f": {field}: " in line]
        assert lines and allowed in lines[0], (command, err)
        answers[command] = err
    assert answers["validate"] == answers["render"]


def test_cap_sys_admin_without_the_escalation_key_renders_without_the_default_false(tmp_path, capsys):
    # the Pod API refuses CAP_SYS_ADMIN with allowPrivilegeEscalation false: the default gives way
    doc = body(securityContext={"capabilities": {"add": ["CAP_SYS_ADMIN"]}})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["render", str(path)]) == 0
    rayjob = yaml.safe_load(capsys.readouterr().out)
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["securityContext"]["capabilities"]["add"] == ["CAP_SYS_ADMIN"]
    assert "allowPrivilegeEscalation" not in head["securityContext"]


@pytest.mark.parametrize("path", ["/data", "/proc-data", "/var/run/secrets/other", "/run/secrets/kubernetes.io"])
def test_mount_paths_beside_the_reserved_ones_pass(path, tmp_path, capsys):
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(body(**emptydir(path))))
    assert cli.main(["validate", str(f)]) == 0, capsys.readouterr().err
