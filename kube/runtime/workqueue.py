"""A work queue of keys with deduplication and per-key exponential backoff (client-go style).

A key is queued at most once however often it is added; a key being processed is never handed
to a second worker: adding it meanwhile marks it dirty and it is queued again when the first
worker calls `done`. `add_rate_limited` delays a key by `base_delay * 2**failures`, capped at
`max_delay`; `forget` resets its failures after a success. With `order`, keys ready at once
are handed out smallest `order(key)` first, then first come (the allocator serves its pods by
priority); without it, first come. This module knows nothing of Kubernetes or allocation.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)


def _arrival(key: Any) -> int:
    return 0


class WorkQueue(Generic[K]):
    def __init__(self, *, base_delay: float = 0.05, max_delay: float = 60.0,
                 order: Callable[[K], Any] | None = None) -> None:
        if base_delay <= 0 or max_delay < base_delay:
            raise ValueError(f"backoff needs 0 < base_delay <= max_delay, got {base_delay} and "
                             f"{max_delay}")
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._order: Callable[[K], Any] = order or _arrival
        self._arrivals = itertools.count()
        # (order, arrival, key): the smallest order first, then first come.
        self._ready: asyncio.PriorityQueue[tuple[Any, int, K]] = asyncio.PriorityQueue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._closed = False

    def __len__(self) -> int:
        """Keys waiting to be handed out (not those in a delay, nor being processed)."""
        return self._ready.qsize()

    @property
    def delayed(self) -> int:
        return len(self._timers)

    def pending(self) -> set[K]:
        """Every key waiting, delayed or being processed."""
        return set(self._dirty) | self._processing | set(self._timers)

    def add(self, key: K) -> None:
        """Queue `key` now; a delayed add of it still pending is dropped (this one serves it:
        left, it would hand the key out a second time just after)."""
        if self._closed:
            return
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._put(key)

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` after `delay` seconds; an earlier pending delay for it is kept."""
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= due:
                return
            pending[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def add_rate_limited(self, key: K) -> float:
        """Queue `key` after its backoff delay and count one more failure; returns the delay."""
        delay = self.next_delay(key)
        self._failures[key] = self._failures.get(key, 0) + 1
        self.add_after(key, delay)
        return delay

    def next_delay(self, key: K) -> float:
        """The delay the next `add_rate_limited(key)` will use."""
        failures = self._failures.get(key, 0)
        return min(self.max_delay, self.base_delay * 2.0 ** min(failures, 60))

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        """Reset the backoff of `key` (after it was handled successfully)."""
        self._failures.pop(key, None)

    def _put(self, key: K) -> None:
        self._ready.put_nowait((self._order(key), next(self._arrivals), key))

    async def get(self) -> K:
        """The next key to process; call `done(key)` when finished with it."""
        _, _, key = await self._ready.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._closed:
            self._put(key)

    def shutdown(self) -> None:
        """Drop every pending delay; later adds are ignored."""
        self._closed = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)
