"""`dra-gateway preflight` on the real node, as an operator meets it: with the chart installed and
the node ready it says so; then the node loses, one at a time, each prerequisite preflight checks
on a node — HAMi-core's library where the chart mounts it from, a CDI folder the node plugin can
write, the label the node plugin's DaemonSet selects — and preflight names what is missing on
that node, with its fix and the exit code of its severity. On the oldest setup (the e2e tier runs
preflight on the oldest and the newest control planes, with simulated nodes)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.support import NAMESPACE, RELEASE, wait_until
from realnode.support import NODE, SETUPS

from dra_gateway.cli import main
from realchart.support import GPU_NODE_LABEL, ChartCluster


def _preflight(chart: ChartCluster, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    code = main(["preflight", "-o", "json", "--namespace", NAMESPACE,
                 "--kubeconfig", str(chart.plane.admin_kubeconfig)])
    body: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == body["exitCode"]
    return body


def _item(body: dict[str, Any], check: str) -> dict[str, Any]:
    """The check's item about the real node (an empty one when it names none)."""
    [found] = [c for c in body["checks"] if c["name"] == check]
    return next((i for i in found["items"] if i["name"] == NODE),
                {"severity": found["severity"], "message": found["summary"], "check": found})


@contextlib.contextmanager
def _read_only_folder(folder: Path) -> Iterator[Path]:
    """`folder` as a read-only file system (a bind mount), as a node whose runtime folder is on
    one; unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_preflight_names_each_prerequisite_the_real_node_lacks(
        chart: ChartCluster, capsys: pytest.CaptureFixture[str]) -> None:
    if chart.plane.version() != f"v{SETUPS[0][1]}":
        pytest.skip(f"preflight on the real node is checked on {SETUPS[0][0]} only")

    def settled(check: str, wanted: str) -> dict[str, Any]:
        """preflight's item of `check` on the node once its message holds `wanted` (the node
        plugin's pod restarted by the upgrade and reported on its Node)."""
        seen: dict[str, Any] = {}

        def holds() -> bool:
            seen["body"] = _preflight(chart, capsys)
            return wanted in _item(seen["body"], check)["message"]

        wait_until(f"preflight's {check} to say {wanted!r}", holds, 120, chart.check)
        return seen["body"]

    chart.helm_release("install", chart.values())
    try:
        body = settled("node-setup", "hami-core present")
        setup = _item(body, "node-setup")
        assert f"cdi {chart.node.cdi_dir} writable" in setup["message"]
        # containerd 2.2 reads a CDI folder outside its defaults only if configured to: said.
        assert setup["severity"] == "warning", setup
        assert _item(body, "node-plugin-nodes")["severity"] == "ok"

        # HAMi-core's library missing: the node plugin says so on its Node; preflight: info.
        missing = chart.work / "no-hami-core" / "libvgpu.so"
        chart.helm_release("upgrade", chart.values(
            nodePlugin={"hamiCore": {"hostPath": str(missing)}}))
        settled("node-setup", f"hami-core missing at {missing}")

        # The CDI folder on a read-only file system: the plugin cannot write specs; an error.
        with _read_only_folder(chart.work / "cdi-read-only") as read_only:
            chart.helm_release("upgrade", chart.values(nodePlugin={"cdiDir": str(read_only)}))
            body = settled("node-setup", f"cdi {read_only} not writable")
            setup = _item(body, "node-setup")
            assert setup["severity"] == "error", setup
            assert "Read-only file system" in setup["message"]
            assert body["exitCode"] == 4
            chart.helm_release("upgrade", chart.values())
            settled("node-setup", f"cdi {chart.node.cdi_dir} writable")

        # The label the DaemonSet selects taken off: no node for the plugin; an error naming it.
        chart.kubectl("label", "node", NODE, f"{GPU_NODE_LABEL}-")
        try:
            body = settled("node-plugin-nodes", f"missing label {GPU_NODE_LABEL}=true")
            [placement] = [c for c in body["checks"] if c["name"] == "node-plugin-nodes"]
            assert placement["severity"] == "error"
            assert f"kubectl label node NODE {GPU_NODE_LABEL}=true" in placement["fix"]
            assert body["exitCode"] == 4
        finally:
            chart.kubectl("label", "node", NODE, f"{GPU_NODE_LABEL}=true", "--overwrite")
    finally:
        chart.run_helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout",
                       "4m")
