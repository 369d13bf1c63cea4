from __future__ import annotations

import json
import logging
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dra_gateway.cli import main
from dra_gateway.kube.logs import JsonFormatter


def test_discover_prints_the_slices_as_yaml(h100x8: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node-plugin", "discover", "--inventory", str(h100x8),
                 "--node-name", "gpu-node-1"]) == 0
    (slice_,) = list(yaml.safe_load_all(capsys.readouterr().out))
    kubernetes_validate.validate(slice_, "1.34", strict=True)
    assert len(slice_["spec"]["devices"]) == 8


def test_discover_prints_a_json_list_with_consumable_capacity(
        mixed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node-plugin", "discover", "--inventory", str(mixed), "--node-name", "m",
                 "-o", "json", "--consumable-capacity"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["kind"] == "List"
    shared = [d["name"] for d in listed["items"][0]["spec"]["devices"]
              if d.get("allowMultipleAllocations")]
    assert shared == ["gpu-1"]


def test_a_broken_inventory_is_one_clear_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - {index: 0, uuid: GPU-1, productName: x, memory: 80GB}\n")
    assert main(["node-plugin", "discover", "--inventory", str(bad), "--node-name", "n"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'error: {bad}: 1 error: gpus[0].memory: invalid quantity "80GB"')
    assert "Traceback" not in err


def test_a_binary_inventory_is_one_line_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "inventory.bin"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    assert main(["node-plugin", "discover", "--inventory", str(bad), "--node-name", "n"]) == 1
    assert capsys.readouterr().err == (
        f"error: {bad}: 1 error: not a text file (not UTF-8): give the YAML inventory\n")


def test_a_node_name_the_api_would_refuse_is_a_usage_error(
        h100x8: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["node-plugin", "discover", "--inventory", str(h100x8), "--node-name", "GPU_Node"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith("argument --node-name: 'GPU_Node' is not a valid node name: lowercase "
                        "letters, digits, '-' and '.', at most 253 characters, starting and "
                        "ending with a letter or digit\n")
    assert "Traceback" not in err


def test_device_classes_are_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node-plugin", "device-classes"]) == 0
    classes = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [c["metadata"]["name"] for c in classes] == ["gpu.dra-gateway.io",
                                                        "mig.dra-gateway.io"]
    for cls in classes:
        kubernetes_validate.validate(cls, "1.34", strict=True)


def test_serve_with_an_unusable_state_directory_is_one_line(
        h100x8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "plugins"
    blocker.write_text("a file where a directory should be\n")
    code = main(["node-plugin", "serve", "--inventory", str(h100x8), "--node-name", "n",
                 "--cluster", "memory", "--plugins-dir", str(blocker),
                 "--registry-dir", str(tmp_path / "registry"),
                 "--cdi-dir", str(tmp_path / "cdi")])
    assert code == 1
    err = capsys.readouterr().err
    assert err == (f"error: cannot use {blocker}/gpu.dra-gateway.io/checkpoint.json: Not a "
                   "directory; check --state-dir and --plugins-dir\n")


def test_serve_logs_json_lines_as_the_other_components_do(
        h100x8: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("dra_gateway")
    before = (list(logger.handlers), logger.level, logger.propagate)
    blocker = tmp_path / "plugins"
    blocker.write_text("not a directory\n")
    try:
        main(["node-plugin", "serve", "--inventory", str(h100x8), "--node-name", "n",
              "--cluster", "memory", "--plugins-dir", str(blocker), "--log-level", "DEBUG"])
        (handler,) = [h for h in logger.handlers if isinstance(h.formatter, JsonFormatter)]
        assert logger.level == logging.DEBUG
        record = logging.LogRecord("dra_gateway.node_plugin", logging.INFO, __file__, 1,
                                   "published %d slices", (1,), None)
        assert handler.formatter is not None
        entry = json.loads(handler.formatter.format(record))
        assert (entry["level"], entry["msg"]) == ("info", "published 1 slices")
    finally:
        logger.handlers[:] = before[0]
        logger.setLevel(before[1])
        logger.propagate = before[2]


@pytest.mark.parametrize("interval", ["0", "-1", "soon", "inf"])
def test_a_legacy_poll_interval_that_is_not_a_positive_time_names_the_off_switch(
        h100x8: Path, interval: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["node-plugin", "serve", "--inventory", str(h100x8), "--node-name", "n",
              "--legacy-poll-interval", interval])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --legacy-poll-interval: {interval!r} is not a " in err
    assert err.endswith("; to stop asking the kubelet, use --no-legacy-coexistence\n")


def test_an_admin_check_interval_that_is_not_a_positive_time_is_refused_by_name(
        h100x8: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its message does not send the user to the legacy switch, which has nothing to do
    with it."""
    with pytest.raises(SystemExit) as exited:
        main(["node-plugin", "serve", "--inventory", str(h100x8), "--node-name", "n",
              "--admin-check-seconds", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --admin-check-seconds: '0' is not a positive duration" in err
    assert "to stop asking the kubelet" not in err


def test_serve_asks_the_kubelets_pod_resources_socket_every_two_seconds_by_default(
        h100x8: Path) -> None:
    from dra_gateway.cli import build_parser

    args = build_parser().parse_args(["node-plugin", "serve", "--inventory", str(h100x8),
                                      "--node-name", "n"])
    assert (args.legacy_coexistence, args.pod_resources_socket, args.legacy_poll_interval,
            args.legacy_node_interval) == (
        True, Path("/var/lib/kubelet/pod-resources/kubelet.sock"), 2.0, 30.0)
    faster = build_parser().parse_args(["node-plugin", "serve", "--inventory", str(h100x8),
                                        "--node-name", "n", "--legacy-node-interval", "1.5"])
    assert faster.legacy_node_interval == 1.5
    off = build_parser().parse_args(["node-plugin", "serve", "--inventory", str(h100x8),
                                     "--node-name", "n", "--no-legacy-coexistence"])
    assert off.legacy_coexistence is False
