"""Fault classes, their taints, and recovery (node-plugin/faults.py, health.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    KEEP_ANNOTATION,
    DeviceMark,
    admin_orders,
    clear_value,
    parse_marks,
)
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


class WallClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _walled(recovery: float = 60.0) -> tuple[Health, Clock, WallClock, list[int]]:
    clock, wall = Clock(), WallClock()
    changes: list[int] = []
    health = Health(driver="gpu.dra-gateway.io", on_change=lambda: changes.append(1),
                    recovery_seconds=recovery, monotonic=clock, clock=wall)
    return health, clock, wall, changes


def _advance(clock: Clock, wall: WallClock, seconds: float) -> None:
    clock.now += seconds
    wall.now += timedelta(seconds=seconds)


def test_the_condition_says_what_was_done_to_each_device_and_when_it_is_healthy_again() -> None:
    health, clock, wall, changes = _walled(recovery=60)
    health.mark(["gpu-0"], "xid-79")
    _advance(clock, wall, 10)
    health.mark(["gpu-1"], "xid-92")
    marks = {m.device: m for m in parse_marks(health.condition(tainted=False)["message"])}
    # A fatal device has no time until it comes back; a degraded one a minute after its fault.
    assert marks["gpu-0"] == DeviceMark("gpu-0", "xid-79", "fatal", "withheld",
                                        "2026-12-06T10:00:00Z")
    assert marks["gpu-1"].healthy_at == "2026-12-06T10:01:10Z"
    assert marks["gpu-1"].action == "withheld"
    before = len(changes)
    _advance(clock, wall, 5)
    health.recovered(["gpu-0"], "test")  # the condition is written again: it has a time now
    assert len(changes) == before + 1
    (mark,) = [m for m in health.marks(tainted=True) if m.device == "gpu-0"]
    assert (mark.action, mark.healthy_at) == ("tainted NoExecute", "2026-12-06T10:01:15Z")


def test_an_administrator_clears_faults_up_to_a_time_and_a_later_fault_marks_again() -> None:
    health, clock, wall, changes = _walled(recovery=0)  # nothing lifts by itself
    health.mark(["gpu-0", "gpu-1"], "xid-79")
    _advance(clock, wall, 60)
    health.mark(["gpu-1"], "xid-79")  # gpu-1's latest fault is after the clear below
    orders = admin_orders({CLEAR_ANNOTATION: "gpu-0=2026-12-06T10:00:30Z,"
                                             "gpu-1=2026-12-06T10:00:30Z"})
    health.apply_orders(orders)
    assert set(health.problems) == {"gpu-1"}
    assert "cleared its faults up to 2026-12-06T10:00:30Z" in health.lifted_because["gpu-0"]
    health.apply_orders(orders)  # the same annotation read again changes nothing
    assert set(health.problems) == {"gpu-1"}
    _advance(clock, wall, 60)
    health.mark(["gpu-0"], "xid-79")  # a fault after the clear marks it again
    health.apply_orders(orders)
    assert set(health.problems) == {"gpu-0", "gpu-1"}
    # `*` clears every device; the later of a device's own time and `*` counts.
    health.apply_orders(admin_orders({CLEAR_ANNOTATION: "*=2026-12-06T11:00:00Z"}))
    assert health.problems == {}
    assert len(changes) == 4  # two marks, two clears: reading an order again is no change


def test_a_kept_device_does_not_recover_by_itself_until_it_is_no_longer_kept() -> None:
    health, clock, wall, _ = _walled(recovery=60)
    health.mark(["gpu-1"], "xid-92")
    health.apply_orders(admin_orders({KEEP_ANNOTATION: "gpu-1, gpu-7"}))
    (mark,) = health.marks(tainted=False)
    assert (mark.kept, mark.healthy_at) == (True, "")
    assert "kept)" in health.condition(tainted=False)["message"]
    _advance(clock, wall, 3600)
    assert health.lift_recovered() == []
    health.apply_orders(admin_orders({}))
    assert health.lift_recovered() == ["gpu-1"]


def test_a_clear_in_the_same_second_as_the_fault_clears_it() -> None:
    """The clear annotation keeps the sub-second: a clear 0.6 s after a fault of the same
    second forgets that fault (truncated to the second, it would not)."""
    health, _, wall, _ = _walled(recovery=0)
    wall.now = datetime(2026, 12, 6, 10, 0, 5, 300_000, tzinfo=UTC)
    health.mark(["gpu-0"], "xid-79")
    at = datetime(2026, 12, 6, 10, 0, 5, 900_000, tzinfo=UTC)
    health.apply_orders(admin_orders({CLEAR_ANNOTATION: clear_value(None, ["gpu-0"], at)}))
    assert health.problems == {}
