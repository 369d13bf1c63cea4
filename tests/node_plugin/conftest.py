from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "inventory"


@pytest.fixture
def h100x8() -> Path:
    return EXAMPLES / "h100x8.yaml"


@pytest.fixture
def mixed() -> Path:
    return EXAMPLES / "mixed-mig.yaml"
