"""Test habits for the whole suite.

- No test reaches a network beyond loopback or unix sockets: any other connect fails loudly.
  The one exception is the veth pair the real-node tier makes between this machine and its
  node's network namespace (`dra_gateway.devkit.realnode.NODE_LINK`), which never leaves it.
- No async test may leave asyncio tasks behind: leaked background work is a bug.
Warnings are errors and each test has a timeout (pyproject.toml).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_gateway.devkit.realnode import NODE_LINK

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_local(address: Any) -> bool:
    if isinstance(address, (str, bytes)):  # unix socket path
        return True
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip in ipaddress.ip_network(NODE_LINK)


def _guarded_connect(self: socket.socket, address: Any) -> None:
    if not _is_local(address):
        raise AssertionError(f"test tried to reach {address!r}: only loopback is allowed")
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    if not _is_local(address):
        raise AssertionError(f"test tried to reach {address!r}: only loopback is allowed")
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def _loopback_only() -> Iterator[None]:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]


@pytest.fixture(autouse=True)
async def _no_leftover_tasks() -> AsyncIterator[None]:
    """Fails a test that leaves tasks running on its loop after its own fixtures are gone."""
    yield
    current = asyncio.current_task()
    # Give cancelled tasks one turn to finish unwinding before judging them.
    await asyncio.sleep(0)
    leftover = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if leftover:
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        names = ", ".join(sorted(t.get_name() + ":" + repr(t.get_coro()) for t in leftover))
        pytest.fail(f"test left {len(leftover)} asyncio task(s) running: {names}")


@pytest.fixture(scope="session")
def gateway_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The gateway's image (hack/build-image.sh), built once a session for the tiers that run
    it on a real node: its OCI archive and its name."""
    from realnode.support import build_image

    return build_image(tmp_path_factory.mktemp("image"))


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """The real-node tiers run first (the node plugin's, then the chart's): the e2e tier's
    control plane is session-scoped and would otherwise still be running beside the real node's
    (two cores share both), and one real node runs on a machine at a time, so each package's
    node is gone before the next package starts its own."""
    def tier(item: Any) -> int:
        path = str(item.fspath).replace("\\", "/")
        return 0 if "tests/realnode/" in path else 1 if "tests/realchart/" in path else 2

    items.sort(key=tier)
