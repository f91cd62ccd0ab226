import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))

import serving_chain  # noqa: E402


@pytest.fixture
def chain() -> tuple[str, Path]:
    """The serving venv's Python and the tiny model (both built into the shared cache if missing).
    No skip when they cannot be built: the chain must run here."""
    try:
        python = serving_chain.serving_python()
    except serving_chain.ChainError as exc:
        pytest.fail(str(exc))
    return python, serving_chain.tiny_model(python)
