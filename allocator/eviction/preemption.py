"""The allocator's preemption: pods of lower priority leave so that a waiting pod gets GPUs.

Under a device plugin, kube-scheduler preempts lower-priority pods for a pod that needs their
cards; a translated pod's cards are DRA claims the gateway places, which kube-scheduler cannot
preempt for, so the allocator does it (`allocator.preemption.enabled` in the chart, on by
default; `--no-preemption` turns it off).

Every `preemption_interval` (up to eight times longer after rounds that found nothing to do), on
the leader, when a gated pod outranks a pod bound to a node: the mirrors' view of the cluster
(`Controller.snapshot`) and the PodDisruptionBudgets read then are built into a state of their
own (`inputs.build`); each gated pod that fits nowhere as the cluster is, highest priority
first, is given to the planner (`planner.preemption`), which names the fewest pods of strictly
lower priority to remove and where the pod then goes. A pod whose GPUQuota lent its guarantee
to a cohort (`spec.min`, `spec.cohort`), and that waits within that guarantee, takes it back
first: the planner names the fewest pods of the cohort's borrowing namespaces to remove,
whatever their priority (`plan_reclaim`); rounds run while a gated pod's namespace is in a
cohort, as they do while a gated pod outranks a placed one. A preemption found is assumed in that
state (its devices taken, its victims gone) before the next pod is looked at. Planning takes
time and the cluster moves on meanwhile, so each is checked again against the mirrors just
before it is carried out (`stale`): the pod still waits (there, gated, not being placed), it
still fits nowhere as the cluster is now, and it fits on the planned node once its victims
have left; a preemption that no longer stands is dropped, nobody evicted, and the next round
plans again. Then it is carried out, victim by victim:

1. the devices it frees are held for the pod first (a `hold.` record in the ConfigMap
   `dra-gateway-defrag`, as defrag holds them, naming the victims and their uids): no newcomer
   takes them, the pod is planned on them first; a later round drops the hold once its pod is
   placed or gone, or its time is over;
2. each victim gets the condition `DisruptionTarget` (reason `PreemptionByDraGateway`) and an
   Event `Preempted` naming the pod it makes room for, and is evicted through the Eviction API,
   so its PodDisruptionBudgets are honoured; the pod gets an Event `Preempting` naming them,
   and its condition `dra-gateway.io/Preemption` says what it waits for (False, `Placed`,
   once it is placed); before each eviction the pod is read again from the API, and one that
   no longer waits (gone, being deleted, placed) stops the preemption there;
3. a budget or an admission policy that refuses an eviction (or any failure) stops that
   preemption: the victims evicted stay evicted (and the pod is not preempted for again
   until they have left), the victim refused keeps no `DisruptionTarget` (evict.py), the
   hold is dropped, and the pod gets a Warning Event `PreemptionRefused` saying which victim
   and why; the next round looks again, after the backoff of a round that did not go cleanly
   (`evict.run_rounds`), with the budgets read again (a preemption whose victims a budget
   protects now is not tried: the planner chooses other victims, or another node, where it
   can; where it cannot, the pod's condition `dra-gateway.io/Preemption` (reason
   `DisruptionBudget`) names the budgets).

A hold outlives the allocator that wrote it, and the evictions after it may not: a leader killed
between the hold and its first eviction (or between two evictions) leaves a hold that keeps its
pod from being planned, for victims that never leave. So a round judges each preemption hold that
no preemption of its own has under way (`never_carried_out`) by its victims as the cluster shows
them: while one is leaving (being deleted, or gone with a claim not yet released) the hold
stands (what it frees stays held for the pod); once none is, and one is still there, its
evictions are not coming, and the hold is dropped (fenced), so the pod is planned afresh, in
the same round: the victims gone have freed their devices, and only as many more leave as are
still needed. A hold past its time whose victims are still being deleted makes them `leaving`,
as this process's own evictions are, so a new leader does not preempt others for the pod while
they go. A `DisruptionTarget` without a deletion does not count as leaving: the Eviction API
deletes the pod in the request that accepts it, so such a mark is one whose eviction never came
(or was refused).

Counted in `dra_gateway_allocator_preemptions_total{result}` (evicted, refused, failed) and
logged. This module talks to Kubernetes only through the cluster port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from dra_gateway.allocator.claims import claims_for
from dra_gateway.allocator.conditions import PREEMPTION_CONDITION, set_pod_condition
from dra_gateway.allocator.events import COMPONENT
from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.evict import (
    EVICTED,
    FAILED,
    GONE,
    REFUSED,
)
from dra_gateway.allocator.eviction.inputs import Inputs, Snapshot, build
from dra_gateway.allocator.eviction.mode import EvictionMode
from dra_gateway.allocator.eviction.store import list_items, write_records
from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.planner.leaving import Waiter
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.preemption import Preemption, plan_preemption, plan_reclaim
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.allocator.work import Fence
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound, Object
from dra_gateway.kube.resources import CONFIG_MAPS, POD_DISRUPTION_BUDGETS, PODS

log = logging.getLogger(__name__)

REASON = "PreemptionByDraGateway"
# What `carry_out` answers for a preemption stopped because its pod no longer waits.
ABANDONED = "abandoned"


def _outranked(pods: Sequence[Object]) -> bool:
    """Whether a gated pod has a higher priority than some pod bound to a node."""
    waiting = [objects.pod_priority(p) for p in pods if objects.waits_for_gateway(p)
               and not objects.is_deleting(p)]
    if not waiting:
        return False
    placed = [objects.pod_priority(p) for p in pods if objects.spec(p).get("nodeName")
              and not objects.is_finished(p) and not objects.is_deleting(p)]
    return bool(placed) and max(waiting) > min(placed)


def _blocked_by(preemption: Preemption) -> str:
    protected = [v for v in preemption.victims if v.protected]
    budgets = sorted({b for v in protected for b in v.budgets})
    return (f"preempting {', '.join(v.pod for v in protected)} would break "
            f"PodDisruptionBudget {', '.join(budgets)} (no disruption allowed now); the pod "
            f"waits, and preemption is tried again once the budget allows one")


def _may_reclaim(state: ClusterState, waiter: Waiter) -> bool:
    """Whether the pod's namespace lends to a cohort in which another namespace borrows."""
    peers = state.policies.ledger.cohort_peers(objects.namespace(waiter.pod))
    return any(peers.values())


def _in_cohorts(snapshot: Snapshot) -> bool:
    """Whether a gated pod's namespace has a GPUQuota in a cohort (it may take back a
    guarantee its cohort borrowed)."""
    catalog = snapshot.catalog
    if catalog is None:
        return False
    lending = {q.namespace for q in catalog.compiled_quotas() if q.cohort and q.min}
    return bool(lending) and any(
        objects.namespace(p) in lending and objects.waits_for_gateway(p)
        and not objects.is_deleting(p) for p in snapshot.pods)


def no_longer_waits(pod: Object | None, uid: str) -> str | None:
    """Why the pod a preemption is for no longer waits for it (gone, being deleted, placed),
    or None while it does. Pure."""
    if pod is None or objects.uid(pod) != uid:
        return "it is gone"
    if objects.is_deleting(pod):
        return "it is being deleted"
    node = objects.spec(pod).get("nodeName")
    if node:
        return f"it is bound to node {node}"
    if not objects.is_gated(pod):
        return "it was placed (the gateway's gate is gone)"
    return None


def stale(snapshot: Snapshot, preemption: Preemption) -> str | None:
    """Why a preemption planned earlier no longer stands on the cluster as `snapshot` shows it
    now, or None where it does: its pod still waits for devices (gated, its claims not
    allocated, not held for), it fits nowhere without the preemption, and it fits on the
    planned node once the victims still there have left. Pure; builds a state of its own."""
    inputs = build(snapshot)
    waiter = next((w for w in inputs.waiters if objects.uid(w.pod) == preemption.uid), None)
    if waiter is None:
        pod = next((p for p in snapshot.pods if objects.uid(p) == preemption.uid), None)
        return no_longer_waits(pod, preemption.uid) or (
            "it no longer waits for devices (allocated, or held for)")
    state = inputs.state
    if plan_pod(state, waiter.pod, list(waiter.claims)).node_name is not None:
        return "it fits now without preempting anybody"
    by_uid = {objects.uid(p): p for p in snapshot.pods}
    by_name = {objects.namespace_name(c): c for c in snapshot.claims}
    for victim in preemption.victims:
        pod = by_uid.get(victim.uid)
        if pod is None:
            continue  # gone: what it held is free already
        claims, _ = claims_for(pod, lambda ns, name: by_name.get((ns, name)))
        state.take_out(victim.uid, [objects.uid(c) for c in claims])
    if plan_pod(state, waiter.pod, list(waiter.claims),
                nodes=(preemption.node,)).node_name is None:
        return (f"it would no longer fit on node {preemption.node} once "
                f"{', '.join(v.pod for v in preemption.victims)} left")
    return None


def find_preemptions(inputs: Inputs, leaving: Mapping[str, set[str]] | None = None,
                     blocked: dict[str, str] | None = None) -> list[Preemption]:
    """The preemptions that place the waiting pods that fit nowhere now, highest priority
    first; each is assumed in `inputs.state` (its victims gone, the budgets spent) before the
    next pod is looked at. `leaving`: the victims still leaving of earlier preemptions, by the
    uid of the pod they were evicted for (it is not preempted for again meanwhile). `blocked`
    receives, by pod uid, why the preemption that would place a pod waits for a
    PodDisruptionBudget (naming the budgets and their pods)."""
    state = inputs.state
    residents = list(inputs.residents)
    budgets = dict(inputs.budgets)
    lowest = min((r.priority for r in residents if r.claims), default=None)
    found: list[Preemption] = []
    for waiter in inputs.waiters:  # highest priority, then oldest, first (inputs.build)
        reclaims = _may_reclaim(state, waiter)
        if not reclaims and (lowest is None or waiter.priority <= lowest):
            continue
        if leaving and leaving.get(objects.uid(waiter.pod)):
            continue  # its victims are still on their way out
        planned = plan_pod(state, waiter.pod, list(waiter.claims))
        if planned.node_name is not None:
            continue  # it fits: the allocator places it without anybody leaving
        preemption: Preemption | str = "no guarantee to take back"
        if reclaims and all(e.reclaims for e in planned.quota):
            preemption = plan_reclaim(state, waiter, residents, budgets)
        if isinstance(preemption, str) and lowest is not None and waiter.priority > lowest:
            preemption = plan_preemption(state, waiter, residents, budgets)
        if isinstance(preemption, str):
            continue
        if any(v.protected for v in preemption.victims):
            # The Eviction API would refuse it (a budget allows no disruption now): the pod
            # waits, and a later round looks again once the budget allows one.
            if blocked is not None:
                blocked[objects.uid(waiter.pod)] = _blocked_by(preemption)
            continue
        gone = {v.uid for v in preemption.victims}
        for victim in preemption.victims:
            for budget in victim.budgets:
                budgets[budget] = budgets.get(budget, 0) - 1
        for resident in residents:
            if objects.uid(resident.pod) in gone:
                state.take_out(objects.uid(resident.pod),
                               [objects.uid(c) for c in resident.claims])
        residents = [r for r in residents if objects.uid(r.pod) not in gone]
        state.assume(waiter.pod, preemption.plan)
        found.append(preemption)
    return found


class PreemptionMode(EvictionMode):
    name = "preemption"
    max_backoff = 8

    def __init__(self, cluster: Cluster, settings: ControllerSettings, *,
                 snapshot: Callable[[], Snapshot], metrics: Metrics, fence: Fence,
                 clock: Callable[[], datetime] | None = None) -> None:
        super().__init__(cluster, settings, snapshot=snapshot, metrics=metrics, fence=fence,
                         clock=clock)
        # Preemptor uid -> its victims not yet gone: not preempted for again while they leave
        # (a victim may take longer than the hold to stop). Only victims actually evicted (or
        # found gone): a preemption that stops leaves the others in place, and the pod is
        # planned again. A hold whose pod is here has its evictions under way in this process
        # (the mirrors may not show them yet): it is not judged by its victims.
        self.leaving: dict[str, set[str]] = {}
        self._written: dict[str, holdfmt.Hold] = {}  # holds written this round, by pod uid
        # The last round's carry-out stopped at a refused or failed eviction.
        self.stopped = False

    @property
    def interval(self) -> float:
        return self.settings.preemption_interval

    async def one_round(self) -> bool:
        # A round that looked and found nothing to do waits longer before the next (a state is
        # built for it), and so does one whose preemption was refused or failed (it is tried
        # again, not at every interval); one that preempted, or had nothing to look at, does
        # not.
        found = await self.round()
        return found == [] or self.stopped

    async def round(self) -> list[Preemption] | None:
        """One look at the waiting pods: the preemptions found (carried out, tried, or dropped
        as no longer standing), None when no gated pod outranks a placed one (nothing to look
        at). `stopped` says whether an eviction was refused or failed."""
        self.stopped = False
        snapshot = self.snapshot()
        live = {objects.uid(p) for p in snapshot.pods}
        self.leaving = {uid: victims & live for uid, victims in self.leaving.items()
                        if victims & live}
        unserved = await self._drop_spent_holds(snapshot)
        if unserved:
            # Planned afresh in this round: the mirror may still show the holds just dropped.
            snapshot.records = self._without(snapshot.records, unserved)
        if not _outranked(snapshot.pods) and not _in_cohorts(snapshot):
            return None  # the common case: a state is built only when one may preempt
        snapshot.budgets = await list_items(self.cluster, POD_DISRUPTION_BUDGETS)

        blocked: dict[str, str] = {}

        def planned() -> tuple[Inputs, list[Preemption]]:
            # In a thread, on a state of its own: the loop keeps the Lease and the watches.
            inputs = build(snapshot)
            return inputs, find_preemptions(inputs, self.leaving, blocked)

        inputs, found = await asyncio.to_thread(planned)
        for uid, why in blocked.items():
            pod = inputs.pods.get(uid)
            if pod is not None:
                self.fence()
                await set_pod_condition(self.cluster, pod, held=True,
                                          reason="DisruptionBudget",
                                          kind=PREEMPTION_CONDITION, message=why)
        try:
            for preemption in found:
                # The holds this round wrote count as the mirror would show them.
                fresh = self.snapshot()
                held = self._without(fresh.records, unserved).holds
                fresh.records = holdfmt.Records({**held, **self._written},
                                                list(fresh.records.moved))
                moved_on: str | None = await asyncio.to_thread(stale, fresh, preemption)
                if moved_on is not None:
                    log.info("a preemption no longer stands: nobody is evicted for it", extra={
                        "pod": preemption.pod, "victims": [v.pod for v in preemption.victims],
                        "why": moved_on})
                    continue
                result = await self.carry_out(preemption, inputs.pods)
                self.stopped = self.stopped or result in (REFUSED, FAILED)
        finally:
            self._written.clear()
        return found

    async def carry_out(self, preemption: Preemption, pods: Mapping[str, Object]) -> str:
        """Hold, then evict each victim while the pod still waits; the result (evicted,
        refused, failed, or abandoned: the pod no longer waits). The victims evicted are
        `leaving` until they are gone."""
        victims = ", ".join(v.pod for v in preemption.victims)
        # Who the victims are to the pod: of lower priority, or borrowing its guarantee.
        whose = (f"borrowing from cohort {preemption.cohort}" if preemption.cohort
                 else "of lower priority")
        log.info(f"preempting pods {whose} for a waiting pod", extra={
            "pod": preemption.pod, "priority": preemption.priority, "node": preemption.node,
            "victims": [v.pod for v in preemption.victims], "cohort": preemption.cohort})
        self.fence()  # a replica that no longer leads preempts nothing
        hold = holdfmt.Hold(preemption.uid, preemption.pod, preemption.node,
                            preemption.plan.allocations,
                            self.clock() + timedelta(seconds=self.settings.preemption_hold),
                            tuple(v.pod for v in preemption.victims), preempted=True,
                            victims=tuple(v.uid for v in preemption.victims))
        await write_records(self.cluster, self.settings.namespace, {hold.key: hold.value()})
        self._written[preemption.uid] = hold
        preemptor = pods.get(preemption.uid)
        goal = (f"to take back the guarantee its namespace lent to cohort "
                f"{preemption.cohort} and place this pod on node {preemption.node}"
                if preemption.cohort else f"on node {preemption.node} to place this pod")
        await self.evictions.event(preemptor, "Preempting",
                                   f"preempting {victims} ({whose}) {goal}")
        if preemptor is not None:
            await set_pod_condition(
                self.cluster, preemptor, held=True, reason="Preempting",
                kind=PREEMPTION_CONDITION,
                message=f"waiting for {victims} ({whose}, preempted for this pod) to leave; "
                        f"its devices on node {preemption.node} are held for it")
        evicted: set[str] = set()
        self.leaving.pop(preemption.uid, None)
        for victim in preemption.victims:
            gone = await self._no_longer_waits(preemption)
            if gone is not None:
                # Placed, deleted or being deleted meanwhile: the rest of the victims stay. A
                # hold left behind is dropped by the next round (`_drop_spent_holds`).
                log.info("preemption stopped: its pod no longer waits", extra={
                    "pod": preemption.pod, "why": gone,
                    "evicted": sorted(v.pod for v in preemption.victims if v.uid in evicted)})
                return ABANDONED
            pod = pods.get(victim.uid)
            why = (f"{COMPONENT}: preempting to take back the quota its cohort "
                   f"{preemption.cohort} lent: pod {preemption.pod} runs within its "
                   f"namespace's guarantee" if preemption.cohort else
                   f"{COMPONENT}: preempting to accommodate a higher priority pod "
                   f"{preemption.pod} (priority {preemption.priority}) on node "
                   f"{preemption.node}")
            told = (f"Preempted by pod {preemption.pod}: it takes back the guarantee lent to "
                    f"cohort {preemption.cohort}, which this pod's namespace borrowed"
                    if preemption.cohort else
                    f"Preempted by pod {preemption.pod} on node {preemption.node}")
            result, message = await self.evictions.leave(
                victim.pod, victim.uid, reason=REASON, message=why,
                told=(pod, "Preempted", told))
            if result in (GONE, EVICTED):
                # Not preempted for again while they leave (a pod gone already may still show
                # in the mirrors); recorded as each goes, so that a preemption that stops later
                # keeps only these.
                evicted.add(victim.uid)
                self.leaving[preemption.uid] = set(evicted)
                if result == GONE:
                    continue
            if result in (REFUSED, FAILED):
                self.metrics.preemptions.labels(result).inc()
                said = (f"could not preempt {victim.pod} on node {preemption.node}: {message}; "
                        f"it waits, and preemption is tried again")
                await self.evictions.event(preemptor, "PreemptionRefused", said, "Warning")
                if preemptor is not None:
                    await set_pod_condition(self.cluster, preemptor, held=True,
                                              reason="PreemptionRefused",
                                              kind=PREEMPTION_CONDITION, message=said)
                await self._drop_hold(hold.key)
                self._written.pop(preemption.uid, None)
                log.warning("preemption stopped", extra={
                    "pod": preemption.pod, "victim": victim.pod, "error": message})
                return result
            self.metrics.preemptions.labels(EVICTED).inc()
        return EVICTED

    async def _no_longer_waits(self, preemption: Preemption) -> str | None:
        """Why the preemption's pod no longer waits, read from the API now, or None."""
        namespace, name = preemption.pod.split("/", 1)
        try:
            pod: Object | None = await self.cluster.get(PODS, name, namespace=namespace)
        except NotFound:
            pod = None
        return no_longer_waits(pod, preemption.uid)

    async def _drop_spent_holds(self, snapshot: Snapshot) -> set[str]:
        """Drop the holds of preemptions that have served: their pod is placed (its gate gone)
        or gone, or their time is over; and those whose evictions never came (a leader
        stopped between the hold and them: `never_carried_out`), which no preemption of this
        process has under way. Defrag's own holds are left to defrag. Returns the pod uids of
        the latter dropped: their pods are to be planned again."""
        gated = {objects.uid(p) for p in snapshot.pods if objects.is_gated(p)
                 and not objects.is_deleting(p)}
        spent: list[str] = []
        unserved: dict[str, str] = {}
        for uid, hold in snapshot.records.holds.items():
            if not hold.preempted:
                continue
            if uid not in gated or hold.until <= snapshot.now:
                spent.append(hold.key)
                leaving, _ = holdfmt.victims_of(hold, snapshot.pods, snapshot.claims)
                if leaving and uid in gated:
                    # Its time is over before its victims are: not preempted for again while
                    # they leave, whoever evicted them.
                    self.leaving[uid] = self.leaving.get(uid, set()) | leaving
            elif uid not in self.leaving:
                why = holdfmt.never_carried_out(hold, snapshot.pods, snapshot.claims)
                if why is not None:
                    spent.append(hold.key)
                    unserved[uid] = why
        by_uid = {objects.uid(p): p for p in snapshot.pods}
        for uid, hold in snapshot.records.holds.items():
            pod = by_uid.get(uid)
            if hold.preempted and pod is not None and not objects.is_gated(pod):
                await set_pod_condition(self.cluster, pod, held=False, reason="Placed",
                                          kind=PREEMPTION_CONDITION,
                                          message=f"placed on node {hold.node} once the pods "
                                                  "preempted for it had left")
        if not spent:
            return set()
        self.fence()
        try:
            await write_records(self.cluster, self.settings.namespace, dict.fromkeys(spent))
        except ApiError as exc:
            log.warning("could not drop the holds of preemptions that have served", extra={
                "holds": spent, "error": exc.message})
            return set()
        for uid, why in unserved.items():
            log.info("a preemption's hold was dropped: its evictions never came; its pod is "
                     "planned again", extra={"pod": snapshot.records.holds[uid].pod,
                                             "node": snapshot.records.holds[uid].node,
                                             "why": why})
        return set(unserved)

    @staticmethod
    def _without(records: holdfmt.Records, uids: set[str]) -> holdfmt.Records:
        """`records` less the holds of `uids` (dropped, and maybe still in the mirror)."""
        if not uids:
            return records
        return holdfmt.Records({u: h for u, h in records.holds.items() if u not in uids},
                               list(records.moved), list(records.problems))

    async def _drop_hold(self, key: str) -> None:
        try:
            await write_records(self.cluster, self.settings.namespace, {key: None})
        except ApiError as exc:
            log.warning("could not drop a preemption's hold: it expires by itself", extra={
                "hold": key, "configMap": f"{self.settings.namespace}/{holdfmt.CONFIG_MAP}",
                "error": exc.message, "kind": CONFIG_MAPS.kind})


__all__ = ["ABANDONED", "REASON", "PreemptionMode", "find_preemptions", "no_longer_waits",
           "stale"]
