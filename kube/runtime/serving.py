"""A component's small HTTP endpoint: `/metrics` (Prometheus), `/healthz` and `/readyz`.

The allocator and the node plugin serve it when given `--metrics-address`. It reports; it never
changes what the component does. `/healthz` answers while the process's loop runs. `/readyz` is
ready once the process runs (for the allocator, a standby replica is as ready as the leader, since
only the Lease decides which one works), unless the component gives a readiness check: the node
plugin is ready once the kubelet registered it and its slices are published, which is what a
DaemonSet's rolling update waits for before it stops the old pod.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web

Render = Callable[[], bytes]
# Why the component is not ready yet; "" when it is.
Readiness = Callable[[], str]
_RENDER: web.AppKey[Render] = web.AppKey("render")
_READINESS: web.AppKey[Readiness] = web.AppKey("readiness")


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[_RENDER]()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _ready(request: web.Request) -> web.Response:
    why_not = request.app[_READINESS]()
    if why_not:
        return web.Response(status=503, text=f"not ready: {why_not}\n")
    return web.Response(text="ok")


def create_app(render: Render, readiness: Readiness | None = None) -> web.Application:
    """`render` gives the metrics in Prometheus' text format; `readiness`, if given, why the
    component is not ready yet ("" when it is)."""
    app = web.Application()
    app[_RENDER] = render
    app[_READINESS] = readiness or (lambda: "")
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _ok)
    app.router.add_get("/readyz", _ready)
    return app


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `:PORT` (all interfaces); ValueError naming the fix otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--metrics-address {address!r}: use HOST:PORT or :PORT, e.g. :8080")
    # `:PORT` means every interface: in a pod that is the pod's own IP, which probes use.
    return host.strip("[]") or "0.0.0.0", int(port)


@contextlib.asynccontextmanager
async def serving(render: Render, address: str, readiness: Readiness | None = None
                  ) -> AsyncIterator[int]:
    """Serve until the block exits; yields the bound port."""
    host, port = parse_address(address)
    runner = web.AppRunner(create_app(render, readiness), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
