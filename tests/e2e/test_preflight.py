"""`dra-gateway preflight` against the gateway as users install it (helm, on a real control
plane), on the oldest and the newest setups: it finds the release, the gates the components
detect, and the node plugins' reports on their Nodes."""

from __future__ import annotations

import json

import pytest

from dra_gateway.cli import main
from e2e.conftest import SETUPS
from e2e.support import GPU_NODES, NAMESPACE, Gateway


def test_preflight_reads_the_installed_gateway(gateway: Gateway,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    if (gateway.version, dict(gateway.feature_gates)) not in (SETUPS[0][1:], SETUPS[-1][1:]):
        pytest.skip(f"preflight is checked on {SETUPS[0][0]} and {SETUPS[-1][0]} only")
    code = main(["preflight", "-o", "json", "--namespace", NAMESPACE,
                 "--kubeconfig", str(gateway.plane.admin_kubeconfig)])
    body = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in body["checks"]}
    assert code == body["exitCode"]
    assert body["server"].startswith(f"v{gateway.version}")
    assert body["chart"] == {"installed": True, "release": "dra-gateway"}
    assert checks["dra-api"]["severity"] == "ok"
    assert checks["server-version"]["severity"] == "ok"
    gates = {i["name"]: i["message"].split(":")[0] for i in checks["feature-gates"]["items"]}
    assert gates["DRAConsumableCapacity"] == ("on" if gateway.consumable_capacity else "off")
    assert gates["DRADeviceTaints"] == ("on" if gateway.device_taints else "off")
    # The demo's GPU nodes carry nvidia.com/gpu.product but not the labels the chart's
    # DaemonSet selects (their plugins run as processes): preflight says so, by label.
    placement = {i["name"]: i for i in checks["node-plugin-nodes"]["items"]}
    for node, _ in GPU_NODES:
        assert placement[node]["severity"] == "warning"
        assert "missing label nvidia.com/gpu.present=true" in placement[node]["message"]
    # Their plugins reported what they found (a CDI folder under the test's work folder).
    setups = {i["name"]: i["message"] for i in checks["node-setup"]["items"]}
    for node, _ in GPU_NODES:
        assert setups[node].startswith("cdi "), setups
        assert " writable;" in setups[node], setups
    assert checks["cert-manager"]["summary"].startswith("not used by the installed chart")
    assert checks["prometheus-operator"]["severity"] == "info"
