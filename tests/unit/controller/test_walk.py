"""The controller package's docstring walks a TPUTorchService from apply to Ready by module,
class and function: every name it gives must exist, so that a rename or a move that leaves the
walk untrue fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import tputorch
import tputorch.controller as controller
from tputorch.controller import handlers
from tputorch.controller.reconcile import Controller

WALK = controller.__doc__.split("to Ready", 1)[1]
PACKAGE = Path(tputorch.__file__).parent


def resolve(dotted: str, package: str = "tputorch.controller") -> object:
    """module.Name[.attr] within ``package``."""
    module, *names = dotted.split(".")
    obj = importlib.import_module(f"{package}.{module}")
    for name in names:
        obj = getattr(obj, name)
    return obj


def test_the_walk_names_only_what_exists():
    # an earlier step's names (reconcile_service, child_changed) stand bare after an arrow or in
    # parentheses: they are the Controller's or the handlers'
    bare = set(re.findall(r"-> ([a-z_]+)\b(?![./])", WALK)) | set(re.findall(r"\(([a-z_]+)\)", WALK))
    assert bare >= {"start_controller", "build", "reconcile", "reconcile_service", "child_changed", "pod_changed"}
    for name in bare:
        assert hasattr(Controller, name) or hasattr(handlers, name), name
    dotted = {n for n in re.findall(r"\b([a-z]+(?:\.[A-Za-z_]+)+)", WALK) if not n.endswith(".py")}
    assert len(dotted) >= 10, dotted
    classes = {}
    for name in dotted:
        assert callable(resolve(name)), name
        module, *names = name.split(".")
        for i in range(1, len(names) + 1):  # the classes it passes through: Controller, Kube, ...
            found = resolve(".".join([module, *names[:i]]))
            if isinstance(found, type):
                classes[found.__name__] = found
    # then a class's own name with a method: Controller.work, Kube.patch_status
    methods = re.findall(r"\b([A-Z][A-Za-z]+)\.([a-z_]+)\b", WALK)
    assert len(methods) >= 2, methods
    for cls, method in methods:
        assert callable(getattr(classes[cls], method)), (cls, method)
    for path, function in re.findall(r"\b([a-z]+/[a-z_]+)\.py ([a-z_]+)\b", WALK):
        assert callable(resolve(f"{path.split('/')[1]}.{function}", f"tputorch.{path.split('/')[0]}")), (path, function)
    for path in re.findall(r"\b([a-z/]+\.py)\b", WALK):
        assert (PACKAGE / "controller" / path).exists() or (PACKAGE / path).exists(), path
    for folder in re.findall(r"\b([a-z]+)/\)", WALK):
        assert (PACKAGE / folder).is_dir(), folder
