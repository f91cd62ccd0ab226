"""MkDocs hooks of the docs site (mkdocs.yml): the site holds README.md as its home page beside
docs/, and every file or folder of the repository that a page links to, so that each link of the
pages as they read on GitHub also resolves in the site, and `mkdocs build --strict` fails on any that
does not (tests/integration/test_docs_site.py).

A link is resolved as GitHub resolves it, against the linking file's folder in the repository; a
target in docs/ is that page, README.md the home page, anything else its copy under _repo/ (a
folder: a page naming what it holds; a Markdown file: a page of its own, its links followed in
turn). A link to nothing in the checkout is a warning, so a strict build fails on it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files, InclusionLevel

log = logging.getLogger("mkdocs.hooks.tputorch")

COPIES = "_repo"  # where the repository's files that pages link to go in the site
_LINK = re.compile(r"(\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
_CODE_SPAN = re.compile(r"(``.+?``|`[^`]*`)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _docs(config) -> str:
    return Path(config.docs_dir).resolve().relative_to(_root(config)).as_posix()


def _site_path(repo_path: str, root: Path, docs: str) -> str:
    """Where a file or folder of the repository is in the site (a src_uri)."""
    if repo_path == "README.md":
        return "index.md"
    if repo_path.startswith(docs + "/"):
        return repo_path[len(docs) + 1:]
    return f"{COPIES}/{repo_path}/index.md" if (root / repo_path).is_dir() else f"{COPIES}/{repo_path}"


def _links(markdown: str) -> list[tuple[int, re.Match]]:
    """Each inline link outside code: (line number, match in that line)."""
    found, fenced = [], False
    for number, line in enumerate(markdown.splitlines()):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        offset = 0
        for i, part in enumerate(_CODE_SPAN.split(line)):
            if i % 2 == 0:
                found += [(number, m, offset) for m in _LINK.finditer(part)]
            offset += len(part)
    return [(n, m, o) for n, m, o in found]


def _target(link: str, page_repo_path: str) -> tuple[str, str] | None:
    """(repository path, anchor) of a relative link; None for a URL or an anchor of the page itself."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", link) or link.startswith(("#", "/")):
        return None
    path, _, anchor = link.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), path))
    return resolved, anchor


def _listing(root: Path, folder: str) -> str:
    names = sorted(n + ("/" if (root / folder / n).is_dir() else "") for n in os.listdir(root / folder)
                   if not n.startswith(".") and n != "__pycache__")
    return f"# `{folder}/`\n\nA folder of the repository; it holds:\n\n" + "".join(f"- `{n}`\n" for n in names)


def on_files(files: Files, config) -> Files:
    """Adds the home page (README.md) and every repository file or folder a page links to."""
    root, docs = _root(config), _docs(config)
    todo = ["README.md", *sorted(p.relative_to(root).as_posix() for p in (root / docs).rglob("*.md"))]
    seen = set(todo)
    files.append(File.generated(config, "index.md", abs_src_path=str(root / "README.md")))
    while todo:
        page = todo.pop()
        for _, match, _ in _links((root / page).read_text()):
            target = _target(match.group(2), page)
            if target is None or target[0] in seen or target[0].startswith(("..", docs + "/")):
                continue
            path = target[0]
            if not (root / path).exists() or path == "README.md":
                continue  # on_page_markdown says so
            seen.add(path)
            # reached through the links, not the navigation
            if (root / path).is_dir():
                files.append(File.generated(config, _site_path(path, root, docs), content=_listing(root, path),
                                            inclusion=InclusionLevel.NOT_IN_NAV))
                continue
            files.append(File.generated(config, _site_path(path, root, docs), abs_src_path=str(root / path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
            if path.endswith(".md"):
                todo.append(path)
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Each relative link of the page, resolved in the repository, pointed at that file in the site."""
    root, docs = _root(config), _docs(config)
    if page.file.abs_src_path is None:
        return markdown  # a folder's listing: no links
    repo_path = Path(page.file.abs_src_path).resolve().relative_to(root).as_posix()
    here = posixpath.dirname(page.file.src_uri)
    lines = markdown.splitlines(keepends=True)
    for number, match, offset in reversed(_links(markdown)):
        target = _target(match.group(2), repo_path)
        if target is None:
            continue
        path, anchor = target
        if path.startswith("..") or not (root / path).exists():
            log.warning(f"{repo_path}: the link {match.group(2)!r} points at nothing in the repository ({path})")
            continue
        new = posixpath.relpath(_site_path(path, root, docs), here or ".") + (f"#{anchor}" if anchor else "")
        line = lines[number]
        start, end = offset + match.start(2), offset + match.end(2)
        lines[number] = line[:start] + new + line[end:]
    return "".join(_code_pipes(line) for line in lines)


def _code_pipes(line: str) -> str:
    """A table row's `\\|` in code spans as `|`: GitHub's tables need the escape there, Python-Markdown's
    do not split cells inside code spans and would show the backslash."""
    if not line.lstrip().startswith("|"):
        return line
    return "".join(part.replace("\\|", "|") if i % 2 else part for i, part in enumerate(_CODE_SPAN.split(line)))
