"""The node plugin's health condition and an administrator's annotations (kube/device_health.py):
what the plugin writes, the allocator and `report` read back, device by device."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    KEEP_ANNOTATION,
    DeviceMark,
    admin_orders,
    clear_value,
    keep_value,
    marks_message,
    node_marks,
    parse_marks,
)

_names = st.from_regex(r"gpu-[0-9]{1,2}(-mig-[1-7]g\.[0-9]{1,3}gb-[0-9])?", fullmatch=True)
_stamps = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1)).map(
    lambda d: d.strftime("%Y-%m-%dT%H:%M:%SZ"))
_marks = st.builds(
    DeviceMark, device=_names,
    reason=st.sampled_from(["xid-79", "xid-94", "gpu-lost", "nvml-unavailable", "ecc"]),
    severity=st.sampled_from(["fatal", "degraded"]),
    action=st.sampled_from(["withheld", "tainted NoExecute", "tainted NoSchedule"]),
    since=_stamps, healthy_at=st.one_of(st.just(""), _stamps), kept=st.booleans())


@given(st.lists(_marks, unique_by=lambda m: m.device, max_size=8))
def test_what_the_plugin_writes_reads_back_the_same(marks: list[DeviceMark]) -> None:
    message = marks_message("gpu.dra-gateway.io", marks)
    # `kept` wins over a time to be healthy at: a kept device has none.
    expected = sorted((m if not m.kept else DeviceMark(
        m.device, m.reason, m.severity, m.action, m.since, "", True) for m in marks),
        key=lambda m: m.device)
    assert parse_marks(message) == expected


def test_a_reason_with_separators_cannot_break_the_list() -> None:
    (mark,) = parse_marks(marks_message("d", [DeviceMark(
        "gpu-1", "bad (reason); x, y", "degraded", "withheld", "2026-12-06T10:00:00Z")]))
    assert (mark.device, mark.reason) == ("gpu-1", "bad-reason-x-y")


def test_a_node_without_the_condition_or_with_it_false_has_no_marks() -> None:
    message = marks_message("d", [DeviceMark("gpu-1", "xid-79", "fatal", "withheld", "t")])
    condition = {"type": "GpuDevicesUnhealthy", "status": "True", "message": message}
    assert [m.device for m in node_marks({"status": {"conditions": [condition]}})] == ["gpu-1"]
    assert node_marks({"status": {"conditions": [{**condition, "status": "False"}]}}) == []
    assert node_marks({"metadata": {"name": "n"}}) == []
    # An older plugin's message ("withheld: gpu-1 (xid-79, fatal)") reads as no marks.
    old = {**condition, "message": "1 d device(s) withheld: gpu-1 (xid-79, fatal)"}
    assert node_marks({"status": {"conditions": [old]}}) == []


def test_orders_are_read_item_by_item_and_a_bad_item_is_named() -> None:
    orders = admin_orders({
        CLEAR_ANNOTATION: "gpu-1=2026-12-06T10:00:00Z, *=2026-12-06T09:00:00+01:00,gpu-2=soon",
        KEEP_ANNOTATION: "gpu-3,, gpu-4 "})
    assert orders.cleared_until("gpu-1") == datetime(2026, 12, 6, 10, tzinfo=UTC)
    assert orders.cleared_until("gpu-9") == datetime(2026, 12, 6, 8, tzinfo=UTC)
    assert orders.keep == {"gpu-3", "gpu-4"}
    (problem,) = orders.problems
    assert "'gpu-2=soon'" in problem
    assert "gpu-3=2026-12-06T10:30:00Z" in problem


def test_the_annotation_values_a_command_writes() -> None:
    at = datetime(2026, 12, 6, 11, 0, 5, tzinfo=UTC)
    assert clear_value("gpu-2=2026-12-06T10:00:00Z", ["gpu-1"], at) == (
        "gpu-1=2026-12-06T11:00:05Z,gpu-2=2026-12-06T10:00:00Z")
    assert clear_value(None, ["*"], at) == "*=2026-12-06T11:00:05Z"
    precise = at.replace(microsecond=900_000)
    written = clear_value(None, ["gpu-1"], precise)
    assert written == "gpu-1=2026-12-06T11:00:05.900000Z"
    assert admin_orders({CLEAR_ANNOTATION: written}).cleared_until("gpu-1") == precise
    assert keep_value("gpu-3", add=["gpu-1"]) == "gpu-1,gpu-3"
    assert keep_value("gpu-1,gpu-3", remove=["gpu-1"]) == "gpu-3"
