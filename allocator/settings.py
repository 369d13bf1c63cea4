"""Settings of the allocator controller: one small frozen model, passed in explicitly.

Defaults suit a production cluster; tests shorten the timings. This module holds values only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gateway.kube import names


@dataclass(frozen=True)
class ControllerSettings:
    strategy: str = "default"  # how pods are packed (planner.STRATEGIES)
    # Node labels naming topology domains, innermost first (a rack label, then
    # topology.kubernetes.io/zone): a pod group's members are kept within them where they fit.
    group_domains: tuple[str, ...] = ()
    # Pods handled at once. Planning is one at a time (under a lock, in a thread); the rest of
    # a pod's work is waiting on the API (two claim writes, a read, the gate's patch: about a
    # quarter of a second on a busy API server), so four workers made a burst queue: in the
    # e2e bench (150 pods a path) the claim-to-allocation step fell from 0.51 s to 0.24 s p50
    # with sixteen, as fast as kube-scheduler's own (0.28 s).
    workers: int = 16
    # Retry timings of the work queue: base * 2**failures, capped.
    base_delay: float = 0.05
    max_delay: float = 60.0
    # Every key is requeued this often as a safety net against a missed event.
    resync_period: float = 300.0
    # When capacity frees up, unplaceable pods are retried after this pause (debounce).
    retry_unplaceable_after: float = 0.2
    # An event (capacity freed, the pod or its claims changed) brings an unplaceable pod's
    # next plan forward to at most this long after its last one, never below its backoff: on
    # a busy cluster events never stop, and planning a pod per event would burn the CPU on
    # pods that cannot fit while delaying those that can.
    unplaceable_retry_interval: float = 2.0
    # None: detect whether the API server keeps consumable-capacity fields; True/False: force.
    consumable_capacity: bool | None = None
    identity: str = ""
    watch_timeout: float = 300.0
    # A repeated failure updates its Event's count at most this often (spam filter).
    event_interval: float = 30.0
    # GPUQuota status (used, hard) is written at most this often after usage changed.
    quota_status_interval: float = 2.0
    # What one pod's plan may spend evaluating CEL selectors on devices not yet seen, in
    # upstream's cost units: ten selectors at the per-expression limit (1,000,000), or about
    # 100,000 evaluations of a typical selector; cached verdicts cost nothing. Over it the pod
    # is not placed (reason given) and retried on its backoff, so a tenant's costly selector
    # cannot hold the planner for long.
    plan_cost_budget: int = 10_000_000
    # The gateway's namespace: the allocator's Lease and defrag's ConfigMap (holds, moves).
    namespace: str = names.GATEWAY_NAMESPACE
    # Defrag holds are let go this long after their deadline at the latest.
    holds_check_interval: float = 15.0
    # The allocator's own defrag (`--defrag`): pods gated longer than `defrag_after` get moves
    # planned for them every `defrag_interval`, at most `defrag_moves_per_hour` moves in any
    # hour, each freed device held `defrag_hold` for its pod, `defrag_wait` for each
    # re-placement; a pod moved is not moved again within `defrag_window`.
    defrag: bool = False
    defrag_after: float = 300.0
    defrag_interval: float = 30.0
    defrag_moves_per_hour: int = 10
    defrag_moves_per_pod: int = 4
    defrag_waiters_per_round: int = 32
    defrag_in_flight: int = 2
    defrag_hold: float = 600.0
    defrag_wait: float = 120.0
    defrag_window: float = 3600.0
    # Preemption (allocator/eviction/preemption.py; `--no-preemption` turns it off): every
    # `preemption_interval`, a gated pod that fits nowhere may have pods of lower priority
    # evicted for it; the devices they free are held for it `preemption_hold`.
    preemption: bool = True
    preemption_interval: float = 2.0
    preemption_hold: float = 300.0
    # The drain of failed devices (eviction/drain.py; `--no-health-eviction` turns it off):
    # every `drain_interval`, the pods on a device a node plugin withholds for a fatal fault
    # are evicted (only where the API server keeps no device taints is any device withheld).
    health_eviction: bool = True
    drain_interval: float = 5.0


__all__ = ["ControllerSettings"]
