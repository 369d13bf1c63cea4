"""The units of the allocator controller's work: queue keys, sync results, write bookkeeping.

A pod is queued by namespace, name and uid (a recreated pod is other work); a claim by namespace
and name. Each sync answers a `SyncResult` that tells the worker what to do with the key. This
module holds these small value types only: it must not take decisions or talk to the API.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dra_gateway.kube.cluster.port import Object

# Optimistic writes that keep conflicting give up after this many tries; the worker requeues.
MAX_WRITE_ATTEMPTS = 8

SyncResult = Literal["done", "retry", "wait"]
"""done: forget the key; retry: requeue it after its backoff; wait: an event will requeue it."""

Write = tuple[str, Object]
"""(resourceVersion the write was based on, the object the API returned)."""

Fence = Callable[[], None]
"""Called right before each write; raises (leader.LeadershipLost) when this replica may no
longer write. The default lets every write through (a single replica, tests)."""


def unfenced() -> None:
    """The fence of a replica that does not campaign: every write may go."""


@dataclass(frozen=True, slots=True)
class PodKey:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClaimKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


WorkKey = PodKey | ClaimKey

__all__ = [
    "MAX_WRITE_ATTEMPTS",
    "ClaimKey",
    "Fence",
    "PodKey",
    "SyncResult",
    "WorkKey",
    "Write",
    "unfenced",
]
