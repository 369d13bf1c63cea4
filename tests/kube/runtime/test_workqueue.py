"""The work queue: one delivery per key however often it is added, backoff per key."""

from __future__ import annotations

import asyncio

import pytest

from dra_gateway.kube.runtime.workqueue import WorkQueue


async def test_a_key_added_twice_is_handed_out_once() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    queue.add("a")
    queue.add("b")
    assert len(queue) == 2
    assert await queue.get() == "a"
    assert await queue.get() == "b"
    assert len(queue) == 0


async def test_a_key_added_while_processing_comes_back_after_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")
    assert len(queue) == 0  # never to a second worker while the first holds it
    queue.done(key)
    assert len(queue) == 1
    assert await queue.get() == "a"


async def test_backoff_doubles_per_failure_up_to_the_cap_and_forget_resets_it() -> None:
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [queue.add_rate_limited("a") for _ in range(5)]
    assert delays == [0.01, 0.02, 0.04, 0.04, 0.04]
    assert queue.failures("a") == 5
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 0.01
    queue.shutdown()


async def test_a_delayed_key_arrives_after_its_delay_and_the_earliest_delay_wins() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 10.0)
    queue.add_after("a", 0.01)
    assert queue.delayed == 1
    assert await asyncio.wait_for(queue.get(), 1.0) == "a"
    assert queue.delayed == 0


async def test_shutdown_drops_pending_delays_and_ignores_later_adds() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 0.01)
    queue.shutdown()
    queue.add("b")
    await asyncio.sleep(0.03)
    assert len(queue) == 0


def test_backoff_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="base_delay <= max_delay"):
        WorkQueue(base_delay=2.0, max_delay=1.0)


async def test_an_add_supersedes_the_keys_pending_delayed_add() -> None:
    # A backoff timer due just after an event queued the key would hand it out twice in a row.
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", 0.02)
    queue.add("a")
    assert queue.delayed == 0
    assert await queue.get() == "a"
    queue.done("a")
    await asyncio.sleep(0.05)
    assert len(queue) == 0


async def test_an_order_hands_out_the_smallest_first_then_first_come() -> None:
    ranks = {"low-1": 5, "low-2": 5, "high": 0, "mid": 3}
    queue: WorkQueue[str] = WorkQueue(order=ranks.__getitem__)
    for key in ("low-1", "low-2", "mid", "high"):
        queue.add(key)
    got = [await queue.get() for _ in range(4)]
    assert got == ["high", "mid", "low-1", "low-2"]
    # A key added again while processed is ranked again when it is handed back.
    queue.add("low-1")
    queue.add("high")
    queue.done("low-1")
    queue.done("high")
    assert [await queue.get(), await queue.get()] == ["high", "low-1"]
