"""The package's rooms: pure modules (api/, render/, status/, timestamps.py, train.py) import nothing
from controller/ or cli/, nor kopf or the kubernetes client; checked on the import statements
themselves, so a lazy import inside a function counts too."""

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "operator" / "tputorch"
PURE = ["api", "render", "status", "timestamps.py", "train.py"]
FORBIDDEN = ("tputorch.controller", "tputorch.cli", "kopf", "kubernetes")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, relative imports resolved against its package."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def pure_modules():
    for entry in PURE:
        path = PKG / entry
        yield from (sorted(path.rglob("*.py")) if path.is_dir() else [path])


@pytest.mark.parametrize("path", list(pure_modules()), ids=lambda p: str(p.relative_to(PKG)))
def test_pure_modules_import_no_io(path):
    bad = sorted(m for m in imports_of(path) if m.startswith(FORBIDDEN))
    assert not bad, f"{path.relative_to(PKG)} imports {bad}"


def test_the_checker_sees_relative_and_lazy_imports(tmp_path, monkeypatch):
    """The check above must be able to fail: a lazy relative import of the controller is found."""
    fake_pkg = tmp_path / "tputorch"
    (fake_pkg / "status").mkdir(parents=True)
    module = fake_pkg / "status" / "job.py"
    module.write_text("def f():\n    from ..controller import kube\n    import kopf\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", fake_pkg)
    assert {"tputorch.controller.kube", "kopf"} <= imports_of(module)


def test_every_pure_room_exists():
    assert all((PKG / entry).exists() for entry in PURE)
