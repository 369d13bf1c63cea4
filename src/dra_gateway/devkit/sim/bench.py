"""`dra-gateway bench cluster`: what the HTTP hop costs, measured side by side in one run.

The same claim workload (create, get, status patch with an allocation, watch delivery) runs on
the in-memory cluster directly and through kubernetes-asyncio against it served on loopback.
The report is the throughput of each and their ratio; absolute numbers depend on the machine,
the ratio says how much the embedded API adds to what components pay in production. It must
not be used as a pass/fail gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.kube.resources import RESOURCE_CLAIMS

NAMESPACE = "bench"


@dataclass(frozen=True, slots=True)
class Result:
    backend: str
    claims: int
    seconds: float
    events: int

    @property
    def operations_per_second(self) -> float:
        return self.claims * 3 / self.seconds if self.seconds else 0.0


def _claim(i: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{i:06}", "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}}


def _allocation(i: int) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.dra-gateway.io", "pool": f"node-{i % 64}",
         "device": f"gpu-{i % 8}"}]}}}}


async def run_workload(cluster: Cluster, backend: str, claims: int,
                       concurrency: int) -> Result:
    """Create, get and allocate `claims` claims with `concurrency` workers, watching them all."""
    start_rv = (await cluster.list(RESOURCE_CLAIMS, namespace=NAMESPACE)).resource_version
    expected = claims * 2  # ADDED and MODIFIED per claim
    seen = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal seen
        async with contextlib.aclosing(cluster.watch(  # type: ignore[type-var]
                RESOURCE_CLAIMS, namespace=NAMESPACE, resource_version=start_rv)) as events:
            async for _ in events:
                seen += 1
                if seen >= expected:
                    done.set()
                    return

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(claims):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await cluster.create(RESOURCE_CLAIMS, _claim(i), namespace=NAMESPACE)
            await cluster.get(RESOURCE_CLAIMS, f"claim-{i:06}", namespace=NAMESPACE)
            await cluster.patch(RESOURCE_CLAIMS, f"claim-{i:06}", _allocation(i),
                                namespace=NAMESPACE, subresource="status")

    watcher = asyncio.create_task(watch())
    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    async with asyncio.timeout(60):
        await done.wait()
    elapsed = time.perf_counter() - began
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    return Result(backend, claims, elapsed, seen)


async def compare(claims: int, concurrency: int) -> tuple[Result, Result]:
    """The workload on the in-memory cluster, then through kubernetes-asyncio over loopback."""
    direct = await run_workload(MemoryCluster(), "memory", claims, concurrency)
    served = MemoryCluster()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        async with serve(served, kubeconfig=kubeconfig):
            cluster = await connect("kube", str(kubeconfig))
            try:
                over_http = await run_workload(cluster, "kubernetes-asyncio over loopback",
                                               claims, concurrency)
            finally:
                await cluster.close()
                await served.close()
    return direct, over_http


def report(direct: Result, over_http: Result) -> str:
    lines = [f"{r.backend:>34}: {r.claims} claims x 3 requests in {r.seconds:.2f} s = "
             f"{r.operations_per_second:,.0f} requests/s, {r.events} watch events"
             for r in (direct, over_http)]
    ratio = direct.operations_per_second / max(over_http.operations_per_second, 1e-9)
    lines.append(f"{'ratio':>34}: the HTTP hop is {ratio:.1f}x slower than the in-memory call")
    return "\n".join(lines)


def main(claims: int, concurrency: int) -> int:
    direct, over_http = asyncio.run(compare(claims, concurrency))
    print(report(direct, over_http))
    return 0
