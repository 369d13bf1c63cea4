"""The allocator's own defrag (`dra-gateway allocator --defrag`), off by default.

Every `defrag_interval`, on the leader: the pods gated longer than `defrag_after` (the longest
waiting first, at most `defrag_waiters_per_round`; planned in a thread) are given to
the planner with the mirrors' view of the cluster (`Controller.snapshot`) and the
PodDisruptionBudgets read then, with at most the moves left in the hour (`defrag_moves_per_hour`,
counted from the moves recorded in the ConfigMap); the pods that moves can place are then
carried out as `dra-gateway defrag apply` does (`moves.Applier`). A hold whose moves never came (a
defrag stopped between them) is dropped first (`moves.drop_unserved`). A plan that stops (a budget
refuses an eviction) or leaves a moved pod unplaced doubles the pause before the next, up to sixteen
times; a clean one resets it. Moves and pods helped are counted in the metrics. Every
eviction and record write passes the leader's fence, as preemption's do: a plan is carried out
over minutes (it waits for each pod helped), and a replica that lost its Lease meanwhile stops
at its next write.
"""

from __future__ import annotations

import asyncio
import logging

from dra_gateway.allocator.eviction.inputs import Inputs, build
from dra_gateway.allocator.eviction.mode import EvictionMode
from dra_gateway.allocator.eviction.moves import Applier, Pace, drop_unserved
from dra_gateway.allocator.eviction.store import list_items
from dra_gateway.allocator.planner.defrag import DefragPlan, Limits, plan_defrag
from dra_gateway.kube.resources import POD_DISRUPTION_BUDGETS

log = logging.getLogger(__name__)


class DefragMode(EvictionMode):
    name = "defrag"
    max_backoff = 16

    @property
    def interval(self) -> float:
        return self.settings.defrag_interval

    async def one_round(self) -> bool:
        return not await self.round()

    async def round(self) -> bool:
        """One look at the waiting pods; False when the plan stopped or left a moved pod
        unplaced (the next look waits longer)."""
        settings = self.settings
        snapshot = await drop_unserved(self.cluster, settings.namespace, self.snapshot(),
                                       fence=self.fence)
        now = snapshot.now
        moved_lately = sum(1 for m in snapshot.records.moved
                           if (now - m.at).total_seconds() < 3600)
        left = settings.defrag_moves_per_hour - moved_lately
        if left <= 0:
            return True
        snapshot.budgets = await list_items(self.cluster, POD_DISRUPTION_BUDGETS)

        def planned() -> tuple[Inputs, DefragPlan | None]:
            # In a thread, on a state of its own: a big cluster's round takes seconds, and the
            # loop must keep renewing the Lease and serving the watches meanwhile.
            inputs = build(snapshot, window_seconds=settings.defrag_window)
            inputs.waiters = [w for w in inputs.waiters
                              if (now - inputs.waiting_since[w.pod["metadata"]["uid"]])
                              .total_seconds() >= settings.defrag_after
                              ][:settings.defrag_waiters_per_round]
            if not inputs.waiters:
                return inputs, None
            return inputs, plan_defrag(inputs.state, inputs.waiters, inputs.residents, Limits(
                max_moves=left, max_moves_per_pod=settings.defrag_moves_per_pod,
                budgets=inputs.budgets))

        inputs, plan = await asyncio.to_thread(planned)
        if plan is None:
            return True
        # Pods that fit as the cluster is need no moves: the allocator places them itself.
        plan = DefragPlan([h for h in plan.helped if h.moves], plan.not_helped)
        if not plan.helped:
            return True
        self.fence()  # a replica that no longer leads moves nothing
        log.info("defrag: moving pods for waiting pods", extra={
            "moves": [f"{m.pod} ({m.source.node} -> {m.target.node})" for m in plan.moves],
            "for": [h.pod for h in plan.helped]})
        applier = Applier(self.cluster, namespace=settings.namespace, clock=self.clock,
                          instance=settings.identity, fence=self.fence, pace=Pace(
                              in_flight=settings.defrag_in_flight,
                              hold_seconds=settings.defrag_hold,
                              wait_seconds=settings.defrag_wait,
                              window_seconds=settings.defrag_window))
        report = await applier.carry_out(plan, inputs.pods)
        clean = report.stopped is None
        for outcome in report.outcomes:
            for move in outcome.moves:
                result = move.result.split(":", 1)[0]
                if result in ("evicted", "refused", "failed"):
                    self.metrics.defrag_moves.labels(result).inc()
                if move.result == "evicted" and " on " not in move.replacement:
                    clean = False  # its replacement was not placed again
            if outcome.placed.startswith(("bound", "allocated")):
                self.metrics.defrag_pods_helped.inc()
        if report.stopped:
            log.warning("defrag stopped", extra={"why": report.stopped})
        return clean


__all__ = ["DefragMode"]
