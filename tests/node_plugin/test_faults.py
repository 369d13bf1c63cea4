"""Fault classes, their taints, and recovery (node-plugin/faults.py, health.py)."""

from __future__ import annotations

import pytest

from dra_gateway.node_plugin.faults import (
    DEGRADED,
    FATAL,
    INFORMATIONAL,
    severity_of,
    xid_severity,
)
from dra_gateway.node_plugin.health import Health


@pytest.mark.parametrize(("xid", "severity"), [
    (48, FATAL), (64, FATAL), (74, FATAL), (79, FATAL), (95, FATAL), (119, FATAL),
    (120, FATAL), (140, FATAL),
    (63, DEGRADED), (92, DEGRADED), (94, DEGRADED), (12345, DEGRADED),  # unknown: no new work
    (13, INFORMATIONAL), (31, INFORMATIONAL), (43, INFORMATIONAL), (45, INFORMATIONAL),
    (68, INFORMATIONAL), (109, INFORMATIONAL),
])
def test_each_xid_has_a_class(xid: int, severity: str) -> None:
    assert xid_severity(xid) == severity
    assert severity_of(f"xid-{xid}") == severity


def test_other_reasons_have_classes() -> None:
    assert severity_of("gpu-lost") == FATAL
    assert severity_of("nvml-unavailable") == DEGRADED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _health(recovery: float = 60.0) -> tuple[Health, Clock, list[int]]:
    clock = Clock()
    changes: list[int] = []
    health = Health(driver="gpu.dra-gateway.io", on_change=lambda: changes.append(1),
                    recovery_seconds=recovery, monotonic=clock)
    return health, clock, changes


def _effects(health: Health) -> dict[str, str]:
    return {d: t[0]["effect"] for d, t in health.taints().items()}


def test_fatal_faults_drain_degraded_ones_keep_new_work_away_informational_ones_do_nothing(
) -> None:
    health, _, changes = _health()
    health.mark(["gpu-0"], "xid-79")
    health.mark(["gpu-1"], "xid-92")
    health.mark(["gpu-2"], "xid-13")
    assert _effects(health) == {"gpu-0": "NoExecute", "gpu-1": "NoSchedule"}
    assert len(changes) == 2
    # A worse fault on a degraded device makes it fatal; a milder one changes nothing.
    health.mark(["gpu-1"], "xid-48")
    health.mark(["gpu-0"], "xid-92")
    assert _effects(health) == {"gpu-0": "NoExecute", "gpu-1": "NoExecute"}
    assert health.problems["gpu-0"].reason == "xid-79"
    assert health.problems["gpu-1"].reason == "xid-48"
    assert len(changes) == 3


def test_a_degraded_device_recovers_after_the_period_without_a_fault() -> None:
    health, clock, _ = _health(recovery=60)
    health.mark(["gpu-1"], "xid-92")
    clock.now += 59
    assert health.lift_recovered() == []
    health.mark(["gpu-1"], "xid-92")  # another fault: the period starts over
    clock.now += 59
    assert health.lift_recovered() == []
    clock.now += 1
    assert health.lift_recovered() == ["gpu-1"]
    assert health.taints() == {}


def test_a_fatal_device_recovers_only_after_it_came_back_and_stayed_quiet() -> None:
    health, clock, _ = _health(recovery=60)
    health.mark(["gpu-0"], "xid-79")
    clock.now += 3600
    assert health.lift_recovered() == []  # no sign that the card came back
    health.recovered(["gpu-0"], "test")
    clock.now += 30
    health.mark(["gpu-0"], "xid-79")  # a fault after the sign: it must come back again
    clock.now += 60
    assert health.lift_recovered() == []
    health.recovered(["gpu-0"], "test")
    clock.now += 60
    assert health.lift_recovered() == ["gpu-0"]


def test_a_recovery_of_one_reason_leaves_the_others() -> None:
    health, clock, _ = _health(recovery=10)
    health.mark(["gpu-0"], "gpu-lost")
    health.mark(["gpu-1"], "xid-48")
    health.recovered(["gpu-0", "gpu-1"], "NVML sees the card", reason="gpu-lost")
    clock.now += 10
    assert health.lift_recovered() == ["gpu-0"]
    assert set(health.problems) == {"gpu-1"}


def test_without_a_recovery_period_marks_stay_and_an_nvml_outage_lifts_only_when_cleared(
) -> None:
    health, clock, _ = _health(recovery=0)
    health.mark(["gpu-1"], "xid-92")
    clock.now += 10**6
    assert health.lift_recovered() == []
    health, clock, _ = _health(recovery=10)
    health.mark(["gpu-0", "gpu-1"], "nvml-unavailable")
    clock.now += 100
    assert health.lift_recovered() == []
    health.clear("nvml-unavailable")
    assert health.problems == {}
