"""Defragmentation: the fewest moves of placed pods that let waiting pods be placed.

`plan_defrag(state, waiters, residents, limits)` helps waiting pods one at a time, in the order
given (callers put higher priority and longer waits first):

1. a waiter that fits as the cluster is now is placed without moves (what a retry would do);
2. otherwise each node is estimated from its cards alone: a card nobody holds costs nothing, a
   card whose holders may all move costs their number, a card with a holder that may not move
   cannot be freed; a waiter's whole cards take the cheapest cards of the node, each of its
   shares the card that frees enough with the fewest holders leaving. Nodes are then tried
   cheapest first, with the real planner: the estimate only orders the trials, it decides
   nothing;
3. a trial takes the chosen holders out of the state, asks `plan_pod` whether the waiter fits
   on that node, puts back every holder it can do without, reserves the waiter's devices, and
   then places each holder that left, largest first, wherever the planner puts it (the freed
   devices are taken: a moved pod never lands on them). A trial that cannot place every moved
   pod again is undone exactly.

Who may move is the caller's word (`Resident.fixed`: owned by no controller that re-creates it,
annotated `dra-gateway.io/defrag: never`, moved recently); the plan adds the rest: a pod never
moves to make room for a pod of lower priority than its own, never moves twice in one plan, and
never beyond what its PodDisruptionBudgets allow (`Limits.budgets`, disruptions left per budget,
spent as moves are planned).

The state ends as if the plan had been carried out: waiters and moved pods assumed where the
plan puts them. Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.demand import ClaimDemand
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.state import ClusterState, TakenOut
from dra_gateway.kube import names, objects

DeviceKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Resident:
    """A placed pod: bound, or planned and assumed, with its allocated claims."""

    pod: Mapping[str, Any]
    claims: tuple[Mapping[str, Any], ...]
    priority: int = 0
    fixed: str | None = None  # why it may not move; None: it may
    budgets: tuple[str, ...] = ()  # the PodDisruptionBudgets that select it


@dataclass(frozen=True, slots=True)
class Waiter:
    """A pod waiting for devices, with its claims (not allocated)."""

    pod: Mapping[str, Any]
    claims: tuple[Mapping[str, Any], ...]
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Limits:
    max_moves: int = 20  # in the whole plan
    max_moves_per_pod: int = 4
    nodes_tried: int = 8  # trials per waiter, cheapest nodes first (a quarter of it deeper)
    depth: int = 2  # levels of a chain: a moved pod may need room made for it in turn
    budgets: Mapping[str, int] = field(default_factory=dict)  # disruptions left per PDB


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    devices: tuple[str, ...]  # device names, in the order of the allocation's results

    def __str__(self) -> str:
        return f"{self.node} ({', '.join(self.devices)})" if self.devices else self.node


@dataclass(frozen=True, slots=True)
class Move:
    pod: str  # namespace/name
    uid: str
    source: Placement
    target: Placement
    plan: PodPlan  # where the planner put it again in the plan's world
    budgets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Help:
    """A waiting pod, where it goes and the moves that make room for it (none: it fits now)."""

    pod: str
    uid: str
    priority: int
    placement: Placement
    plan: PodPlan
    moves: tuple[Move, ...]

    @property
    def frees(self) -> str:
        if not self.moves:
            return "nothing: it fits as the cluster is"
        return f"{', '.join(self.placement.devices)} on {self.placement.node}"


@dataclass(frozen=True, slots=True)
class NotHelped:
    pod: str
    uid: str
    reason: str


@dataclass(slots=True)
class DefragPlan:
    helped: list[Help] = field(default_factory=list)
    not_helped: list[NotHelped] = field(default_factory=list)

    @property
    def moves(self) -> list[Move]:
        return [move for help_ in self.helped for move in help_.moves]


@dataclass(slots=True)
class _Card:
    device: Device
    free: float  # fraction of the card nobody holds
    holders: tuple[str, ...]  # resident pods holding it
    sizes: tuple[float, ...]  # each holder's fraction of the card, as `holders`
    freeable: bool  # every holder known and allowed to move (for some waiter)


@dataclass(slots=True)
class _Where:
    node: str
    keys: set[DeviceKey]
    claim_uids: tuple[str, ...]


def _label(pod: Mapping[str, Any]) -> str:
    return "/".join(objects.namespace_name(pod))


def _devices_of(claims: Iterable[Mapping[str, Any]]) -> list[DeviceKey]:
    keys: list[DeviceKey] = []
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            keys.append((result.get("driver", ""), result.get("pool", ""),
                         result.get("device", "")))
    return keys


def _plan_devices(plan: PodPlan) -> list[DeviceKey]:
    return _devices_of({"status": {"allocation": a}} for a in plan.allocations.values())


def _unplaced(claim: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in claim.items() if key != "status"}


def _unbound(pod: Mapping[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {**pod, "spec": spec}


class _Planner:
    def __init__(self, state: ClusterState, residents: Sequence[Resident],
                 limits: Limits) -> None:
        self.state = state
        self.limits = limits
        self.budgets = dict(limits.budgets)
        self.moves_left = limits.max_moves
        self.residents: dict[str, Resident] = {}
        self.where: dict[str, _Where] = {}
        self.holders: dict[DeviceKey, set[str]] = {}
        self.moved: set[str] = set()
        self.out: set[str] = set()  # taken out by the trial under way
        self.on_node: dict[str, set[str]] = {}
        self._cards: dict[str, list[_Card]] = {}
        self._fits: dict[tuple[object, ...], bool] = {}  # cleared when the plan moves pods
        for resident in residents:
            uid = objects.uid(resident.pod)
            keys = _devices_of(resident.claims)
            node = (resident.pod.get("spec") or {}).get("nodeName") or next(
                (d.node for k in keys if (d := state.devices.get(k)) is not None and d.node),
                None)
            if not uid or node is None:
                continue
            self.residents[uid] = resident
            self._settle(uid, node, keys, tuple(objects.uid(c) for c in resident.claims))

    # --- the index of who holds which card -----------------------------------------------------

    def _settle(self, uid: str, node: str, keys: Iterable[DeviceKey],
                claim_uids: tuple[str, ...]) -> None:
        old = self.where.pop(uid, None)
        if old is not None:
            for key in old.keys:
                self.holders.get(key, set()).discard(uid)
            self._cards.pop(old.node, None)
            self.on_node.get(old.node, set()).discard(uid)
        where = _Where(node, set(keys), claim_uids)
        self.where[uid] = where
        self.on_node.setdefault(node, set()).add(uid)
        for key in where.keys:
            self.holders.setdefault(key, set()).add(uid)
        self._cards.pop(node, None)

    def _size(self, claim_uids: Sequence[str], device: Device) -> float:
        """A holder's fraction of one card: the largest of its memory and cores there."""
        size = 0.0
        for claim_uid in claim_uids:
            record = self.state.claims.get(claim_uid)
            use = record.uses.get(device.key) if record is not None else None
            if use is None:
                continue
            if use.exclusive:
                return 1.0
            size += max((amount / device.capacity[name]
                         for name, amount in use.consumed.items()
                         if device.capacity.get(name)), default=1.0)
        return min(size, 1.0)

    def cards(self, node: str) -> list[_Card]:
        cards = self._cards.get(node)
        if cards is not None:
            return cards
        state = self.state
        cards = []
        for device in state.node_devices.get(node, ()):
            if not device.is_gateway_gpu:
                continue
            usage = state.device_usage(device.key)
            holders = tuple(sorted(h for h in self.holders.get(device.key, ())
                                   if h not in self.out))
            sizes = tuple(self._size(self.where[h].claim_uids, device) for h in holders)
            used = 1.0 if usage.exclusive else min(1.0, max(
                (amount / device.capacity[name] for name, amount in usage.consumed.items()
                 if device.capacity.get(name)), default=0.0))
            # Every claim on the card belongs to a pod the plan knows (none to a pod outside
            # `residents`, or to a claim of no pod).
            known = sum(1 for h in holders for c in self.where[h].claim_uids
                        if (r := state.claims.get(c)) is not None and device.key in r.uses)
            freeable = usage.holders == known
            cards.append(_Card(device, 1.0 - used, holders, sizes, freeable))
        self._cards[node] = cards
        return cards

    # --- who may move for whom -----------------------------------------------------------------

    def movable(self, uid: str, priority: int, *, last: bool) -> bool:
        """Whether the pod may leave for a pod of `priority`; on the last level of a chain
        only if it would fit somewhere else as the cluster is now."""
        resident = self.residents.get(uid)
        if resident is None or resident.fixed is not None or uid in self.moved \
                or uid in self.out:
            return False
        if resident.priority > priority:
            return False
        if not all(self.budgets.get(b, 0) > 0 for b in resident.budgets):
            return False
        return not last or self._placeable(resident)

    def _placeable(self, resident: Resident) -> bool:
        """Whether the pod would fit somewhere else as the cluster is now (asked once per pod
        shape until the plan changes the cluster): a pod that cannot go anywhere is not worth
        a trial on the last level of a chain."""
        state = self.state
        shape = (tuple(state.demand(c.get("spec") or {})[0] for c in resident.claims),
                 kubefit.pod_requests(resident.pod), objects.namespace(resident.pod))
        known = self._fits.get(shape)
        if known is None:
            pod = _unbound(resident.pod)
            known = plan_pod(state, pod, [_unplaced(c) for c in resident.claims]
                             ).node_name is not None
            self._fits[shape] = known
        return known

    # --- one waiter ----------------------------------------------------------------------------

    def help(self, waiter: Waiter) -> Help | str:
        state = self.state
        uid = objects.uid(waiter.pod)
        plan = plan_pod(state, waiter.pod, waiter.claims)
        if plan.node_name is not None:
            state.assume(waiter.pod, plan)
            return Help(_label(waiter.pod), uid, waiter.priority, _placement(state, plan), plan,
                        ())
        cap = min(self.limits.max_moves_per_pod, self.moves_left)
        if cap <= 0:
            return f"{plan.reason}; no moves left in this plan"
        if _need(state, waiter.pod, waiter.claims) is None:
            return f"{plan.reason}; moving pods cannot help: it asks for no GPU of the gateway"
        room = self._make_room(waiter.pod, waiter.claims, waiter.priority, cap, depth=0,
                               avoid=frozenset())
        if room is None:
            return (f"{plan.reason}; no node could make room for it by moving at most {cap} "
                    f"pod(s) that may move")
        moves = []
        for v, moved in room.moved:
            resident = self.residents[v]
            where = self.where[v]
            source = Placement(where.node, tuple(sorted(k[2] for k in where.keys)))
            moves.append(Move(_label(resident.pod), v, source, _placement(state, moved), moved,
                              resident.budgets))
            for budget in resident.budgets:
                self.budgets[budget] = self.budgets.get(budget, 0) - 1
            self.moved.add(v)
            self._settle(v, moved.node_name or "", _plan_devices(moved), where.claim_uids)
        self._cards.pop(room.plan.node_name or "", None)
        self._fits.clear()
        self.moves_left -= len(moves)
        return Help(_label(waiter.pod), uid, waiter.priority, _placement(state, room.plan),
                    room.plan, tuple(moves))

    def _make_room(self, pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]],
                   priority: int, cap: int, *, depth: int, avoid: frozenset[str],
                   ) -> _Room | None:
        """Place `pod` by moving at most `cap` pods: on the cheapest nodes first, each pod that
        leaves placed again directly or, above the last level, by making room for it in turn.
        On success the state holds every change (`_Room.log` undoes them); on failure none."""
        state = self.state
        need = _need(state, pod, claims)
        if need is None:
            return None
        last = depth + 1 >= self.limits.depth
        ranked: list[tuple[int, str, list[str]]] = []
        for node in state.node_devices:
            if node in avoid:
                continue
            victims = self._victims(node, need, priority, cap, last=last)
            if victims is not None:
                ranked.append((len(victims), node, victims))
        ranked.sort(key=lambda entry: (entry[0], entry[1]))
        tries = self.limits.nodes_tried if depth == 0 else max(1, self.limits.nodes_tried // 4)
        for _, node, victims in ranked[:tries]:
            room = self._trial(pod, claims, priority, node, victims, cap, depth=depth,
                               avoid=avoid | {node})
            if room is None:
                continue
            if depth == 0 and not self._within_budgets({}, [v for v, _ in room.moved]):
                self._undo(room)  # the levels of a chain together spend too much
                continue
            return room
        return None

    def _trial(self, pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]],
               priority: int, node: str, victims: list[str], cap: int, *, depth: int,
               avoid: frozenset[str]) -> _Room | None:
        state = self.state
        taken = {v: self._take_out(v) for v in victims}
        plan = plan_pod(state, pod, claims, nodes=(node,))
        if plan.node_name is None:
            for v in taken:
                self._put_back(taken[v])
            return None
        # Put back, smallest holders first, every pod the waiter can do without.
        for v in sorted(victims, key=lambda v: (self._weight(v), v)):
            self._put_back(taken[v])
            again = plan_pod(state, pod, claims, nodes=(node,))
            if again.node_name is None:
                taken[v] = self._take_out(v)
            else:
                del taken[v]
                plan = again
        room = _Room(plan, [], [("taken", out) for out in taken.values()])
        state.assume(pod, plan)
        room.log.append(("assumed", (pod, plan)))
        self._cards.pop(node, None)
        left = cap - len(taken)
        for v in sorted(taken, key=lambda v: (-self._weight(v), v)):
            resident = self.residents[v]
            moved_pod = _unbound(resident.pod)
            moved_claims = [_unplaced(c) for c in resident.claims]
            moved = plan_pod(state, moved_pod, moved_claims)
            if moved.node_name is not None:
                state.assume(moved_pod, moved)
                room.log.append(("assumed", (moved_pod, moved)))
                room.moved.append((v, moved))
                continue
            sub = None
            if depth + 1 < self.limits.depth and left > 0:
                sub = self._make_room(moved_pod, moved_claims, priority, left,
                                      depth=depth + 1, avoid=avoid)
            if sub is None:
                self._undo(room)
                return None
            left -= len(sub.moved)
            room.log += sub.log
            room.moved += [(v, sub.plan), *sub.moved]
        return room

    def _take_out(self, uid: str) -> TakenOut:
        self.out.add(uid)
        where = self.where[uid]
        self._cards.pop(where.node, None)
        return self.state.take_out(uid, where.claim_uids)

    def _put_back(self, taken: TakenOut) -> None:
        self.out.discard(taken.pod_uid)
        self._cards.pop(self.where[taken.pod_uid].node, None)
        self.state.put_back(taken)

    def _undo(self, room: _Room) -> None:
        for kind, entry in reversed(room.log):
            if kind == "assumed":
                pod, plan = entry
                self.state.forget(pod, plan)
                self._cards.pop(plan.node_name or "", None)
            else:
                self._put_back(entry)

    def _victims(self, node: str, need: _Need, priority: int, cap: int, *,
                 last: bool) -> list[str] | None:
        """The fewest pods whose leaving the estimate says frees enough on `node`."""
        state = self.state

        def may_move(h: str) -> bool:
            return self.movable(h, priority, last=last)

        cards = [c for c in self.cards(node) if need.accepts(state, c.device)]
        if len(cards) < need.whole + len(need.shares):
            return None
        chosen: set[str] = set()
        used: set[int] = set()
        whole: list[tuple[int, int]] = []
        for i, card in enumerate(cards):
            if card.free >= 0.999:
                whole.append((0, i))
            elif card.freeable and all(may_move(h) for h in card.holders):
                whole.append((len(card.holders), i))
        if len(whole) < need.whole:
            return None
        whole.sort()
        spent: dict[str, int] = {}

        def affordable(leaving: Iterable[str]) -> bool:
            """Whether these pods may leave too, within their disruption budgets."""
            fresh = set(leaving) - chosen
            if not self._within_budgets(spent, fresh):
                return False
            for h in fresh:
                for budget in self.residents[h].budgets:
                    spent[budget] = spent.get(budget, 0) + 1
            return True

        for _, i in whole:
            if len(used) == need.whole:
                break
            if affordable(cards[i].holders):
                used.add(i)
                chosen.update(cards[i].holders)
        if len(used) < need.whole:
            return None
        for share in need.shares:
            best: tuple[int, int, tuple[str, ...]] | None = None
            for i, card in enumerate(cards):
                if i in used:
                    continue
                leaving = _to_free(card, share, may_move)
                if leaving is not None and (best is None or len(leaving) < best[0]) \
                        and self._within_budgets(spent, set(leaving) - chosen):
                    best = (len(leaving), i, leaving)
                    if not leaving:
                        break
            if best is None or not affordable(best[2]):
                return None
            used.add(best[1])
            chosen.update(best[2])
        cpu, memory = state.node_free(node)
        for h in chosen:
            record = state.pods.get(h)
            if record is not None:
                cpu += record.cpu
                memory += record.memory
        if cpu < need.cpu or memory < need.memory:
            # Short of CPU or memory: pods that hold none of its GPUs leave too, those asking
            # for the most of what is short first.
            others = sorted(
                ((record.cpu if cpu < need.cpu else 0) + (
                    record.memory >> 20 if memory < need.memory else 0), h)
                for h in self.on_node.get(node, set()) - chosen
                if (record := state.pods.get(h)) is not None and not self.where[h].keys
                and may_move(h))
            while others and (cpu < need.cpu or memory < need.memory) and len(chosen) < cap:
                _, h = others.pop()
                if not affordable((h,)):
                    continue
                record = state.pods[h]
                chosen.add(h)
                cpu += record.cpu
                memory += record.memory
            if cpu < need.cpu or memory < need.memory:
                return None
        if not chosen or len(chosen) > cap:
            return None  # nothing to move (it would fit already) or too many moves
        return sorted(chosen)

    def _within_budgets(self, spent: Mapping[str, int], leaving: Iterable[str]) -> bool:
        wanted = dict(spent)
        for h in leaving:
            for budget in self.residents[h].budgets:
                wanted[budget] = wanted.get(budget, 0) + 1
        return all(n <= self.budgets.get(b, 0) for b, n in wanted.items())

    def _weight(self, uid: str) -> float:
        state = self.state
        return sum(self._size(self.where[uid].claim_uids, d)
                   for k in self.where[uid].keys if (d := state.devices.get(k)) is not None)

    def placed_waiter(self, help_: Help, waiter: Waiter) -> None:
        """A helped waiter holds its devices from now on and is moved by nobody."""
        uid = help_.uid
        self.moved.add(uid)
        self._settle(uid, help_.placement.node, _plan_devices(help_.plan),
                     tuple(objects.uid(c) for c in waiter.claims))


@dataclass(slots=True)
class _Room:
    """Room made for one pod: its plan, the pods moved for it (each with where it went), and
    what was changed in the state, in order, to undo it."""

    plan: PodPlan
    moved: list[tuple[str, PodPlan]]
    log: list[tuple[str, Any]]


def _to_free(card: _Card, share: float, may_move: Any) -> tuple[str, ...] | None:
    """The fewest holders of `card` whose leaving frees `share` of it (largest first)."""
    if card.free + 1e-9 >= share:
        return ()
    free = card.free
    leaving: list[str] = []
    for size, holder in sorted(zip(card.sizes, card.holders, strict=True), reverse=True):
        if not may_move(holder):
            continue
        leaving.append(holder)
        free += size
        if free + 1e-9 >= share:
            return tuple(leaving) if card.freeable or free - card.free >= share else None
    return None


@dataclass(slots=True)
class _Need:
    """What a waiter asks of the gateway's GPUs, as the estimate reads it."""

    whole: int
    shares: list[float]
    cpu: int
    memory: int
    checks: list[tuple[str, Any, bool]]  # selectors of its classes and requests

    def accepts(self, state: ClusterState, device: Device) -> bool:
        return all(state.verdict_for(device, expression, selector, identity) is True
                   for expression, selector, identity in self.checks)


def _need(state: ClusterState, pod: Mapping[str, Any],
          claims: Sequence[Mapping[str, Any]]) -> _Need | None:
    whole = 0
    shares: list[float] = []
    checks: list[tuple[str, Any, bool]] = []
    memory_card = state.typical_card_memory()
    for claim in claims:
        demand: ClaimDemand = state.demand(claim.get("spec") or {})[1]
        for request in demand.requests:
            alternative = request.alternatives[0]
            if alternative.class_name != names.GPU_CLASS:
                continue
            info = state.classes.get(alternative.class_name)
            if info is not None:
                checks += [(e, s, False)
                           for e, s in zip(info.expressions, info.selectors, strict=True)]
            checks += [(e, s, alternative.identity_sensitive)
                       for e, s in zip(alternative.expressions, alternative.selectors,
                                       strict=True)]
            share = alternative.share
            fraction = 0.0
            if share.memory_percent is not None:
                fraction = share.memory_percent / 100
            elif share.memory is not None:
                fraction = share.memory / memory_card
            if share.cores is not None:
                fraction = max(fraction, share.cores / names.CORES_PER_CARD)
            if alternative.whole or fraction <= 0 or fraction >= 1:
                whole += max(alternative.count, 1)
            else:
                shares += [fraction] * max(alternative.count, 1)
    if not whole and not shares:
        return None
    cpu, memory = kubefit.pod_requests(pod)
    return _Need(whole, shares, cpu, memory, checks)


def _placement(state: ClusterState, plan: PodPlan) -> Placement:
    return Placement(plan.node_name or "", tuple(k[2] for k in _plan_devices(plan)))


def plan_defrag(state: ClusterState, waiters: Sequence[Waiter], residents: Sequence[Resident],
                limits: Limits | None = None) -> DefragPlan:
    """Help `waiters` in their order; see the module docstring. The state ends as if the plan
    had been carried out."""
    planner = _Planner(state, residents, limits or Limits())
    result = DefragPlan()
    hopeless: set[tuple[object, ...]] = set()
    for waiter in waiters:
        shape = _shape(state, waiter)
        uid = objects.uid(waiter.pod)
        if shape in hopeless:
            result.not_helped.append(NotHelped(
                _label(waiter.pod), uid, "a pod asking for the same could not be helped"))
            continue
        outcome = planner.help(waiter)
        if isinstance(outcome, str):
            if planner.moves_left > 0:
                hopeless.add(shape)
            result.not_helped.append(NotHelped(_label(waiter.pod), uid, outcome))
            continue
        planner.placed_waiter(outcome, waiter)
        result.helped.append(outcome)
    return result


def _shape(state: ClusterState, waiter: Waiter) -> tuple[object, ...]:
    spec = waiter.pod.get("spec") or {}
    return (tuple(state.demand(c.get("spec") or {})[0] for c in waiter.claims),
            kubefit.pod_requests(waiter.pod), waiter.priority, objects.namespace(waiter.pod),
            repr(spec.get("nodeSelector")), repr(spec.get("affinity")),
            repr(spec.get("tolerations")))


def moves_needed(plan: DefragPlan) -> int:
    return sum(len(h.moves) for h in plan.helped)


__all__ = ["DefragPlan", "Help", "Limits", "Move", "NotHelped", "Placement", "Resident",
           "Waiter", "moves_needed", "plan_defrag"]
