import sys
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parents[1] / "cluster"


@pytest.fixture
def chain() -> tuple[str, Path]:
    """The serving venv's Python and the tiny model (both built into the shared cache if missing).
    No skip when they cannot be built: the chain must run here."""
    if str(CLUSTER) not in sys.path:
        sys.path.insert(0, str(CLUSTER))
    import serving_chain

    try:
        python = serving_chain.serving_python()
    except serving_chain.ChainError as exc:
        pytest.fail(str(exc))
    return python, serving_chain.tiny_model(python)
