"""The stand-in build of an example Dockerfile (hack/image.sh example): the same Dockerfile with
only what cannot happen here changed, and the cache key of that build.

  python3 hack/standin_dockerfile.py DOCKERFILE CONTEXT RAY_BASE OUT   -> prints the JSON summary

- `FROM rayproject/ray:<tag>` becomes RAY_BASE, the local stand-in of Ray's image (no registry
  here; hack/ray-base.Containerfile says what of Ray's image it keeps).
- A `RUN` whose line just above is a comment starting with `# not run by make test:` becomes
  `RUN true`: those download packages that cannot be fetched here (the comment says which).
  Every other instruction is kept as written, so each COPY/ADD reads the real build context
  through its real .dockerignore and every other RUN runs.
- The key: a hash of the rewritten Dockerfile, the context's .dockerignore, every file under the
  COPY/ADD sources (as .dockerignore sees them: no Python caches), this script and RAY_BASE.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from pathlib import Path

MARKER = "# not run by make test:"
RAY = re.compile(r"^FROM\s+(rayproject/ray:\S+)(\s+AS\s+\S+)?\s*$", re.I)
CACHES = ("__pycache__", ".pyc", ".egg-info")


def instructions(text: str) -> list[tuple[list[str], str]]:
    """(the comment lines just above, the instruction with its continuation lines) in order."""
    out, comments, current = [], [], None
    for line in text.splitlines():
        if current is not None:
            current += "\n" + line
            if not line.rstrip().endswith("\\"):
                out.append((comments, current))
                comments, current = [], None
        elif line.lstrip().startswith("#"):
            comments.append(line.strip())
        elif not line.strip():
            comments = []
        else:
            if line.rstrip().endswith("\\"):
                current = line
            else:
                out.append((comments, line))
                comments = []
    if current is not None:
        raise SystemExit(f"the last instruction does not end: {current!r}")
    return out


def rewrite(text: str, ray_base: str) -> tuple[str, list[str], list[str]]:
    """The stand-in Dockerfile, the real bases it replaced, the RUN steps it skipped."""
    lines, bases, skipped = [], [], []
    for comments, ins in instructions(text):
        word = ins.split(None, 1)[0].upper()
        if word == "FROM" and (m := RAY.match(ins)):
            bases.append(m.group(1))
            ins = f"FROM {ray_base}{m.group(2) or ''}"
        elif word == "FROM":
            raise SystemExit(f"no stand-in for the base of {ins!r}")
        elif comments and comments[-1].startswith(MARKER):
            if word != "RUN":
                raise SystemExit(f"{MARKER!r} is for RUN steps only, not {ins!r}")
            skipped.append(ins)
            ins = "RUN true"
        lines.append(ins)
    if not bases:
        raise SystemExit("no FROM rayproject/ray:<tag> in the Dockerfile")
    return "\n".join(lines) + "\n", bases, skipped


def copy_sources(text: str) -> list[str]:
    """The context paths the COPY/ADD instructions read (not those of other stages)."""
    out = []
    for _, ins in instructions(text):
        words = shlex.split(ins.replace("\\\n", " "))
        if words[0].upper() in ("COPY", "ADD") and not any(w.startswith("--from") for w in words):
            out += [w for w in words[1:-1] if not w.startswith("--")]
    return out


def files_under(context: Path, source: str) -> list[Path]:
    path = context / source
    found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [p for p in found if not any(c in part for part in p.relative_to(context).parts for c in CACHES)]


def key(dockerfile: str, context: Path, ray_base: str, original: str) -> str:
    h = hashlib.sha256()
    h.update(dockerfile.encode())
    h.update(f"base {ray_base}\n".encode())
    h.update(Path(__file__).read_bytes())
    ignore = context / ".dockerignore"
    h.update(ignore.read_bytes() if ignore.exists() else b"no .dockerignore")
    for source in copy_sources(original):
        for path in files_under(context, source):
            h.update(f"{path.relative_to(context)}\n".encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def main(argv: list[str]) -> None:
    dockerfile, context, ray_base, out = argv
    original = Path(dockerfile).read_text()
    text, bases, skipped = rewrite(original, ray_base)
    Path(out).write_text(text)
    print(json.dumps({"key": key(text, Path(context), ray_base, original), "bases": bases,
                      "skipped": skipped}))


if __name__ == "__main__":
    main(sys.argv[1:])
