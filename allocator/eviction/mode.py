"""What every eviction mode of the leader stands on (`EvictionMode`): the preemption, defrag and
drain modes are built alike by the controller and run alike, in rounds (`evict.run_rounds`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import UTC, datetime

from dra_gateway.allocator.eviction.evict import Evictions, run_rounds
from dra_gateway.allocator.eviction.inputs import Snapshot
from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.allocator.work import Fence
from dra_gateway.kube.cluster.port import Cluster


class EvictionMode(ABC):
    """One mode: the cluster (through the port), the allocator's settings, the mirrors' view
    (`snapshot`), the metrics, the leader's fence (every write checks it), a clock, and the
    carry-out path of its evictions (`evictions`).

    A subclass names itself (`name`, in the logs), says how often it looks (`interval`) and
    how far a fruitless round pushes the next (`max_backoff`, in intervals), and does one round
    (`one_round`: whether it found nothing to do, so the next waits longer)."""

    name: str
    max_backoff: int = 1

    def __init__(self, cluster: Cluster, settings: ControllerSettings, *,
                 snapshot: Callable[[], Snapshot], metrics: Metrics, fence: Fence,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.cluster = cluster
        self.settings = settings
        self.snapshot = snapshot
        self.metrics = metrics
        self.fence = fence
        self.clock = clock or (lambda: datetime.now(UTC))
        self.evictions = Evictions(cluster, clock=self.clock, instance=settings.identity,
                                   fence=fence)

    @property
    @abstractmethod
    def interval(self) -> float:
        """Seconds between rounds."""

    @abstractmethod
    async def one_round(self) -> bool:
        """One round; True when it found nothing to do."""

    async def run(self) -> None:
        """Rounds until cancelled or leadership is lost."""
        await run_rounds(self.name, self.one_round, interval=self.interval,
                         max_backoff=self.max_backoff)


__all__ = ["EvictionMode"]
