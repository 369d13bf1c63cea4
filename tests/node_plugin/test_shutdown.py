"""A node plugin ends when it is cancelled, whatever it was doing at that moment.

Its loops wait for a wake-up or a timeout; a cancellation that arrives just as the wake-up does
must still end them (on Python 3.11 `asyncio.wait_for` returns the result instead, and the
plugin's shutdown then waits for a loop that never ends). Each case cancels 0 to 4 loop steps
after the wake-up, which covers the moment the wake-up has finished and the waiter has not run.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.plugin import NodePlugin
from dra_gateway.node_plugin.proto import dra_health_v1_pb2
from dra_gateway.node_plugin.server import DeviceHealthState, HealthFeed

from .conftest import plugin_settings

STEPS = range(5)


async def _ends_when_cancelled(task: asyncio.Task[None]) -> bool:
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=3)
    if not done:  # the bug: let the test end anyway
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return bool(done)


@pytest.mark.parametrize("steps", STEPS)
async def test_a_health_stream_woken_as_it_is_cancelled_ends(steps: int) -> None:
    feed = HealthFeed(lambda: [DeviceHealthState("node", "gpu-0", healthy=True)],
                      resend_seconds=60.0, first_resend_seconds=60.0)

    async def kubelet() -> None:
        async for _ in feed.stream(dra_health_v1_pb2):
            pass

    task = asyncio.create_task(kubelet())
    await asyncio.sleep(0.05)
    feed.changed()
    for _ in range(steps):
        await asyncio.sleep(0)
    assert await _ends_when_cancelled(task)


@pytest.mark.parametrize("steps", STEPS)
async def test_a_plugin_cancelled_as_a_device_fails_ends(
        root: Path, cluster: MemoryCluster, h100x8: Path, steps: int) -> None:
    """A fault wakes the writer of the Node's condition and the reader of its annotations."""
    plugin = NodePlugin(plugin_settings(root), cluster, discover=lambda: load_inventory(h100x8))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.1)
    plugin.health.mark(["gpu-3"], "xid-79")
    for _ in range(steps):
        await asyncio.sleep(0)
    assert await _ends_when_cancelled(task)
