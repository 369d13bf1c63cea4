"""Fixtures of the e2e tier: the gateway installed on a real control plane per supported
Kubernetes release and feature-gate setting (one at a time, torn down before the next and when
the suite leaves this package for another tier).

Each parameter builds its release's binaries with hack/build-control-plane.sh (cached per
version), so a cold run builds Kubernetes from the Go module proxy. Without Go or helm, or when
a build fails, the tier skips with the reason, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.support import Gateway, build_binaries, find_helm, install

# (id, Kubernetes version, feature gates): every release and gate setting the gateway supports.
SETUPS: tuple[tuple[str, str, dict[str, bool]], ...] = (
    ("1.34.4", "1.34.4", {}),
    ("1.34.4-consumable-capacity", "1.34.4", {"DRAConsumableCapacity": True}),
    ("1.35.4", "1.35.4", {}),
    ("1.36.3", "1.36.3", {}),
    ("1.37.2", "1.37.2", {}),
    # The newest 1.38 the module proxy serves (a pre-release until 1.38.0 is out).
    ("1.38.0-beta.0", "1.38.0-beta.0", {}),
)
# Setups only some modules need, beside SETUPS: their other tests are deselected there (each
# setup starts a control plane of its own, about a minute and a half).
NARROW_SETUPS: tuple[tuple[str, str, dict[str, bool]], ...] = (
    # Partitionable devices on where 1.34 has them off: MIG on demand with counter sets beside
    # the devices (1.34's layout).
    ("1.34.4-partitionable-devices", "1.34.4", {"DRAPartitionableDevices": True}),
)
# The modules each narrow setup runs.
NARROW_MODULES: dict[str, tuple[str, ...]] = {
    "1.34.4-partitionable-devices": ("test_mig_on_demand.py",),
}


@pytest.fixture(scope="package", params=SETUPS + NARROW_SETUPS,
                ids=[s[0] for s in SETUPS + NARROW_SETUPS])
def gateway(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    setup_id, version, gates = request.param
    helm = find_helm()
    bin_dir = build_binaries(version)
    work = tmp_path_factory.mktemp(f"e2e-{setup_id}")
    with install(version, gates, bin_dir, helm, work) as installed:
        yield installed


def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    # Builds and control planes take minutes, not the suite's default 60 s.
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(1800))
    narrow = [item for item in items if _narrow_elsewhere(item)]
    if narrow:
        config.hook.pytest_deselected(items=narrow)
        items[:] = [item for item in items if item not in narrow]


def _narrow_elsewhere(item: Any) -> bool:
    """An item on a narrow setup, in a module that setup is not for."""
    callspec = getattr(item, "callspec", None)
    setup = callspec.params.get("gateway") if callspec is not None else None
    modules = NARROW_MODULES.get(setup[0]) if setup is not None else None
    return modules is not None and Path(str(item.fspath)).name not in modules
