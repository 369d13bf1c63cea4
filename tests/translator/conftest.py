from __future__ import annotations

import pytest

from dra_gateway.translator.rules import RuleSet, load_rules


@pytest.fixture(scope="session")
def builtin_rules() -> RuleSet:
    return load_rules()
