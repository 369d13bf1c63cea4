"""The embedded API as kubectl uses it every day: apply (client- and server-side, with its default
strict validation), explain, and get's columns; the gateway's CRDs enforced as the API server
enforces them.

These run the real kubectl, found on PATH or where hack/build-node.sh builds it
(~/.cache/dra-gateway/kube/<version>/kubectl); without one they are skipped, except in CI, where
one must be there. The same requests over plain HTTP (Accept headers, fieldValidation) are
tested beside them, so the behaviour is covered wherever the tests run.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.demo.session import command_name
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import create_app, serve
from dra_gateway.devkit.sim.tables import human_duration
from dra_gateway.kube.resources import GPU_QUOTAS, PODS

ClientFactory = Callable[..., Coroutine[Any, Any, TestClient[Any, Any]]]
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
QUOTAS = "/apis/dra-gateway.io/v1alpha1/namespaces/default/gpuquotas"


# The release whose kubectl CI gives these tests (the oldest supported).
KUBECTL_RELEASE = "1.34.4"
BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "hack" / "build-control-plane.sh"


def _kubectl() -> str | None:
    found = shutil.which("kubectl")
    if found:
        return found
    built = sorted(Path.home().glob(".cache/dra-gateway/kube/*/kubectl"))
    return str(built[-1]) if built else None


@functools.cache
def _kubectl_binary() -> str | None:
    """kubectl; in CI, the oldest release's, which .ci/run may still be building in the
    background when these start: its build script waits for that build (or makes it)."""
    if os.environ.get("CI") != "true":
        return _kubectl()
    built = subprocess.run(["bash", str(BUILD_SCRIPT), "--node", KUBECTL_RELEASE],
                           capture_output=True, text=True, timeout=1700, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    return str(Path(built.stdout.strip().splitlines()[-1]) / "kubectl")


needs_kubectl = pytest.mark.skipif(
    _kubectl() is None and os.environ.get("CI") != "true",
    reason="no kubectl on PATH or in ~/.cache/dra-gateway/kube/ (hack/build-node.sh builds one)")
# In CI kubectl may still be building when the suite is collected: these run after its build
# in the suite's order, and the first may wait for it.
pytestmark = [pytest.mark.needs_build("node", KUBECTL_RELEASE), pytest.mark.timeout(1800)]


def quota(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "dra-gateway.io/v1alpha1", "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}


@pytest.fixture
async def client(aiohttp_client: ClientFactory) -> TestClient[Any, Any]:
    return await aiohttp_client(create_app(MemoryCluster()))


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[MemoryCluster, Path]]:
    cluster = MemoryCluster()
    kubeconfig = tmp_path / "kubeconfig"
    async with serve(cluster, kubeconfig=kubeconfig, admission=False):
        yield cluster, kubeconfig


async def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> tuple[int, str]:
    found = _kubectl_binary()
    assert found is not None, "CI=true: hack/build-control-plane.sh --node provides kubectl"
    process = await asyncio.create_subprocess_exec(
        found, "--kubeconfig", str(kubeconfig), *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "HOME": str(kubeconfig.parent), "KUBECTL_INTERACTIVE_DELETE": ""})
    out, _ = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 50)
    return process.returncode or 0, out.decode()


POD = """apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  containers: [{name: app, image: busybox:1}]
"""


@needs_kubectl
async def test_kubectl_apply_validates_and_patches_client_side_and_server_side(
        served: tuple[MemoryCluster, Path]) -> None:
    cluster, kubeconfig = served
    assert await kubectl(kubeconfig, "apply", "-f", "-", stdin=POD) == (0, "pod/web created\n")
    code, said = await kubectl(kubeconfig, "apply", "-f", "-",
                               stdin=POD.replace("busybox:1", "busybox:2"))
    assert (code, said) == (0, "pod/web configured\n")
    pod = await cluster.get(PODS, "web", namespace="default")
    assert pod["spec"]["containers"][0]["image"] == "busybox:2"
    code, said = await kubectl(kubeconfig, "apply", "--server-side", "-f", "-",
                               stdin=POD.replace("busybox:1", "busybox:3"))
    assert (code, said) == (0, "pod/web serverside-applied\n")
    pod = await cluster.get(PODS, "web", namespace="default")
    assert pod["spec"]["containers"][0]["image"] == "busybox:3"
    code, said = await kubectl(kubeconfig, "apply", "-f", "-",
                               stdin=POD.replace("containers:", "containerz: []\n  containers:"))
    assert code == 1
    assert said.endswith('Pod in version "v1" cannot be handled as a Pod: strict decoding '
                         'error: unknown field "spec.containerz"\n')


@needs_kubectl
async def test_kubectl_explain_describes_built_in_kinds_and_the_gateways_crds(
        served: tuple[MemoryCluster, Path]) -> None:
    _, kubeconfig = served
    code, said = await kubectl(kubeconfig, "explain", "resourceclaims.spec.devices")
    assert code == 0, said
    assert "FIELD: devices <DeviceClaim>" in said
    code, said = await kubectl(kubeconfig, "explain", "gpuquotas.spec.admission")
    assert code == 0, said
    assert "ENUM:\n    Queue\n    Refuse" in said


@needs_kubectl
async def test_kubectl_apply_is_refused_what_the_gpuquota_crd_refuses(
        served: tuple[MemoryCluster, Path]) -> None:
    cluster, kubeconfig = served
    over = ("apiVersion: dra-gateway.io/v1alpha1\nkind: GPUQuota\n"
            "metadata: {name: team-a, namespace: default}\n"
            "spec: {hard: {cores: 50}, min: {cores: 100}, cohort: research}\n")
    code, said = await kubectl(kubeconfig, "apply", "-f", "-", stdin=over)
    assert (code, said) == (1, 'The GPUQuota "team-a" is invalid: spec.min.cores: Invalid '
                               'value: "object": min.cores must be at most hard.cores, which '
                               "it needs: the guarantee is at most the ceiling borrowing "
                               "stops at\n")
    misspelt = over.replace("min: {cores: 100}, cohort", "cohrt")
    code, said = await kubectl(kubeconfig, "apply", "-f", "-", stdin=misspelt)
    assert code == 1
    assert said.endswith('GPUQuota in version "v1alpha1" cannot be handled as a GPUQuota: '
                         'strict decoding error: unknown field "spec.cohrt"\n')
    assert (await cluster.list(GPU_QUOTAS)).items == []


@needs_kubectl
async def test_kubectl_get_prints_upstreams_columns(served: tuple[MemoryCluster, Path]) -> None:
    cluster, kubeconfig = served
    await cluster.create(PODS, {"metadata": {"name": "gated", "namespace": "default"}, "spec": {
        "containers": [{"name": "app", "image": "x"}],
        "schedulingGates": [{"name": "dra-gateway.io/allocation"}]}})
    await cluster.create(GPU_QUOTAS, quota("team-a", hard={"memory": "8Gi", "cores": 50},
                                           cohort="research", min={"cores": 20}))
    code, said = await kubectl(kubeconfig, "get", "pods", "-o", "wide")
    assert code == 0, said
    header, row = said.splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE",
                              "NOMINATED", "NODE", "READINESS", "GATES"]
    assert row.split()[:4] == ["gated", "0/1", "SchedulingGated", "0"]
    assert row.split()[5:] == ["<none>"] * 4
    code, said = await kubectl(kubeconfig, "get", "gq")
    assert code == 0, said
    header, row = said.splitlines()
    assert header.split() == ["NAME", "MEMORY-USED", "MEMORY-HARD", "CORES-USED", "CORES-HARD",
                              "DEVICES", "COHORT", "DEVICES-BORROWED", "AGE"]
    assert row.split()[:4] == ["team-a", "8Gi", "50", "research"]  # nil cells print blank


async def test_a_table_request_gets_upstreams_pod_columns_and_cells(
        client: TestClient[Any, Any]) -> None:
    await client.post("/api/v1/namespaces/default/pods", json={
        "metadata": {"name": "gated"}, "spec": {
            "containers": [{"name": "app", "image": "x"}],
            "schedulingGates": [{"name": "dra-gateway.io/allocation"}]}})
    got = await client.get("/api/v1/namespaces/default/pods", headers={"Accept": TABLE})
    table = await got.json()
    assert table["kind"] == "Table"
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == [
        ("Name", 0), ("Ready", 0), ("Status", 0), ("Restarts", 0), ("Age", 0), ("IP", 1),
        ("Node", 1), ("Nominated Node", 1), ("Readiness Gates", 1)]
    [row] = table["rows"]
    assert row["cells"][:4] == ["gated", "0/1", "SchedulingGated", "0"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "gated"


async def test_a_claims_state_column_reads_as_upstreams(client: TestClient[Any, Any]) -> None:
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    await client.post(claims, json={"metadata": {"name": "c"}, "spec": {"devices": {}}})
    got = await client.get(f"{claims}/c", headers={"Accept": TABLE})
    table = await got.json()
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "State", "Age"]
    assert table["rows"][0]["cells"][:2] == ["c", "pending"]
    await client.patch(f"{claims}/c/status", json={"status": {
        "allocation": {"devices": {"results": []}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}},
        headers={"Content-Type": "application/merge-patch+json"})
    table = await (await client.get(claims, headers={"Accept": TABLE})).json()
    assert table["rows"][0]["cells"][:2] == ["c", "allocated,reserved"]


async def test_gpuquota_rows_evaluate_the_crds_printer_columns(
        client: TestClient[Any, Any]) -> None:
    made = await client.post(QUOTAS, json=quota("q", hard={"memory": "8Gi", "cores": 50}))
    assert made.status == 201
    assert (await made.json())["spec"]["admission"] == "Queue"  # the CRD's default
    table = await (await client.get(QUOTAS, headers={"Accept": TABLE})).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == ["Name", "Memory-Used", "Memory-Hard", "Cores-Used", "Cores-Hard",
                     "Devices", "Cohort", "Devices-Borrowed", "Memory-Borrowed", "Admission",
                     "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:-1] == ["q", None, "8Gi", None, 50, None, None, None, None, "Queue"]


async def test_the_gpuquota_crd_refuses_what_the_api_server_refuses(
        client: TestClient[Any, Any]) -> None:
    over = await client.post(QUOTAS, json=quota(
        "over", hard={"memory": "8Gi"}, min={"memory": "16Gi"}, cohort="c"))
    assert over.status == 422
    assert (await over.json())["message"] == (
        'GPUQuota.dra-gateway.io "over" is invalid: spec.min.memory: Invalid value: "object": '
        "min.memory must be at most hard.memory, which it needs: the guarantee is at most the "
        "ceiling borrowing stops at")
    enum = await client.post(QUOTAS, json=quota("e", hard={"cores": -1}, admission="Later"))
    assert (await enum.json())["message"] == (
        'GPUQuota.dra-gateway.io "e" is invalid: [spec.hard.cores: Invalid value: -1: '
        "spec.hard.cores in body should be greater than or equal to 0, spec.admission: "
        'Unsupported value: "Later": supported values: "Queue", "Refuse"]')
    strict = await client.post(QUOTAS, params={"fieldValidation": "Strict"},
                               json=quota("s", hard={"cores": 1}, cohrt="c"))
    assert strict.status == 400
    assert (await strict.json())["message"] == (
        'GPUQuota in version "v1alpha1" cannot be handled as a GPUQuota: strict decoding '
        'error: unknown field "spec.cohrt"')
    warned = await client.post(QUOTAS, params={"fieldValidation": "Warn"},
                               json=quota("w", hard={"cores": 1}, cohrt="c"))
    assert warned.status == 201
    assert warned.headers.getall("Warning") == ['299 - "unknown field \\"spec.cohrt\\""']
    assert "cohrt" not in (await warned.json())["spec"]  # pruned, as the schema says
    patched = await client.patch(f"{QUOTAS}/w", json={"spec": {"min": {"cores": 2}}},
                                 headers={"Content-Type": "application/merge-patch+json"})
    assert patched.status == 422  # min without cohort, and over hard: CEL on patches too


async def test_openapi_v3_names_each_group_versions_document(
        client: TestClient[Any, Any]) -> None:
    index = await (await client.get("/openapi/v3")).json()
    url = index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"]
    doc = await (await client.get(url)).json()
    claims = doc["paths"]["/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/"
                          "{name}"]
    assert claims["patch"]["x-kubernetes-group-version-kind"] == {
        "group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
    assert "fieldValidation" in [p["name"] for p in claims["patch"]["parameters"]]
    assert "io.k8s.api.resource.v1.ResourceClaim" in doc["components"]["schemas"]


def test_ages_read_as_kubectl_prints_them() -> None:
    assert [human_duration(s) for s in (5, 119, 125, 600, 3 * 3600 + 60, 9 * 3600,
                                         50 * 3600, 400 * 86400)] == [
        "5s", "119s", "2m5s", "10m", "3h1m", "9h", "2d2h", "400d"]


def test_the_banner_names_the_venvs_script_when_path_does_not_find_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "dra-gateway").write_text("#!/bin/sh\n")
    (bin_dir / "dra-gateway").chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    python = str(bin_dir / "python")
    assert command_name(executable=python, cwd=tmp_path) == ".venv/bin/dra-gateway"
    assert command_name(executable=python, cwd=tmp_path / "elsewhere") == str(
        bin_dir.resolve() / "dra-gateway")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert command_name(executable=python, cwd=tmp_path) == "dra-gateway"
