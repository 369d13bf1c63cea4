"""The `dra-gateway allocator` process: JSON logs, metrics endpoint, graceful stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import aiohttp
import pytest

from dra_gateway.kube.runtime.serving import parse_address


async def test_the_process_serves_metrics_and_stops_cleanly_on_sigterm() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from dra_gateway.cli import main; sys.exit(main())",
        "allocator", "--cluster", "memory",
        "--identity", "proc-test", "--metrics-address", "127.0.0.1:0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    logs: list[dict[str, Any]] = []
    try:
        async with asyncio.timeout(30):
            port = None
            while port is None:
                line = await process.stderr.readline()
                assert line, f"the allocator exited early: {logs}"
                entry = json.loads(line)  # every line is one JSON object
                logs.append(entry)
                if entry["msg"] == "serving metrics":
                    port = entry["port"]
            while not any(e["msg"] == "caches synced" for e in logs):
                logs.append(json.loads(await process.stderr.readline()))
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                    text = await response.text()
                async with session.get(f"http://127.0.0.1:{port}/healthz") as health:
                    assert health.status == 200
            assert "dra_gateway_allocator_consumable_capacity 1.0" in text
            assert "dra_gateway_allocator_leader 1.0" in text
            process.send_signal(signal.SIGTERM)
            rest = await process.stderr.read()
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    messages = [e["msg"] for e in logs] + [json.loads(line)["msg"]
                                           for line in rest.decode().splitlines()]
    assert "became the leader" in messages
    assert messages[-2:] == ["released the lease", "allocator stopped"]


def test_a_metrics_address_is_host_and_port() -> None:
    assert parse_address(":8080") == ("0.0.0.0", 8080)
    assert parse_address("127.0.0.1:9") == ("127.0.0.1", 9)
    assert parse_address("[::1]:9") == ("::1", 9)
    for bad in ("8080", "host:", "host:http", ":70000"):
        with pytest.raises(ValueError, match="use HOST:PORT or :PORT"):
            parse_address(bad)


def test_the_allocator_handles_sixteen_pods_at_once_unless_told_otherwise(
        capsys: pytest.CaptureFixture[str]) -> None:
    from dra_gateway.allocator.settings import ControllerSettings
    from dra_gateway.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["allocator"]).workers == ControllerSettings().workers == 16
    assert parser.parse_args(["allocator", "--workers", "4"]).workers == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["allocator", "--workers", "0"])
    assert "argument --workers: '0' is not a whole number of at least 1" in capsys.readouterr().err
