"""`cluster serve --policies`: the example GPU policies served by the embedded API, and read back
by `dra-gateway report` through a kubeconfig."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

from testkit import EXAMPLES

from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.resources import GPU_QUOTAS, GPU_SHARING_POLICIES


async def _serve(tmp_path: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dra_gateway", "cluster", "serve", "--listen", "127.0.0.1:0",
        "--kubeconfig", str(tmp_path / "kubeconfig"), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def test_serve_loads_policies_and_report_reads_them(tmp_path: Path) -> None:
    process = await _serve(tmp_path, "--policies", str(EXAMPLES / "policies" / "quotas.yaml"),
                           "--policies", str(EXAMPLES / "policies" / "sharing.yaml"))
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            banner = (await process.stdout.readline()).decode()
        assert "8 objects seeded" in banner
        cluster = await connect("kube", str(tmp_path / "kubeconfig"))
        try:
            quotas = await cluster.list(GPU_QUOTAS, namespace="team-a")
            assert sorted(q["metadata"]["name"] for q in quotas.items) == ["team-a-gpu",
                                                                           "team-a-h100"]
            sharing = await cluster.list(GPU_SHARING_POLICIES)
            assert sorted(p["metadata"]["name"] for p in sharing.items) == [
                "hardware-isolation", "production-exclusive", "research-teams"]
        finally:
            await cluster.close()
        report = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dra_gateway", "report", "-o", "json",
            "--kubeconfig", str(tmp_path / "kubeconfig"), stdout=asyncio.subprocess.PIPE)
        async with asyncio.timeout(30):
            out, _ = await report.communicate()
        assert report.returncode == 0
        shown = json.loads(out)
        assert {(q["namespace"], q["name"]): q["used"] for q in shown["quotas"]} == {
            ("course-ml101", "students"): {"memory": "0", "devices": 0},
            ("team-a", "team-a-gpu"): {"memory": "0", "cores": 0, "claims": 0},
            ("team-a", "team-a-h100"): {"devices": 0},
            ("research-speech", "gpus"): {"devices": 0},
            ("research-vision", "gpus"): {"devices": 0}}
        # The report reads the example cohort: each guarantees four cards, lends nothing yet.
        (cohort,) = shown["cohorts"]
        assert cohort["name"] == "research"
        assert cohort["guaranteed"] == {"devices": 8}
        assert [(q["namespace"], q["lent"]) for q in cohort["members"]] == [
            ("research-speech", {"devices": 0}), ("research-vision", {"devices": 0})]
        assert shown["preemptions"] == []
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_serve_refuses_other_kinds_given_as_policies(tmp_path: Path) -> None:
    process = await _serve(tmp_path, "--policies", str(EXAMPLES / "pods" / "hami.yaml"))
    async with asyncio.timeout(20):
        _, err = await process.communicate()
    assert process.returncode == 2
    assert "--policies takes GPUQuota and GPUSharingPolicy objects, got Pod llm-serve" in \
        err.decode()
