"""`dra-gateway report`: the line per node saying where it is in the move from a legacy device
plugin, read from the condition the node plugin writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_gateway import report
from dra_gateway.cli import main
from dra_gateway.kube import names
from dra_gateway.kube.device_health import DeviceMark, marks_message
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.report import build_report


def _node(name: str, *conditions: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": list(conditions)}}


CUTTING_OVER = {"type": names.NODE_MIGRATION_CONDITION, "status": "True",
                "reason": names.NODE_STATE_CUTTING_OVER,
                "message": "2 of 8 card(s) held by legacy pods: ml/train (nvidia.com/gpu); "
                           "withheld until those pods end",
                "lastTransitionTime": "2026-12-01T10:00:00Z"}
DRA = {"type": names.NODE_MIGRATION_CONDITION, "status": "True", "reason": names.NODE_STATE_DRA,
       "message": "all 4 card(s) published", "lastTransitionTime": "2026-12-01T09:00:00Z"}
HEALTHY = {"type": "GpuDevicesUnhealthy", "status": "False", "reason": "AllDevicesHealthy"}
WITHHELD = {"type": "GpuDevicesUnhealthy", "status": "True", "reason": "DevicesUnhealthy",
            "message": marks_message(names.DRIVER, [
                DeviceMark("gpu-2", "xid-48", "fatal", "withheld", "2026-12-01T11:00:00Z",
                           healthy_at="2026-12-01T11:10:00Z"),
                DeviceMark("gpu-5", "xid-94", "degraded", "withheld", "2026-12-01T11:01:00Z",
                           kept=True)]),
            "lastTransitionTime": "2026-12-01T11:01:00Z"}
TAINTED = {"spec": {"nodeName": "gpu-a", "driver": names.DRIVER, "devices": [
    {"name": "gpu-0"},
    {"name": "gpu-3", "taints": [{"key": f"{names.DRIVER}/unhealthy", "value": "xid-79",
                                  "effect": "NoExecute", "timeAdded": "2026-12-01T12:00:00Z"},
                                 {"key": "example.com/other", "effect": "NoSchedule"}]}]}}


def test_unhealthy_devices_are_read_device_by_device_from_the_nodes_condition() -> None:
    """Recovering devices say when they are healthy again, kept ones that they are kept; a
    device tainted by a plugin whose Node lists nothing (an older plugin) has its taint's row."""
    assert report.unhealthy_devices([TAINTED], [_node("gpu-c", WITHHELD), _node("x", HEALTHY)]
                                    ) == [
        {"node": "gpu-a", "device": "gpu-3", "effect": "tainted NoExecute", "reason": "xid-79",
         "since": "2026-12-01T12:00:00Z", "healthyAgain": "-"},
        {"node": "gpu-c", "device": "gpu-2", "effect": "withheld", "reason": "xid-48 (fatal)",
         "since": "2026-12-01T11:00:00Z", "healthyAgain": "2026-12-01T11:10:00Z"},
        {"node": "gpu-c", "device": "gpu-5", "effect": "withheld",
         "reason": "xid-94 (degraded)", "since": "2026-12-01T11:01:00Z", "healthyAgain": "kept"}]
    # A device the condition lists is not listed again from its taint.
    tainted = {"type": "GpuDevicesUnhealthy", "status": "True", "message": marks_message(
        names.DRIVER, [DeviceMark("gpu-3", "xid-79", "fatal", "tainted NoExecute",
                                  "2026-12-01T12:00:00Z")])}
    (row,) = report.unhealthy_devices([TAINTED], [_node("gpu-a", tainted)])
    assert (row["effect"], row["healthyAgain"]) == ("tainted NoExecute",
                                                    "when the card comes back")


def test_each_node_with_the_migration_condition_is_one_row_by_name() -> None:
    rows = report.migration_nodes([_node("gpu-b", HEALTHY, CUTTING_OVER), _node("cpu-1"),
                                   _node("gpu-a", DRA)])
    assert rows == [
        {"node": "gpu-a", "state": "DRA", "message": "all 4 card(s) published",
         "detail": "all 4 card(s) published", "since": "2026-12-01T09:00:00Z"},
        {"node": "gpu-b", "state": "CuttingOver", "message": CUTTING_OVER["message"],
         "detail": CUTTING_OVER["message"], "since": "2026-12-01T10:00:00Z"}]


def test_a_healthy_node_without_a_kubelet_to_ask_shows_no_fix_it() -> None:
    # What the node plugin writes where the kubelet's pod-resources socket is missing (the
    # demo's nodes): the Node's status decided, nothing is wrong.
    message = ("the Node's status shows no legacy GPU resource, so no container can hold one "
               "(the kubelet's pod-resources API cannot be read (the kubelet's pod-resources "
               "socket /var/lib/kubelet/pod-resources/kubelet.sock does not exist: mount the "
               "kubelet's pod-resources directory (/var/lib/kubelet/pod-resources) into the "
               "plugin, or ...)): all 4 card(s) published")
    healthy = {**DRA, "message": message}
    (row,) = report.migration_nodes([_node("gpu-a", healthy)])
    assert row["message"] == "all 4 card(s) published"
    assert row["detail"] == message
    assert "mount" not in report.nodes_table([row])
    # A real problem keeps its fix-it.
    legacy = {**CUTTING_OVER, "reason": names.NODE_STATE_LEGACY,
              "message": "a legacy device plugin offers nvidia.com/gpu on this node: none of "
                         "its 4 card(s) is published until it leaves the node (label "
                         "dra-gateway.io/cut-over=true)"}
    (row,) = report.migration_nodes([_node("gpu-b", legacy)])
    assert row["message"] == legacy["message"]


def test_pending_counts_the_pods_kube_scheduler_holds_beside_the_gateways() -> None:
    from dra_gateway.policy.report import render_table

    amd = {"metadata": {"namespace": "ml", "name": "rocm-smoke"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
           "status": {"phase": "Pending"}}
    bound = {"metadata": {"namespace": "ml", "name": "placed"},
             "spec": {"nodeName": "gpu-a", "resourceClaims": [{"name": "gpu"}]},
             "status": {"phase": "Running"}}
    plain = {"metadata": {"namespace": "ml", "name": "web"}, "spec": {},
             "status": {"phase": "Pending"}}
    shown = build_report(claims=[], slices=[], pods=[amd, bound, plain], catalog=Catalog.build())
    report.add_scheduler_pending(shown, [amd, bound, plain])
    assert shown["pending"] == {"Unschedulable": 1}
    text = render_table(shown)
    assert "PENDING: Unschedulable=1" in text
    assert "ml/rocm-smoke waits for kube-scheduler: its claims are not the gateway's" in text


@pytest.fixture
def cluster_report(monkeypatch: pytest.MonkeyPatch) -> None:
    async def read(kubeconfig: str | None, namespace: str = "dra-gateway") -> dict[str, Any]:
        shown = build_report(claims=[], slices=[], pods=[], catalog=Catalog.build())
        shown["nodes"] = report.migration_nodes([_node("gpu-b", CUTTING_OVER)])
        shown["unhealthyDevices"] = report.unhealthy_devices([TAINTED], [_node(
            "gpu-c", WITHHELD)])
        return shown
    monkeypatch.setattr(report, "_read", read)


@pytest.mark.usefixtures("cluster_report")
def test_the_table_ends_with_a_line_per_node_and_its_state(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    # The reason wraps under its column: the table fits a 120-column terminal.
    assert out.endswith(
        "NODES (move from legacy device plugins)\n"
        "NODE                 STATE        SINCE                 WHY\n"
        "gpu-b                CuttingOver  2026-12-01T10:00:00Z  2 of 8 card(s) held by legacy "
        "pods: ml/train (nvidia.com/gpu);\n"
        + " " * 56 + "withheld until those pods end\n")
    assert max(len(line) for line in out.splitlines()) <= 120
    assert ("UNHEALTHY DEVICES\nNODE                 DEVICE         EFFECT             SINCE"
            "                 HEALTHY AGAIN            WHY\ngpu-a                gpu-3          "
            "tainted NoExecute  2026-12-01T12:00:00Z  -                        xid-79\n") in out


@pytest.mark.usefixtures("cluster_report")
def test_json_and_html_carry_the_nodes_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"][0]["state"] == "CuttingOver"
    assert main(["report", "-o", "html"]) == 0
    page = capsys.readouterr().out
    assert "<td>gpu-b</td><td>CuttingOver</td>" in page
    assert "<td>gpu-a</td><td>gpu-3</td><td>tainted NoExecute</td>" in page
    assert page.rstrip().endswith("</table></body></html>")


def test_the_moves_a_defrag_plan_would_make_close_the_report(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    body = {"helped": [{"pod": "ml/big", "priority": 0, "node": "gpu-a",
                        "devices": ["gpu-0", "gpu-1"], "frees": "gpu-0, gpu-1 on gpu-a",
                        "moves": [{"pod": "ml/s0", "from": {"node": "gpu-a", "devices": ["gpu-0"]},
                                   "to": {"node": "gpu-b", "devices": ["gpu-3"]}}]}],
            "notHelped": [], "moves": 1, "waiting": 1, "placed": 8,
            "mayNotMove": {"no controller re-creates it (a bare pod)": 2}}

    async def read(kubeconfig: str | None, namespace: str = "dra-gateway") -> dict[str, Any]:
        shown = build_report(claims=[], slices=[], pods=[], catalog=Catalog.build())
        shown["nodes"] = []
        shown["unhealthyDevices"] = []
        shown["defrag"] = body
        return shown

    monkeypatch.setattr(report, "_read", read)
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert "DEFRAG (the moves `dra-gateway defrag plan` would make)" in out
    assert "    move ml/s0: gpu-a (gpu-0) -> gpu-b (gpu-3)" in out
    assert "2 of 8 placed pod(s) may not move:" in out
    assert main(["report", "-o", "html"]) == 0
    assert "<h2>Defrag</h2>" in capsys.readouterr().out
