"""Every shell command in README.md and docs/ (the generated docs/reference/ aside), found and sorted into what a test runs and how.

A fenced block tagged `sh` (or bash/shell/console) holds commands a reader copies. Each command is
one of:

- shell: assignments, `export`, `echo`, `read` ... run as they are, in every script below;
- offline: `tputorch validate|render|topologies|crd`, `submit|serve --dry-run`, `helm template|lint`:
  run here with no cluster (tests/unit/test_docs.py);
- cluster: `kubectl`, `helm install|upgrade`, `tputorch submit|serve|get|describe|wait|delete`:
  run against the local cluster (tests/cluster/test_docs_commands.py), changed only where running
  them as written would reach past the test's namespace: such a `kubectl` change becomes a
  server-side dry run, `helm install|upgrade` becomes `helm template | kubectl apply --dry-run=server`;
- tested: `# tested by tests/x.py` at the end of its line: that test runs the command itself, taking
  it from the docs with `doccmds.tested_by("tests/x.py")` (a `pip install` into a fresh venv);
- marked: the reader's command cannot run here (gcloud, docker, a real GKE cluster). The docs say
  so on the command itself, `# not run here: <why>` at the end of its line, or for a whole block
  as the block's first line. Nothing else is allowed: a command no rule runs and no marker names
  fails the test, and so does a marker on a command that does run here.

The docs' commands run in the order they appear, as one script per document, so variables set
by one block are there for the next, as in the reader's shell. Values that only the not-run steps
produce (an image digest) come from GKE_OUTPUTS.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.relative_to(ROOT / "docs").parts)]
SHELL_LANGS = {"sh", "bash", "shell", "console"}
MARKER = re.compile(r"#\s*not run here:\s*(.*\S)?\s*$")
TESTED = re.compile(r"#\s*tested by\s+(\S+)")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")

# What the marked steps would have produced on GKE; the scripts start with these.
GKE_OUTPUTS = {
    "IMAGE": "us-east5-docker.pkg.dev/my-project/tputorch/tputorch-operator",
    "DIGEST": "sha256:" + "0" * 64,
    "TRAIN_DIGEST": "sha256:" + "1" * 64,
    "SERVE_DIGEST": "sha256:" + "2" * 64,
}

SHELL_PROGRAMS = {"export", "echo", "printf", "read", "unset", "true", "test", "[", "sleep", "set",
                  # text filters in a pipe
                  "grep", "head", "tail", "cut", "sort", "wc", "base64", "jq", "cat"}
KUBECTL_READ = {"get", "describe", "explain", "api-resources", "api-versions", "wait", "version", "events", "config"}
KUBECTL_WRITE = {"apply", "create", "delete", "patch", "label", "annotate", "replace"}
TPUTORCH_OFFLINE = {"validate", "render", "topologies", "crd"}
TPUTORCH_CLUSTER = {"submit", "serve", "get", "describe", "wait", "delete"}
# Kinds a test may create for real in its own namespace (nothing cluster-wide, nothing that
# changes how the cluster admits others' objects).
NAMESPACED_KINDS = {"TPUTorchJob", "TPUTorchService", "Secret", "ConfigMap", "ServiceAccount", "ResourceQuota",
                    "Service"}
# Kinds the local cluster serves only with an add-on it does not run by default (Managed Prometheus
# and GKE's Gateway policies never; Kueue with KUEUE=1): applying them must be marked.
GKE_ONLY_KINDS = {"PodMonitoring", "ClusterPodMonitoring", "Rules", "ClusterRules", "Gateway", "HTTPRoute",
                  "HealthCheckPolicy", "GCPBackendPolicy", "GCPGatewayPolicy",
                  "ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
REAL_CREATE = {"secret", "configmap", "serviceaccount", "namespace", "ns"}
REAL_DELETE = {"ttj", "ttsvc", "tputorchjob", "tputorchjobs", "tputorchservice", "tputorchservices",
               "secret", "namespace", "ns"} | {f"{k}.tputorch.io" for k in ("tputorchjob", "tputorchjobs",
                                                                        "tputorchservice", "tputorchservices")}


@dataclass
class Command:
    doc: str
    line: int
    text: str                      # the command as the reader copies it (continuations joined)
    marker: str | None = None      # the `not run here` reason, if any
    tested_by: str | None = None   # a test file that runs this command itself (doccmds.tested_by)
    kind: str = ""                 # shell | offline | cluster | unhandled
    run: str = ""                  # what the test runs
    why: str = ""                  # for unhandled: what no rule covers
    namespaces: list = field(default_factory=list)  # namespaces the command creates for real

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    lines: list


def blocks(path: Path) -> list[Block]:
    """Fenced code blocks of a Markdown file, with their language tag and first line number."""
    out, current, fence = [], None, None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if current is None and m:
            fence = m.group(2)
            current = Block(path.relative_to(ROOT).as_posix(), n, m.group(3).lower(), [])
        elif current is not None and line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
            out.append(current)
            current = None
        elif current is not None:
            current.lines.append((n + 0, line))
    return out


def _strip_comment(line: str) -> tuple[str, str]:
    """Split a shell line into its code and its trailing comment (a `#` outside quotes that starts
    a word)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def _balanced(text: str) -> bool:
    try:
        shlex.split(HEREDOC.sub("", text))
        return True
    except ValueError:
        return False


def commands(block: Block) -> list[Command]:
    """The commands of a shell block: continuation lines joined, heredoc bodies kept with their
    command, comments dropped; markers read from the block's first line or the command's own."""
    body = block.lines
    block_marker = None
    first = next((text for _, text in body if text.strip()), "")
    if first.strip().startswith("#") and MARKER.search(first.strip()):
        block_marker = MARKER.search(first.strip()).group(1) or ""
    out: list[Command] = []
    i = 0
    while i < len(body):
        n, raw = body[i]
        code, comment = _strip_comment(raw)
        if not code.strip():
            i += 1
            continue
        start, parts, marker, tested = n, [], None, None
        while True:
            m = MARKER.search(comment) if comment else None
            if m:
                marker = m.group(1) or ""
            t = TESTED.search(comment) if comment else None
            if t:
                tested = t.group(1)
            if code.endswith("\\"):
                parts.append(code[:-1].strip())
                i += 1
                if i >= len(body):
                    break
                code, comment = _strip_comment(body[i][1])
                continue
            parts.append(code.strip())
            i += 1
            break
        text = " ".join(p for p in parts if p)
        if not _balanced(text):  # a quoted argument over several lines: its comment ends the last
            while not _balanced(text) and i < len(body):
                text += "\n" + body[i][1]
                i += 1
            text, comment = _strip_comment(text)
            m = MARKER.search(comment) if comment else None
            if m:
                marker = m.group(1) or ""
        doc_m = HEREDOC.search(text)
        if doc_m:  # the heredoc's lines belong to the command, verbatim
            end = doc_m.group(1)
            lines = []
            while i < len(body) and body[i][1].strip() != end:
                lines.append(body[i][1])
                i += 1
            i += 1
            text = text + "\n" + "\n".join(lines) + "\n" + end
        out.append(Command(block.doc, start, text, marker if marker is not None else block_marker, tested))
    return out


def all_commands(docs=None) -> list[Command]:
    out = []
    for path in docs or DOCS:
        for b in blocks(path):
            if b.lang in SHELL_LANGS:
                out.extend(classify(c) for c in commands(b))
    return out


# ---------------------------------------------------------------- rules


def _split(text: str) -> list[tuple[str, str]]:
    """Top-level segments of a command line and the operator after each (`|`, `&&`, `||`, `;`),
    outside quotes and $( )."""
    segs, buf, quote, depth, i = [], "", None, 0, 0
    head, _, heredoc = text.partition("\n")
    while i < len(head):
        ch = head[i]
        if quote:
            buf += ch
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            buf += ch
        elif head.startswith("$(", i):
            depth += 1
            buf += "$("
            i += 1
        elif ch == ")" and depth:
            depth -= 1
            buf += ch
        elif depth == 0 and head.startswith(("&&", "||"), i):
            segs.append((buf.strip(), head[i:i + 2]))
            buf = ""
            i += 1
        elif depth == 0 and ch in "|;":
            segs.append((buf.strip(), ch))
            buf = ""
        else:
            buf += ch
        i += 1
    segs.append((buf.strip(), ""))
    if heredoc:  # the heredoc feeds the segment that names it
        segs = [(s + ("\n" + heredoc if HEREDOC.search(s) else ""), op) for s, op in segs]
    return segs


def _substitutions(seg: str) -> list[str]:
    """The commands inside $( ) of a segment (one level)."""
    out, i = [], 0
    while (j := seg.find("$(", i)) >= 0:
        depth, k = 1, j + 2
        while k < len(seg) and depth:
            depth += {"(": 1, ")": -1}.get(seg[k], 0)
            k += 1
        out.append(seg[j + 2:k - 1])
        i = k
    return out


def _words(seg: str) -> list[str]:
    head = seg.split("\n", 1)[0] if HEREDOC.search(seg) else seg
    for sub in _substitutions(head):
        head = head.replace(f"$({sub})", "SUBST")
    head = re.sub(r"<<-?\s*'?\"?\w+'?\"?", "", head)
    try:
        return shlex.split(head)
    except ValueError:
        return head.split()


def _strip_assignments(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[i]):
        i += 1
    return words[i:]


# Programs that copy files to a pipe, changing text but not which objects they hold (sed's edits
# of a manifest's values): what `kubectl apply -f -` reads from them has those files' kinds.
PIPE_SOURCES = {"sed", "cat"}


def _piped_files(seg: str) -> list[str]:
    """The files a PIPE_SOURCES segment reads (its arguments that name files of the repository)."""
    words = _strip_assignments(_words(seg))
    if not words or words[0] not in PIPE_SOURCES:
        return []
    return [w for w in words[1:] if not w.startswith("-") and "/" in w and (ROOT / w).is_file()]


def _kinds_in(paths: list[str], heredoc: str, piped: list[str] = ()) -> set | None:
    """Kinds of the objects in the files (or heredoc, or the files piped in) a kubectl command
    applies; None when a file cannot be read here."""
    kinds = set()
    texts = []
    for p in paths:
        if p == "-":
            if piped:
                texts.extend((ROOT / f).read_text() for f in piped)
                continue
            if not heredoc:  # from a pipe: unknown here
                return None
            texts.append(heredoc)
            continue
        path = ROOT / p
        if not path.exists():
            return None
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        texts.extend(f.read_text() for f in files)
    for t in texts:
        try:
            kinds |= {d.get("kind") for d in yaml.safe_load_all(t) if isinstance(d, dict)}
        except yaml.YAMLError:
            return None
    return kinds


def _flag_values(words: list[str], *names: str) -> list[str]:
    out = []
    for i, w in enumerate(words):
        for n in names:
            if w == n and i + 1 < len(words):
                out.append(words[i + 1])
            elif w.startswith(n + "="):
                out.append(w.split("=", 1)[1])
    return out


def _without_globals(args: list[str]) -> list[str]:
    """kubectl's arguments without the global flags that take a value (-n NS, --context C ...)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-n", "--namespace", "--context", "--kubeconfig", "--as"):
            skip = True
        else:
            out.append(a)
    return out


def _rule(seg: str, piped: list[str] = ()) -> tuple[str, str, str, list]:
    """(kind, what to run, why unhandled, namespaces created for real) for one segment; ``piped``:
    the repository files the segment's stdin copies (_piped_files of the segment before a `|`)."""
    words = _strip_assignments(_words(seg))
    heredoc = seg.split("\n", 1)[1].rsplit("\n", 1)[0] if "\n" in seg else ""  # without its end marker
    if not words:  # assignments only
        return "shell", seg, "", []
    prog, args = words[0], words[1:]
    if prog in SHELL_PROGRAMS:
        return "shell", seg, "", []
    if prog == "sed":  # a text filter, unless it edits a file of the checkout in place
        if any(a.startswith("-i") or a.startswith("--in-place") for a in args):
            return "unhandled", "", "sed -i (edits a file in place)", []
        return "shell", seg, "", []
    if prog == "kubectl" and args[:1] == ["tputorch"]:
        prog, args = "tputorch", args[1:]
    if prog in ("python", "python3") and args[:2] == ["-m", "tputorch"]:
        prog, args = "tputorch", args[2:]
    if prog == "tputorch":
        sub = next((a for a in args if not a.startswith("-")), "")
        if sub in TPUTORCH_OFFLINE or (sub in ("submit", "serve") and "--dry-run" in args):
            return "offline", seg, "", []
        if sub in ("get", "describe"):
            return "cluster", "retry " + shlex.quote(seg), "", []
        if sub in TPUTORCH_CLUSTER:
            return "cluster", seg, "", []
        return "unhandled", "", f"tputorch {sub}", []
    if prog == "helm":
        sub = args[0] if args else ""
        if sub in ("template", "lint", "show"):
            return "offline", seg, "", []
        if sub in ("install", "upgrade") and any(a.startswith("charts/") for a in args):  # this repository's chart
            # helm template takes the same arguments but those that only an install or upgrade has
            run = re.sub(r"\s--(reuse-values|wait|install|atomic|create-namespace)\b", "", seg)
            run = re.sub(r"^(.*?)\bhelm\s+(install|upgrade)\b", r"\1helm template", run, count=1)
            run += " | kubectl apply --dry-run=server -f -"
            created = _flag_values(args, "--namespace", "-n") if "--create-namespace" in args else []
            return "cluster", run, "", created
        return "unhandled", "", f"helm {sub}", []
    if prog == "kubectl":
        args = _without_globals(args)
        verb = next((a for a in args if not a.startswith("-")), "")
        if verb in KUBECTL_READ:  # a reader waits for what the operator does next; so does the test
            run = re.sub(r"\s(-w|--watch)(?=\s|$)", "", seg)
            return "cluster", "retry " + shlex.quote(run), "", []
        if verb == "auth" and "can-i" in args:  # "no" (exit 1) is an answer too
            return "cluster", f"{{ {seg}; }} || test $? -eq 1", "", []
        if verb == "rollout" and "status" in args:
            return "unhandled", "", "kubectl rollout status (no operator pod runs on the local cluster)", []
        if verb in KUBECTL_WRITE:
            real = False
            rest = [a for a in args if not a.startswith("-")]
            files = _flag_values(args, "-f", "--filename")
            if any(f.startswith(("http://", "https://")) for f in files):
                return "unhandled", "", f"kubectl {verb} -f URL (fetches from the internet)", []
            if verb == "create" and len(rest) > 1 and rest[1] in REAL_CREATE and not files:
                real = True
            elif verb == "delete" and len(rest) > 1 and rest[1].split("/")[0] in REAL_DELETE and not files:
                real = rest[1] not in ("namespace", "ns")
            elif verb in ("apply", "create") and files:
                kinds = _kinds_in(files, heredoc, piped)
                if kinds and kinds & GKE_ONLY_KINDS:
                    return "unhandled", "", f"applies {sorted(kinds & GKE_ONLY_KINDS)}, which only GKE serves", []
                real = kinds is not None and kinds <= NAMESPACED_KINDS and "--server-side" not in args
            created = rest[2:] if verb == "create" and rest[1:2] and rest[1] in ("namespace", "ns") else []
            if real:
                return "cluster", seg, "", created
            head, _, tail = seg.partition("\n")
            if "--dry-run=server" not in args:
                head += " --dry-run=server"
            return "cluster", head + ("\n" + tail if tail else ""), "", []
        return "unhandled", "", f"kubectl {verb}", []
    return "unhandled", "", prog, []


def classify(cmd: Command) -> Command:
    if cmd.tested_by:
        cmd.kind = "tested"
        return cmd
    kinds, runs, why, created = [], [], [], []
    piped: list[str] = []
    for seg, op in _split(cmd.text):
        for inner in _substitutions(seg):
            for s, _ in _split(inner):
                k, _, w, _ = _rule(s)
                kinds.append(k)
                why += [w] if w else []
        k, run, w, c = _rule(seg, piped)
        piped = _piped_files(seg) if op == "|" else []
        kinds.append(k)
        runs.append(run + (f" {op} " if op else ""))
        why += [w] if w else []
        created += c
    if "unhandled" in kinds:
        cmd.kind, cmd.why = "unhandled", "; ".join(why)
    else:
        cmd.kind = "cluster" if "cluster" in kinds else "offline" if "offline" in kinds else "shell"
        cmd.run = "".join(runs).strip()
        cmd.namespaces = created
    return cmd


def tested_by(test_file: str) -> list[Command]:
    """The docs' commands that name this test file (relative to the repository) as the one that
    runs them."""
    return [c for c in all_commands() if c.tested_by == test_file]


def script(cmds: list[Command], kinds: set) -> str:
    """A bash script that runs the given kinds of a document's commands in order (marked and other
    kinds skipped), each announced on stderr with its place in the doc."""
    lines = ["set -euo pipefail",
             # up to 30 s for what the operator or the API server has still to do
             'retry() { for _ in $(seq 30); do if eval "$1"; then return 0; fi; sleep 1; done; return 1; }']
    lines += [f"export {k}={v}" for k, v in GKE_OUTPUTS.items()]
    for c in cmds:
        if c.marker is not None or c.kind not in kinds:
            continue
        lines.append(f"echo \"+++ [${{SECONDS}}s] \"{shlex.quote(c.where + ': ' + c.text.splitlines()[0])} >&2")
        lines.append(c.run)
    return "\n".join(lines) + "\n"


def find_helm() -> str | None:
    """helm as the chart tests find it: $HELM, hack/build.sh's cache dir, or PATH."""
    import os
    import shutil
    import subprocess

    if os.environ.get("HELM"):
        return os.environ["HELM"]
    try:
        bin_dir = subprocess.run([str(ROOT / "hack" / "build.sh"), "dir"], capture_output=True, text=True,
                                 timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        bin_dir = ""
    if bin_dir and os.access(os.path.join(bin_dir, "helm"), os.X_OK):
        return os.path.join(bin_dir, "helm")
    return shutil.which("helm")


def local_kube_version() -> str:
    """The Kubernetes version the local cluster runs (hack/build.sh's K8S_VERSION default). `helm
    template` and `helm lint` need it (--kube-version): without a cluster they check the chart's
    kubeVersion against Helm's built-in default, v1.20, which the chart refuses."""
    import re

    found = re.search(r"^K8S_VERSION=\$\{K8S_VERSION:-(v[0-9.]+)\}", (ROOT / "hack" / "build.sh").read_text(), re.M)
    assert found, "hack/build.sh no longer sets K8S_VERSION=${K8S_VERSION:-vX.Y.Z}"
    return found.group(1)


def helm_args(args) -> list[str]:
    """``args`` of a helm command with --kube-version (local_kube_version) added to a `template` or
    `lint` that names none (Helm 3.22's `template --dry-run=server` still checks kubeVersion against
    its default, not the cluster's)."""
    args = list(args)
    if args and args[0] in ("template", "lint") and "--kube-version" not in args:
        args += ["--kube-version", local_kube_version()]
    return args


def helm_shim(bin_dir, helm: str) -> None:
    """``bin_dir/helm``: ``helm`` with helm_args' --kube-version, for the docs' commands (a reader's
    helm from helm.sh carries a current default; a `go install`ed one, Helm's built-in v1.20)."""
    import os
    import shlex

    version = shlex.quote(local_kube_version())
    script = (f'#!/bin/sh\ncase "$1" in template|lint) for a in "$@"; do case "$a" in --kube-version*) '
              f'exec {shlex.quote(helm)} "$@";; esac; done; exec {shlex.quote(helm)} "$@" --kube-version {version};; esac\n'
              f'exec {shlex.quote(helm)} "$@"\n')
    path = os.path.join(str(bin_dir), "helm")
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, 0o755)

