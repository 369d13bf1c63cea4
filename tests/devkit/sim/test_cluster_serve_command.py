"""`dra-gateway cluster serve`: seeds, writes a kubeconfig, serves, stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.resources import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
)

SEED = """\
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: List
items:
- apiVersion: resource.k8s.io/v1
  kind: DeviceClass
  metadata: {name: gpu.dra-gateway.io}
  spec: {}
"""


async def test_serve_seeds_writes_a_kubeconfig_and_stops_on_sigterm(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text(SEED)
    kubeconfig = tmp_path / "kubeconfig"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dra_gateway", "cluster", "serve", "--listen", "127.0.0.1:0",
        "--kubeconfig", str(kubeconfig), "--seed", str(seed),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(20):
            banner = (await process.stdout.readline()).decode()
        assert banner.startswith("serving the Kubernetes API on http://127.0.0.1:")
        assert "2 objects seeded" in banner
        cluster = await connect("kube", str(kubeconfig))
        try:
            node = await cluster.get(NODES, "node-a")
            assert node["metadata"]["uid"]
            classes = await cluster.list(DEVICE_CLASSES)
            assert [c["metadata"]["name"] for c in classes.items] == ["gpu.dra-gateway.io"]
            # The embedded control plane turns the pod's template into its claim.
            await cluster.create(RESOURCE_CLAIM_TEMPLATES, {
                "metadata": {"name": "one-gpu", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "gpu.dra-gateway.io"}}]}}}})
            await cluster.create(PODS, {
                "metadata": {"name": "web-0", "namespace": "default"},
                "spec": {"containers": [{"name": "main", "image": "busybox"}],
                         "resourceClaims": [{"name": "gpu",
                                             "resourceClaimTemplateName": "one-gpu"}]}})
            claims = cluster.watch(RESOURCE_CLAIMS, namespace="default")
            async with asyncio.timeout(10), contextlib.aclosing(claims) as events:  # type: ignore[type-var]
                first = await anext(events)
            assert first.object["metadata"]["name"].startswith("web-0-gpu-")
        finally:
            await cluster.close()
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await process.wait()
        assert code == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_bad_seed_file_is_refused_naming_the_document(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\n"
                    "apiVersion: v1\nkind: Gadget\nmetadata: {name: b}\n")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dra_gateway", "cluster", "serve",
        "--kubeconfig", str(tmp_path / "kc"), "--seed", str(seed),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(20):
        _, err = await process.communicate()
    assert process.returncode == 2
    assert err.decode().strip() == (
        f"error: {seed} (document 2): v1 Gadget is not a resource type the project serves")


async def test_the_cluster_benchmark_runs_both_backends_on_one_workload() -> None:
    from dra_gateway.devkit.sim.bench import compare, report

    direct, over_http = await compare(claims=20, concurrency=4)
    assert (direct.events, over_http.events) == (40, 40)
    assert "ratio" in report(direct, over_http)
