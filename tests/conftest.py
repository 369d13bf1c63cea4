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


# The builds the cluster tiers need, in the order .ci/run makes them in the background while the
# suite runs (tests/test_ci_order.py holds the two together): ("control-plane", version) is
# hack/build-control-plane.sh, ("node", version) hack/build-node.sh, which builds that release's
# control plane too. Oldest and newest first: they carry the most tests.
BUILD_ORDER: tuple[tuple[str, str], ...] = (
    ("control-plane", "1.34.4"),
    ("node", "1.34.4"),
    ("control-plane", "1.38.0-beta.0"),
    ("node", "1.37.2"),
    ("control-plane", "1.35.4"),
    ("control-plane", "1.36.3"),
)


def _ready_at(kind: str, version: str | None) -> int:
    """The position in BUILD_ORDER after which `kind` of `version` (any, when None) exists."""
    for position, (built, built_version) in enumerate(BUILD_ORDER):
        same = version is None or built_version == version
        if same and (built == kind or (kind == "control-plane" and built == "node")):
            return position
    return len(BUILD_ORDER)


def _needs(item: Any) -> int:
    """The position of the last build `item` waits for; -1 for a test that needs none."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    needed = [_ready_at(*marker.args) for marker in item.iter_markers("needs_build")]
    if "gateway" in params:
        needed.append(_ready_at("control-plane", params["gateway"][1]))
    for name in ("cluster", "chart"):
        if name in params:
            _setup, plane, kubelet = params[name]
            needed += [_ready_at("control-plane", plane), _ready_at("node", kubelet)]
    return max(needed, default=-1)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Each test runs once what it needs is built: first the tests that need no cluster, then
    each cluster tier right after its build (BUILD_ORDER), so that on a cold machine the tests
    run while .ci/run builds the next release. The sort is stable: pytest's grouping of a
    parametrized setup stays, and each setup is made once. Every cluster's fixture is scoped
    to its package: a package's control plane or real node is gone before the next package's
    starts (two cores share them, and one real node runs on a machine at a time)."""
    items.sort(key=_needs)
