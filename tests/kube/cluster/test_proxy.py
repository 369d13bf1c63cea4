"""The adapter on a real API honours the environment's proxy for the API server as the official
client does (HTTP(S)_PROXY, NO_PROXY), reading it once rather than on every request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve, write_kubeconfig
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.resources import NAMESPACES

_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY",
                    "no_proxy", "ALL_PROXY", "all_proxy")


class TunnelProxy:
    """An HTTP proxy (CONNECT tunnels, and requests in absolute form) that records where each
    connection went."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.url = ""

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        method, target = request.decode().split(" ", 2)[:2]
        if method != "CONNECT":  # plain HTTP: the request names the whole URL
            target = urlsplit(target).netloc
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:  # one request a connection: each request shows which way it went
            upstream_writer.write(request[:-2] + b"Connection: close\r\n\r\n")

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TunnelProxy]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        async with server:
            yield self
            server.close()


@pytest.fixture
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


async def _list_twice(tmp_path: Path, env: pytest.MonkeyPatch,
                     no_proxy: str | None) -> tuple[str, list[str]]:
    """List namespaces twice through the adapter with HTTP_PROXY naming a proxy (and NO_PROXY
    when given), HTTP_PROXY unset between the two; the API's host:port and where the proxy's
    connections went."""
    async with serve(MemoryCluster(), token="t") as server, TunnelProxy().running() as proxy:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url, token="t")
        env.setenv("HTTP_PROXY", proxy.url)  # the simulator serves HTTP
        if no_proxy is not None:
            env.setenv("NO_PROXY", no_proxy)
        cluster = await connect("kube", str(kubeconfig))
        try:
            await cluster.list(NAMESPACES)
            env.delenv("HTTP_PROXY")
            await cluster.list(NAMESPACES)
        finally:
            await cluster.close()
    return server.url.removeprefix("http://"), proxy.tunnels


async def test_requests_go_through_the_environments_proxy_read_once(
        tmp_path: Path, no_proxy_environment: pytest.MonkeyPatch) -> None:
    api, tunnels = await _list_twice(tmp_path, no_proxy_environment, None)
    assert tunnels == [api, api]  # read once: the second request still goes through it


async def test_no_proxy_sends_requests_straight_to_the_api_server(
        tmp_path: Path, no_proxy_environment: pytest.MonkeyPatch) -> None:
    _, tunnels = await _list_twice(tmp_path, no_proxy_environment, "127.0.0.1")
    assert tunnels == []
