"""The package's shape, checked on the source itself, so that an import inside a function counts too.

- The pure modules (PURE) import nothing from controller/ or cli/, nor kopf or the kubernetes client.
- The layers hold (LAYERS): a module imports only from its own layer or the ones below it, so api/
  imports nothing from render/, status/, controller/ or cli/; render/ nothing from status/,
  controller/ or cli/; status/ nothing from controller/ or cli/.
- No import cycle between modules, function-level imports included.
- No function-level import inside the pure modules: a lazy import hides a cycle or a cost. The one
  exception is an optional dependency the operator itself never needs (LAZY_OPTIONAL).
- No module over MAX_LINES lines, no function with more than MAX_BRANCH_POINTS branch points.

A function's branch points (McCabe-like) are one for each `if` and `elif`, `for`, `while`, `except`
handler, conditional expression (`a if c else b`), `case` of a `match`, and `if` of a comprehension,
and one for each operand of a boolean operator after its first (`a and b or c` has two). A function
or class defined inside a function is counted on its own, not in the function around it; a lambda
is part of the function it is written in.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "operator" / "tputorch"
PURE = ["api", "render", "status", "timestamps.py", "train.py", "watchdog.py", "tested_versions.py"]
FORBIDDEN = ("tputorch.controller", "tputorch.cli", "kopf", "kubernetes")
# Lowest first. The leaves import nothing of the package: api/crd.py builds the status schema from
# train.py's limits, render/ and status/ stamp times with timestamps.py, render/ and status/ read the
# hang watchdog's contract from watchdog.py (train.py's report() arms it), the doctor names
# tested_versions.py's versions, and __init__.py holds only the version.
LAYERS = [
    ("__init__.py", "timestamps.py", "train.py", "watchdog.py", "tested_versions.py"),
    ("api",),
    ("render",),
    ("status",),
    ("controller", "cli"),
    ("__main__.py",),
]
# Function-level imports a pure module may keep, by module: training scripts have Ray; the operator
# process never imports it.
LAZY_OPTIONAL = {"train.py": ("ray",)}
MAX_LINES = 600
MAX_BRANCH_POINTS = 40


@dataclass(frozen=True)
class Import:
    target: str  # the module imported: for `from p import m`, p.m when m is a module of the package
    names: tuple[str, ...]  # what `from target import ...` takes from it (empty for `import target`)
    line: int
    in_function: bool


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_path(name: str, root: Path) -> Path | None:
    """The file of module `name` when it is one of the package under `root`."""
    parts = name.split(".")
    if parts[0] != root.name:
        return None
    base = root.parent.joinpath(*parts)
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def import_statements(path: Path, root: Path = PKG) -> list[Import]:
    """Every import in `path`, relative ones resolved against its package."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(alias.name, (), child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = child.module
                if child.level:
                    base = package.split(".")
                    target = ".".join(base[: len(base) - child.level + 1] + ([child.module] if child.module else []))
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    found.append(Import(sub, (), child.lineno, in_function) if _module_path(sub, root)
                                 else Import(target, (alias.name,), child.lineno, in_function))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return found


def imports_of(path: Path, root: Path = PKG) -> set[str]:
    """Every module `path` imports, and every name it takes from one (`from m import x`: m.x)."""
    statements = import_statements(path, root)
    return {i.target for i in statements} | {f"{i.target}.{n}" for i in statements for n in i.names}


def pure_modules(root: Path = PKG):
    for entry in PURE:
        path = root / entry
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []


def layer_of(path: Path, root: Path) -> int | None:
    entry = path.relative_to(root).parts[0]
    return next((i for i, entries in enumerate(LAYERS) if entry in entries), None)


def layer_breaks(root: Path = PKG) -> list[str]:
    """Each import of a module from a higher layer, and each module no layer holds."""
    breaks = []
    for path in sorted(root.rglob("*.py")):
        here = layer_of(path, root)
        if here is None:
            breaks.append(f"{path.relative_to(root)} is in no layer (LAYERS)")
            continue
        for i in import_statements(path, root):
            target = _module_path(i.target, root)
            if target is not None and (layer_of(target, root) or 0) > here:
                breaks.append(f"{path.relative_to(root)}:{i.line} imports {i.target}, a higher layer")
    return breaks


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (anywhere in it)."""
    graph = {}
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        graph[name] = {i.target for i in import_statements(path, root) if _module_path(i.target, root)} - {name}
    return graph


def import_cycles(root: Path = PKG) -> list[list[str]]:
    """The strongly connected components of the import graph with more than one module (Tarjan)."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                connect(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return cycles


def lazy_imports(root: Path = PKG) -> list[str]:
    """Function-level imports in the pure modules but those LAZY_OPTIONAL allows."""
    found = []
    for path in pure_modules(root):
        allowed = LAZY_OPTIONAL.get(str(path.relative_to(root)), ())
        found.extend(f"{path.relative_to(root)}:{i.line} imports {i.target} inside a function"
                     for i in import_statements(path, root)
                     if i.in_function and i.target.split(".")[0] not in allowed)
    return found


def branch_points(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """`function`'s branch points, as the module docstring counts them."""
    count = 0
    pending = list(ast.iter_child_nodes(function))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # counted on its own
        if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp, ast.match_case)):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += len(node.ifs)
        pending.extend(ast.iter_child_nodes(node))
    return count


def too_long(root: Path = PKG) -> list[str]:
    return [f"{p.relative_to(root)}: {n} lines, {n - MAX_LINES} over {MAX_LINES}"
            for p in sorted(root.rglob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES]


def too_branchy(root: Path = PKG) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (n := branch_points(node)) > MAX_BRANCH_POINTS:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {n} branch points, "
                             f"{n - MAX_BRANCH_POINTS} over {MAX_BRANCH_POINTS}")
    return found


@pytest.mark.parametrize("path", list(pure_modules()), ids=lambda p: str(p.relative_to(PKG)))
def test_pure_modules_import_no_io(path):
    bad = sorted(m for m in imports_of(path) if m.startswith(FORBIDDEN))
    assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_the_checker_sees_relative_and_lazy_imports(tmp_path):
    """The check above must be able to fail: a lazy relative import of the controller is found."""
    fake_pkg = tmp_path / "tputorch"
    (fake_pkg / "status").mkdir(parents=True)
    module = fake_pkg / "status" / "job.py"
    module.write_text("def f():\n    from ..controller import kube\n    import kopf\n")
    assert {"tputorch.controller.kube", "kopf"} <= imports_of(module, fake_pkg)


def test_every_pure_room_exists():
    assert all((PKG / entry).exists() for entry in PURE)


def test_the_layers_hold():
    assert not layer_breaks()


def test_no_import_cycle():
    assert not import_cycles()


def test_no_function_level_import_in_the_pure_modules():
    assert not lazy_imports()


def test_no_module_is_too_long():
    assert not too_long()


def test_no_function_has_too_many_branch_points():
    assert not too_branchy()


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "tputorch"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_layer_check_sees_an_import_from_above_and_a_module_in_no_layer(tmp_path):
    root = _fake_package(tmp_path, {
        "api/__init__.py": "", "api/crd.py": "def schema():\n    from ..status import conditions\n",
        "status/__init__.py": "", "status/conditions.py": "from ..api import crd\n",  # from below: fine
        "render/__init__.py": "from .. import train\n", "train.py": "",
        "stray.py": "",
    })
    assert layer_breaks(root) == ["api/crd.py:2 imports tputorch.status.conditions, a higher layer",
                                  "stray.py is in no layer (LAYERS)"]


def test_the_cycle_check_sees_a_cycle_through_a_function_level_import(tmp_path):
    root = _fake_package(tmp_path, {
        "api/__init__.py": "", "api/common.py": "from . import storage\n",
        "api/storage.py": "def size():\n    from .common import quantity\n",
        "api/crd.py": "from .common import x\nfrom .storage import y\n",  # imports both, in no cycle
    })
    assert import_cycles(root) == [["tputorch.api.common", "tputorch.api.storage"]]
    (root / "api" / "storage.py").write_text("def size():\n    return 1\n")
    assert import_cycles(root) == []


def test_the_lazy_import_check_spares_only_the_listed_optional_dependency(tmp_path):
    root = _fake_package(tmp_path, {
        "train.py": "def scaling():\n    from ray.train import ScalingConfig\n    import ray.train\n    import json\n",
        "api/__init__.py": "import json\n", "api/crd.py": "def dump():\n    import yaml\n",
    })
    assert lazy_imports(root) == ["api/crd.py:2 imports yaml inside a function",
                                  "train.py:4 imports json inside a function"]


def test_the_size_check_counts_lines(tmp_path):
    root = _fake_package(tmp_path, {"api/__init__.py": "x = 1\n" * MAX_LINES, "api/crd.py": "x = 1\n" * (MAX_LINES + 1)})
    assert too_long(root) == [f"api/crd.py: {MAX_LINES + 1} lines, 1 over {MAX_LINES}"]


BRANCHY = '''
def f(x, a, b):
    if x:  # 1
        pass
    elif a:  # 2
        pass
    for i in x:  # 3
        while i:  # 4
            break
    try:
        pass
    except ValueError:  # 5
        pass
    except KeyError:  # 6
        pass
    y = a if x else b  # 7
    z = x and a or b  # 8, 9
    w = [i for i in x if i if a]  # 10, 11
    v = lambda: a if b else x  # 12
    match x:
        case 1:  # 13
            pass
        case _:  # 14
            pass

    def inner():
        if x:  # inner's own
            pass
'''


def test_the_branch_count_counts_what_the_docstring_says(tmp_path):
    outer, inner = (n for n in ast.walk(ast.parse(BRANCHY)) if isinstance(n, ast.FunctionDef))
    assert (branch_points(outer), branch_points(inner)) == (14, 1)
    body = "".join(f"    if x == {i}:\n        pass\n" for i in range(MAX_BRANCH_POINTS))
    root = _fake_package(tmp_path, {"api/__init__.py": f"def ok(x):\n{body}",
                                    "api/crd.py": f"def long(x):\n{body}    return x or 1\n"})
    assert too_branchy(root) == [f"api/crd.py:1 long: {MAX_BRANCH_POINTS + 1} branch points, 1 over {MAX_BRANCH_POINTS}"]
