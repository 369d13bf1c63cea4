"""The cluster's time, for commands run on an operator's machine.

A command such as `dra-gateway devices clear` or `defrag apply` writes times the node plugins and
the allocator compare with their own clocks, which the cluster keeps in step; a laptop ten
minutes ahead would otherwise clear every fault of the next ten minutes. The API server says its
time in the `Date` header of every answer (`Cluster.server_time`), to the second only, so one
read bounds the API server's offset from this machine's clock: the server's second began before
the answer arrived and ended after the request left. `ClusterClock` keeps those bounds and gives
this machine's clock moved by them, to the microsecond, for as long as the command runs.

Rejected: a server-set timestamp read back from a write (`metadata.managedFields[].time`,
`creationTimestamp`) is also to the second, and needs a write, and rights to make it, that a
read does not. This module reads the time once; it must not write anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from dra_gateway.kube.cluster.port import Cluster

_SECOND = timedelta(seconds=1)


def _local() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ClusterClock:
    """The API server's clock, as this machine's clock plus an offset known within bounds."""

    earliest_offset: timedelta  # the API server's clock is at least this far ahead of ours
    latest_offset: timedelta  # and less than this far
    local: Callable[[], datetime] = _local

    def now(self) -> datetime:
        """The cluster's time now, the middle of its bounds (off by half a second at most,
        plus half the round trip it was read in)."""
        return self.local() + (self.earliest_offset + self.latest_offset) / 2

    def latest(self) -> datetime:
        """The latest the cluster's time can be now: what "everything up to now" must reach
        so that nothing the cluster saw before now is left out."""
        return self.local() + self.latest_offset


async def read_clock(cluster: Cluster, *, local: Callable[[], datetime] = _local
                     ) -> ClusterClock:
    """Read the API server's time once and bound its offset from `local`."""
    sent = local()
    served = await cluster.server_time()
    received = local()
    return ClusterClock(earliest_offset=served - received,
                        latest_offset=served + _SECOND - sent, local=local)


__all__ = ["ClusterClock", "read_clock"]
