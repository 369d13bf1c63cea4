"""One worker of the allocator controller: takes keys off the queue, syncs each, requeues.

The sync of a key answers a `SyncResult`; a failure becomes one too, so that no key, and no bug
in handling one, stops the others: a write refused because the term ended (`LeadershipLost`),
an optimistic write that conflicted, an API error, an unreachable API or anything unexpected is
logged and retried after the key's backoff. Only cancellation ends a worker.

This module must not plan, read objects or write to the API: the sync it is given does that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dra_gateway.allocator.metrics import Metrics, Stats
from dra_gateway.allocator.work import SyncResult, WorkKey
from dra_gateway.kube.cluster.port import ApiError, Conflict
from dra_gateway.kube.runtime.leader import LeadershipLost
from dra_gateway.kube.runtime.workqueue import WorkQueue

log = logging.getLogger(__name__)

Sync = Callable[[WorkKey], Awaitable[SyncResult]]
"""The work on one key: a pod's plan, writes and ungating, or a claim's release."""


async def run_worker(queue: WorkQueue[WorkKey], sync: Sync, *, stats: Stats,
                     metrics: Metrics) -> None:
    """Work keys until cancelled; each ends done, waiting for an event, or requeued."""
    while True:
        key = await queue.get()
        try:
            outcome = await sync(key)
        except asyncio.CancelledError:
            queue.done(key)
            raise
        except LeadershipLost as err:
            # The term is ending (the elector cancels the work): write nothing more.
            log.warning("not writing: leadership is not current", extra={
                "key": str(key), "error": str(err)})
            outcome = "retry"
        except Conflict as err:
            stats.conflicts += 1
            metrics.conflicts.inc()
            log.info("write conflict, retrying", extra={"key": str(key),
                                                        "error": err.message})
            outcome = "retry"
        except ApiError as err:
            stats.errors += 1
            log.warning("API call failed, retrying", extra={
                "key": str(key), "code": err.code, "reason": err.reason,
                "error": err.message})
            outcome = "retry"
        except (OSError, TimeoutError) as err:
            stats.errors += 1
            log.warning("API unreachable, retrying", extra={"key": str(key),
                                                            "error": str(err)})
            outcome = "retry"
        except Exception:
            # A bug must not stop the other keys: log it loudly and back off this one.
            stats.errors += 1
            log.exception("unexpected failure handling key", extra={"key": str(key)})
            outcome = "retry"
        if outcome == "retry":
            delay = queue.add_rate_limited(key)
            log.debug("requeued", extra={"key": str(key), "delay": delay})
        elif outcome == "done":
            queue.forget(key)
        queue.done(key)
        metrics.queue_depth.set(len(queue))


__all__ = ["Sync", "run_worker"]
