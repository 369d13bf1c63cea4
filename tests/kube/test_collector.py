"""The collector's settling: what lives is frozen as it settles, thawed and collected fully now
and then, and nothing stays frozen once the task ends."""

from __future__ import annotations

import asyncio
import gc
import weakref


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


async def test_what_lives_is_frozen_and_full_collections_free_cycles_frozen_before() -> None:
    from dra_gateway.kube.runtime.collector import keep_settled

    gc.unfreeze()
    task = asyncio.create_task(keep_settled(interval=0.05, full_every=0.3))
    try:
        await asyncio.sleep(0.12)
        assert gc.get_freeze_count() > 0
        node = _Node()
        gone = weakref.ref(node)
        await asyncio.sleep(0.1)  # frozen while still referenced
        del node
        gc.collect()
        assert gone() is not None  # frozen: an ordinary collection cannot free it
        for _ in range(100):  # a full collection thaws and collects within full_every
            if gone() is None:
                break
            await asyncio.sleep(0.05)
        assert gone() is None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert gc.get_freeze_count() == 0
