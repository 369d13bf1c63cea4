"""Making room for a pod: the trials of the defrag planner (`RoomMaker`).

A trial takes the chosen holders out of the state, plans the pod on that node, puts back the
holders it does without, reserves the pod's devices, then places each pod that left, directly or
by making room for it in turn (`Limits.depth` levels). A trial that fails is undone exactly from
its log. The index of who holds which card (`where`, `holders`, `on_node`) changes only when a
pod helped is committed. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.defrag.estimate import (
    Card,
    DeviceKey,
    Need,
    counter_draw,
    counter_sets,
    devices_of,
    label,
    need_of,
    placement,
    plan_devices,
    to_free,
    unbound,
    unplaced,
)
from dra_gateway.allocator.planner.defrag.model import (
    Help,
    Limits,
    Move,
    Placement,
)
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.leaving import Resident, Waiter, movable
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.state import ClusterState, TakenOut
from dra_gateway.allocator.planner.trial import Trial
from dra_gateway.kube import objects


@dataclass(slots=True)
class _Where:
    node: str
    keys: set[DeviceKey]
    claim_uids: tuple[str, ...]


class RoomMaker:
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
        self._cards: dict[str, list[Card]] = {}
        self._fits: dict[tuple[object, ...], bool] = {}  # cleared when the plan moves pods
        self._shapes: dict[str, tuple[object, ...]] = {}  # a placed pod's requests, by uid
        self._fractions: dict[tuple[object, ...], float | None] = {}  # MIG requests' shares
        for resident in residents:
            uid = objects.uid(resident.pod)
            keys = devices_of(resident.claims)
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

    def cards(self, node: str) -> list[Card]:
        cards = self._cards.get(node)
        if cards is not None:
            return cards
        state = self.state
        cards = []
        for device in state.node_devices.get(node, ()):
            if not device.is_gateway_gpu:
                continue
            if device.counters:
                cards.append(self._cut_card(node, device))
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
            cards.append(Card(device, 1.0 - used, holders, sizes, freeable))
        self._cards[node] = cards
        return cards

    def _cut_card(self, node: str, device: Device) -> Card:
        """A card cut into MIG instances on demand, from the counters its whole-card device
        draws: what the allocated devices drawing on them hold, by whom. A card whose set
        lacks some of its counters (an administrator's instance holds them) is never free."""
        state = self.state
        sets = counter_sets(device)
        whole = counter_draw(device, sets)
        totals = state.inventory.node_counters.get(node, {})
        have = sum(min(totals.get(key, 0), amount) for key, amount in device.counters
                   if key[:3] in sets)
        parts = tuple(d for d in state.node_devices.get(node, ()) if counter_sets(d) & sets)
        used = 0
        holders: dict[str, int] = {}
        claims_held = known = 0
        for part in parts:
            usage = state.device_usage(part.key)
            if not usage.holders:
                continue
            draw = counter_draw(part, sets)
            used += draw
            claims_held += usage.holders
            for h in self.holders.get(part.key, ()):
                known += sum(1 for c in self.where[h].claim_uids
                             if (r := state.claims.get(c)) is not None and part.key in r.uses)
                if h not in self.out:
                    holders[h] = holders.get(h, 0) + draw
        names_ = tuple(sorted(holders))
        return Card(device, max(0.0, (have - used) / whole) if whole else 0.0, names_,
                    tuple(min(1.0, holders[h] / whole) for h in names_),
                    claims_held == known and have >= whole, parts)

    # --- who may move for whom -----------------------------------------------------------------

    def movable(self, uid: str, priority: int, *, last: bool) -> bool:
        """Whether the pod may leave for a pod of `priority`; on the last level of a chain
        only if it would fit somewhere else as the cluster is now."""
        resident = self.residents.get(uid)
        if resident is None or uid in self.moved or uid in self.out \
                or not movable(resident, priority, self.budgets):
            return False
        return not last or self._placeable(uid, resident)

    def _placeable(self, uid: str, resident: Resident) -> bool:
        """Whether the pod would fit somewhere else as the cluster is now (asked once per pod
        shape until the plan changes the cluster): a pod that cannot go anywhere is not worth
        a trial on the last level of a chain."""
        state = self.state
        shape = self._shapes.get(uid)
        if shape is None:
            shape = self._shapes[uid] = (
                tuple(state.demand(c.get("spec") or {})[0] for c in resident.claims),
                kubefit.pod_requests(resident.pod), objects.namespace(resident.pod))
        known = self._fits.get(shape)
        if known is None:
            pod = unbound(resident.pod)
            known = plan_pod(state, pod, [unplaced(c) for c in resident.claims]
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
            return Help(label(waiter.pod), uid, waiter.priority, placement(state, plan), plan,
                        ())
        cap = min(self.limits.max_moves_per_pod, self.moves_left)
        if cap <= 0:
            return f"{plan.reason}; no moves left in this plan"
        need = need_of(state, waiter.pod, waiter.claims, self._fractions)
        if need is None:
            return f"{plan.reason}; moving pods cannot help: it asks for no GPU of the gateway"
        room = self._make_room(waiter.pod, waiter.claims, waiter.priority, cap, depth=0,
                               avoid=frozenset(), need=need)
        if room is None:
            return (f"{plan.reason}; no node could make room for it by moving at most {cap} "
                    f"pod(s) that may move")
        moves = []
        for v, moved in room.moved:
            resident = self.residents[v]
            where = self.where[v]
            source = Placement(where.node, tuple(sorted(k[2] for k in where.keys)))
            moves.append(Move(label(resident.pod), v, source, placement(state, moved), moved,
                              resident.budgets))
            for budget in resident.budgets:
                self.budgets[budget] = self.budgets.get(budget, 0) - 1
            self.moved.add(v)
            self._settle(v, moved.node_name or "", plan_devices(moved), where.claim_uids)
        self._cards.pop(room.plan.node_name or "", None)
        self._fits.clear()
        self.moves_left -= len(moves)
        return Help(label(waiter.pod), uid, waiter.priority, placement(state, room.plan),
                    room.plan, tuple(moves))

    def _make_room(self, pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]],
                   priority: int, cap: int, *, depth: int, avoid: frozenset[str],
                   need: Need | None = None) -> _Room | None:
        """Place `pod` by moving at most `cap` pods: on the cheapest nodes first, each pod that
        leaves placed again directly or, above the last level, by making room for it in turn.
        On success the state holds every change (`_Room.log` undoes them); on failure none."""
        state = self.state
        need = need or need_of(state, pod, claims, self._fractions)
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

        def on_node() -> PodPlan | None:
            found = plan_pod(state, pod, claims, nodes=(node,))
            return found if found.node_name is not None else None

        trial = Trial(self._take_out, self._put_back)
        for v in victims:
            trial.take_out(v)
        placed = on_node()
        if placed is None:
            trial.undo()
            return None
        # Put back, smallest holders first, every pod the waiter can do without.
        plan, leaving = trial.reprieve(sorted(victims, key=lambda v: (self._weight(v), v)),
                                       on_node, placed)
        taken = {v: trial.out[v] for v in victims if v in leaving}
        room = _Room(plan, [], [("taken", out) for out in taken.values()])
        state.assume(pod, plan)
        room.log.append(("assumed", (pod, plan)))
        self._cards.pop(node, None)
        left = cap - len(taken)
        for v in sorted(taken, key=lambda v: (-self._weight(v), v)):
            resident = self.residents[v]
            moved_pod = unbound(resident.pod)
            moved_claims = [unplaced(c) for c in resident.claims]
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

    def _victims(self, node: str, need: Need, priority: int, cap: int, *,
                 last: bool) -> list[str] | None:
        """The fewest pods whose leaving the estimate says frees enough on `node`: the whole
        cards it needs, then a card for each share, then, where CPU or memory is short, pods
        that hold none of its GPUs."""
        cards = [c for c in self.cards(node) if need.accepts_card(self.state, c)]
        if len(cards) < need.whole + len(need.shares):
            return None
        leaving = _Leaving(lambda h: self.movable(h, priority, last=last))
        if not (self._free_whole_cards(cards, need, leaving)
                and self._free_shares(cards, need, leaving)
                and self._free_cpu_and_memory(node, need, cap, leaving)):
            return None
        if not leaving.chosen or len(leaving.chosen) > cap:
            return None  # nothing to move (it would fit already) or too many moves
        return sorted(leaving.chosen)

    def _free_whole_cards(self, cards: Sequence[Card], need: Need, leaving: _Leaving) -> bool:
        """Whether the whole cards `need` asks for can be free: empty ones first, then those
        whose holders may all leave, fewest holders first."""
        whole: list[tuple[int, int]] = []
        for i, card in enumerate(cards):
            if card.free >= 0.999:
                whole.append((0, i))
            elif card.freeable and all(leaving.may_move(h) for h in card.holders):
                whole.append((len(card.holders), i))
        if len(whole) < need.whole:
            return False
        whole.sort()
        for _, i in whole:
            if len(leaving.used) == need.whole:
                break
            if self._affordable(leaving, cards[i].holders):
                leaving.used.add(i)
                leaving.chosen.update(cards[i].holders)
        return len(leaving.used) >= need.whole

    def _free_shares(self, cards: Sequence[Card], need: Need, leaving: _Leaving) -> bool:
        """Whether each share `need` asks for finds a card of its own, the one freed by the
        fewest pods leaving."""
        for share in need.shares:
            best: tuple[int, int, tuple[str, ...]] | None = None
            for i, card in enumerate(cards):
                if i in leaving.used:
                    continue
                pods = to_free(card, share, leaving.may_move)
                if pods is not None and (best is None or len(pods) < best[0]) \
                        and self._within_budgets(leaving.spent, set(pods) - leaving.chosen):
                    best = (len(pods), i, pods)
                    if not pods:
                        break
            if best is None or not self._affordable(leaving, best[2]):
                return False
            leaving.used.add(best[1])
            leaving.chosen.update(best[2])
        return True

    def _free_cpu_and_memory(self, node: str, need: Need, cap: int, leaving: _Leaving) -> bool:
        """Whether the node has the CPU and memory `need` asks for once the chosen pods left;
        where short, pods that hold none of its GPUs leave too, those asking for the most of
        what is short first."""
        state = self.state
        cpu, memory = state.node_free(node)
        for h in leaving.chosen:
            record = state.pods.get(h)
            if record is not None:
                cpu += record.cpu
                memory += record.memory
        if cpu >= need.cpu and memory >= need.memory:
            return True
        others = sorted(
            ((record.cpu if cpu < need.cpu else 0) + (
                record.memory >> 20 if memory < need.memory else 0), h)
            for h in self.on_node.get(node, set()) - leaving.chosen
            if (record := state.pods.get(h)) is not None and not self.where[h].keys
            and leaving.may_move(h))
        while others and (cpu < need.cpu or memory < need.memory) \
                and len(leaving.chosen) < cap:
            _, h = others.pop()
            if not self._affordable(leaving, (h,)):
                continue
            record = state.pods[h]
            leaving.chosen.add(h)
            cpu += record.cpu
            memory += record.memory
        return cpu >= need.cpu and memory >= need.memory

    def _affordable(self, leaving: _Leaving, pods: Iterable[str]) -> bool:
        """Whether these pods may leave too, within their disruption budgets (then they spend
        them)."""
        fresh = set(pods) - leaving.chosen
        if not self._within_budgets(leaving.spent, fresh):
            return False
        for h in fresh:
            for budget in self.residents[h].budgets:
                leaving.spent[budget] = leaving.spent.get(budget, 0) + 1
        return True

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
        self._settle(uid, help_.placement.node, plan_devices(help_.plan),
                     tuple(objects.uid(c) for c in waiter.claims))


@dataclass(slots=True)
class _Leaving:
    """The pods `_victims` has chosen so far to leave one node: who may move at all, who is
    chosen, the cards they free (indexes among the node's cards that suit the need) and the
    disruption budgets they spend."""

    may_move: Callable[[str], bool]
    chosen: set[str] = field(default_factory=set)
    used: set[int] = field(default_factory=set)
    spent: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Room:
    """Room made for one pod: its plan, the pods moved for it (each with where it went), and
    what was changed in the state, in order, to undo it."""

    plan: PodPlan
    moved: list[tuple[str, PodPlan]]
    log: list[tuple[str, Any]]
