"""Finding devices for all claims of one pod on one node, jointly, within a bounded search.

Requests are taken in order; for each, its alternatives (the request itself, or its
`firstAvailable` subrequests in order), and for each alternative `count` devices (or all
matching devices) from the node's candidates in the packing strategy's preference order, under
the claim's matchAttribute / distinctAttribute constraints. Choices are backtracked across
requests and claims like upstream's allocator, but every device tried costs one unit of a fixed
budget, so a request that cannot be met never takes more than the budget whatever the node
looks like.
With sharing policies in force, each card that fits is also asked `card_refusal` (allowed
models, exclusive namespaces, maxClaimsPerDevice, tenant isolation) given who holds it,
the pod's own earlier picks included; a ranking's search (`EVERY_TENANT`) asks none of who
holds it, and `visit.refused_picks` asks a pod's own rules of the cards such a search picked.
What a share takes of a card is in `cards`, how reasons are worded in `reasons`.
Pure: no I/O.

The search's bounds and memo keys live beside it because they must agree with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.cards import (
    card_product,
    short_share,
    unnamed_charge,
    wanted_amount,
)
from dra_gateway.allocator.planner.counters import CounterKey, SetKey, card_use
from dra_gateway.allocator.planner.demand import Alternative, ClaimDemand, Constraint, memory_for
from dra_gateway.allocator.planner.devices import NANO, Device, qualify
from dra_gateway.allocator.planner.fragmentation import FULL, Workload, free_milli
from dra_gateway.allocator.planner.inputs import SearchInputs
from dra_gateway.allocator.planner.reasons import (
    RULES_PLACEHOLDER,
    TENANT_PLACEHOLDER,
    capacity_text,
    claim_placeholder,
    describe_constraint,
    tenant_label,
    verdict_reason,
)
from dra_gateway.allocator.planner.settings import BINPACK, DEFAULT, FIRST_FIT, SPREAD
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.allocator.planner.topology import aligned, misalignment
from dra_gateway.gpu.mig import CardUse, loss
from dra_gateway.kube import names
from dra_gateway.kube.quantity import Quantity
from dra_gateway.policy.sharing import EVERY_TENANT, Holder, SharingRules, card_refusal


@dataclass(slots=True)
class Pick:
    """One device given to one request (result)."""

    claim: int  # index of the claim among those planned
    result_name: str
    alternative: Alternative
    device: int  # index among the node's devices
    consumed: dict[str, int]
    exclusive: bool


@dataclass(slots=True)
class NodeSearchResult:
    """Devices found on a node (or why not), independent of the node's CPU and memory."""

    ok: bool
    picks: tuple[Pick, ...] = ()
    reason: str | None = None
    before: tuple[int, ...] = ()  # free share of each gateway card, sorted, before and after
    after: tuple[int, ...] = ()
    model: str = ""
    misaligned: int = 0  # how far multi-card requests spread over topology domains (topology)
    # What the MIG instances picked take from what their cards could still place, the biggest
    # profiles weighing most (`_mig_weight`): nodes compare by it first.
    mig_loss: int = 0


def _mig_weight(taken: tuple[int, ...]) -> int:
    """A loss vector (biggest profiles first, each count at most 8) as one number that orders
    as the vectors do: a placement that costs a bigger profile weighs more than any number of
    smaller ones."""
    weight = 0
    for count in taken:
        weight = weight * 16 + count
    return weight


class _AllBroken(Exception):
    """An All (sub)request whose devices a constraint keeps apart: upstream's allocator calls
    that claim an error and stops (allocator_incubating.go, "cannot add device ... because a
    claim constraint would not be satisfied"), even where a later subrequest would fit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Budget(Exception):
    pass


class NodeSearch:
    """One search for one pod on one node (see module docstring)."""

    def __init__(self, state: ClusterState, node: str, claims: Sequence[tuple[str, ClaimDemand]],
                 inputs: SearchInputs, *, workload: Workload,
                 rules: SharingRules | None = None) -> None:
        """`inputs` is all the search reads besides the node and the claims' demands (which
        `inputs.claims` names) and the rules (which `inputs.card_rules` stands for)."""
        self.state = state
        self.node = node
        self.devices: list[Device] = state.node_devices.get(node, [])
        self.claims = claims
        self.strategy = inputs.strategy
        self.topology = inputs.topology
        self.workload = workload
        self.budget = inputs.budget
        self.initial_budget = inputs.budget
        self._current = 0
        # Tentative use by this pod on top of what the state records.
        self.extra: list[dict[str, int]] = [{} for _ in self.devices]
        self.extra_holders = [0] * len(self.devices)
        self.extra_exclusive = [False] * len(self.devices)
        self.picks: list[Pick] = []
        self.failure: tuple[tuple[int, int], str] | None = None
        self._usage = [state.device_usage(d.key) for d in self.devices]
        self._gpus = [i for i, d in enumerate(self.devices) if d.is_gateway_gpu]
        # Partitionable devices: the room left in each counter the node's pools share (None:
        # the node has none), what the devices allocated draw counted once each.
        self._left = self._counter_room(state.inventory.node_counters.get(node))
        self._mig_loss: dict[int, int] = {}  # device -> `_mig_weight` of its loss when ordered
        self._base_free = [self._compute_free(i) if u.holders or self.devices[i].counters
                           else FULL for i, u in enumerate(self._usage)]
        # The pod's namespace's sharing rules; None when no sharing policy is in force.
        self.rules = rules
        self._own = Holder(rules.tenant, rules.max_claims_per_device) if rules else None
        # The rankings' rules (not exclusive): who holds a card does not matter.
        self._every = rules is not None and rules.tenant == EVERY_TENANT and not rules.exclusive

    # --- reasons ------------------------------------------------------------------------------

    def _fail(self, claim_i: int, request_i: int, message: str) -> None:
        depth = (claim_i, request_i)
        if self.failure is None or depth >= self.failure[0]:
            self.failure = (depth, f"claim {claim_placeholder(claim_i)}: {message}")

    # --- static matching ----------------------------------------------------------------------

    def _matches(self, alt: Alternative, device: Device) -> bool | str:
        """Class selectors, request selectors and device taints; remembered per device
        content (per device for selectors that read identity attributes) until the classes or
        the device's slice change."""
        key = (self.state.generation,
               device.serial if alt.identity_sensitive else device.group_id)
        verdict = alt.static.get(key)
        if verdict is None:
            if len(alt.static) > 50_000:
                alt.static.clear()
            verdict = self._match(alt, device)
            alt.static[key] = verdict
        return verdict

    def _match(self, alt: Alternative, device: Device) -> bool | str:
        info = self.state.classes.get(alt.class_name)
        if info is None:
            return f"DeviceClass {alt.class_name!r} not found"
        if info.error:
            return info.error
        for expression, selector in zip(info.expressions, info.selectors, strict=True):
            verdict = self.state.verdict_for(device, expression, selector, False)
            if verdict is not True:
                return verdict_reason(verdict, device, f"DeviceClass {alt.class_name}")
        for expression, selector in zip(alt.expressions, alt.selectors, strict=True):
            verdict = self.state.verdict_for(device, expression, selector,
                                             alt.identity_sensitive)
            if verdict is not True:
                return verdict_reason(verdict, device, "selector")
        for taint in device.taints:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not kubefit.tolerates(
                alt.tolerations, taint
            ):
                return False
        return True

    # --- counters -----------------------------------------------------------------------------

    def _counter_room(self, totals: dict[CounterKey, int] | None) -> dict[CounterKey, int] | None:
        if totals is None:
            return None
        left = dict(totals)
        for device, usage in zip(self.devices, self._usage, strict=True):
            if usage.holders:
                for key, amount in device.counters:
                    left[key] = left.get(key, 0) - amount
        return left

    def counters_fit(self, i: int) -> bool:
        """Whether device `i`, unheld, has room in every counter it draws on (a counter its
        pool does not publish has none)."""
        left = self._left
        if left is None:
            return False
        return all(amount <= left.get(key, 0) for key, amount in self.devices[i].counters)

    def _held(self, i: int) -> bool:
        return self._usage[i].holders > 0 or self.extra_holders[i] > 0

    # --- capacity -----------------------------------------------------------------------------

    def consumption(self, alt: Alternative, i: int,
                    short: list[str] | None = None) -> dict[str, int] | None:
        """What `alt` would consume on device `i` now, or None if it does not fit there.

        With `short`, a share that does not fit notes there each capacity it lacks room for
        (for the reason; the search itself never passes it).
        """
        device = self.devices[i]
        usage = self._usage[i]
        if usage.exclusive or self.extra_exclusive[i]:
            return None
        busy = usage.holders > 0 or self.extra_holders[i] > 0
        if device.counters and not busy and not self.counters_fit(i):
            if short is not None:
                short.append("counters")
            return None
        capacity = device.capacity
        for cap_name in alt.capacity:
            if cap_name not in capacity:
                return None
        if not device.shareable or alt.whole:
            if busy:
                return None
            share_memory = memory_for(alt.share, device.gpu_memory)
            if share_memory is not None and share_memory * NANO > capacity.get(
                names.CAPACITY_MEMORY, 0
            ):
                return None
            for cap_name, amount in alt.capacity.items():
                if amount > capacity[cap_name]:
                    return None
            return dict(capacity) if device.shareable else {}
        consumed: dict[str, int] = {}
        extra = self.extra[i]
        lacking = False
        for cap_name, cap in capacity.items():
            wanted = wanted_amount(alt, device, cap_name)
            policy = device.policies.get(cap_name)
            if wanted is None:
                amount = unnamed_charge(alt, device, cap_name)[0]
            else:
                rounded = policy.round_up(wanted) if policy is not None else wanted
                if rounded is None:
                    return None
                amount = rounded
            if amount > cap - usage.consumed.get(cap_name, 0) - extra.get(cap_name, 0):
                if short is None:
                    return None
                short.append(cap_name)
                lacking = True
            if amount:
                consumed[cap_name] = amount
        return None if lacking else consumed

    def refusal(self, alt: Alternative, i: int) -> str | None:
        """Why the sharing rules keep `alt` off device `i` given who holds it, or None."""
        device = self.devices[i]
        rules = self.rules
        if rules is None or device.driver != names.DRIVER:
            return None
        namespaces = self._usage[i].namespaces
        short = short_share(alt, device, rules)
        if (self._every or (not namespaces and not self.extra_holders[i])) \
                and not rules.models and short is None:
            # Nobody holds it or who does not matter, any model, and no relative share below
            # the minimum: nothing to refuse.
            return None
        holders: list[Holder] = []
        if not self._every:
            holders = self.state.policies.holders(namespaces)
            if self.extra_holders[i] and self._own is not None:
                holders.extend([self._own] * self.extra_holders[i])
        whole = alt.whole or not device.shareable
        why = card_refusal(rules, whole=whole, product_name=card_product(device), holders=holders)
        if why is None and short is not None:
            why = (f"{alt.share.memory_percent}% of its memory is "
                   f"{Quantity.from_bytes(short)}, below the minimum share memory="
                   f"{Quantity.from_bytes(rules.min_memory or 0)} of {rules.named()} "
                   "(minShare)")
        if why is None:
            return None
        # The policies are named where the reason is reported (`fill_claims`): outcomes are
        # memoised across namespaces whose rules differ only in what this card does not read.
        if not rules.empty and rules.named() in why:
            why = why.replace(rules.named(), RULES_PLACEHOLDER)
        elif "GPUSharingPolic" not in why:
            why = f"{why}, {RULES_PLACEHOLDER}"
        why = why.replace(f"isolated from {tenant_label(rules)} (isolation)",
                          f"isolated from {TENANT_PLACEHOLDER} (isolation)")
        return f"card {device.name}: {why}"

    def _apply(self, i: int, consumed: dict[str, int], exclusive: bool, sign: int) -> None:
        extra = self.extra[i]
        for cap_name, amount in consumed.items():
            extra[cap_name] = extra.get(cap_name, 0) + sign * amount
        counted = self.devices[i].counters
        if counted and self._left is not None and not self._usage[i].holders and (
                self.extra_holders[i] == (0 if sign > 0 else 1)):
            # The device's first holder draws its counters; its last gives them back.
            left = self._left
            for key, amount in counted:
                left[key] = left.get(key, 0) - sign * amount
        self.extra_holders[i] += sign
        if exclusive:
            self.extra_exclusive[i] = sign > 0

    def free_of(self, i: int) -> int:
        if self.extra_holders[i] == 0 and not self.devices[i].counters:
            return self._base_free[i]
        return self._compute_free(i)

    def _compute_free(self, i: int) -> int:
        device = self.devices[i]
        usage = self._usage[i]
        extra = self.extra[i]
        if device.counters and not self._held(i) and not self.counters_fit(i):
            return 0  # a card cut into instances others hold: nothing of it is free whole
        if not device.shareable:
            return 0 if (usage.holders or self.extra_holders[i]) else FULL
        consumed = {k: usage.consumed.get(k, 0) + extra.get(k, 0)
                    for k in device.capacity}
        return free_milli(device.capacity, consumed, usage.exclusive > 0 or
                          self.extra_exclusive[i])

    def cards(self) -> tuple[int, ...]:
        return tuple(sorted([self.free_of(i) for i in self._gpus]))

    # --- search -------------------------------------------------------------------------------

    def run(self) -> NodeSearchResult:
        before = self.cards()
        try:
            ok = self._solve(0, 0)
        except _AllBroken as broken:
            ok = False
            self.failure = ((len(self.claims), 0), broken.reason)
        except _Budget:
            ok = False
            self.failure = ((len(self.claims), 0), (
                f"claim {claim_placeholder(self._current)}: gave up after trying "
                f"{self.initial_budget} device combinations on the node; simplify the claim's "
                "constraints or split its requests"))
        if not ok:
            reason = self.failure[1] if self.failure else "no devices fit"
            return NodeSearchResult(False, reason=reason)
        return NodeSearchResult(True, tuple(self.picks), None, before, self.cards(),
                                self._model(), self._misaligned() if self.topology else 0,
                                sum(self._mig_loss.get(p.device, 0) for p in self.picks))

    def _misaligned(self) -> int:
        """How far the multi-card requests' cards spread (`topology.misalignment`)."""
        by_request: dict[tuple[int, str], list[int]] = {}
        for pick in self.picks:
            by_request.setdefault((pick.claim, pick.result_name), []).append(pick.device)
        return sum(misalignment(self.devices, chosen) for chosen in by_request.values()
                   if len(chosen) > 1)

    def _no_match(self, alt: Alternative) -> str:
        """Why no device of the node matches a request, with a share HAMi-core enforces on a
        node without its library named as such."""
        hami_core = qualify(names.DRIVER, names.ATTR_HAMI_CORE)
        if any(names.ATTR_HAMI_CORE in e for e in alt.expressions) and not any(
                d.attributes.get(hami_core) is True for d in self.devices if d.is_gateway_gpu):
            return (f"HAMi-core enforces its share, and no card of the node has HAMi-core's "
                    f"library (their {names.ATTR_HAMI_CORE} attribute is not true): install "
                    "HAMi-core on the node where the node plugin looks for it (the chart's "
                    "nodePlugin.hamiCore.hostPath)")
        return (f"no device of class {alt.class_name} matches its selectors and tolerations on "
                "the node")

    def _model(self) -> str:
        for device in self.devices:
            if device.is_gateway_gpu:
                return card_product(device) or ""
        return ""

    def _solve(self, claim_i: int, request_i: int) -> bool:
        if claim_i == len(self.claims):
            return True
        demand = self.claims[claim_i][1]
        if request_i == len(demand.requests):
            return self._solve(claim_i + 1, 0)
        request = demand.requests[request_i]
        for alt in request.alternatives:
            candidates: list[int] = []
            static_reason: str | None = None
            for i, device in enumerate(self.devices):
                verdict = self._matches(alt, device)
                if verdict is True:
                    candidates.append(i)
                elif isinstance(verdict, str):
                    static_reason = verdict
                    if verdict.startswith(("DeviceClass", "selector evaluation")):
                        self._fail(claim_i, request_i, f"request {alt.result_name}: {verdict}")
                        return False
            if not candidates:
                self._fail(claim_i, request_i, f"request {alt.result_name}: "
                           + (static_reason or self._no_match(alt)))
                continue
            need = len(candidates) if alt.all_devices else alt.count
            fits = {i: c for i in candidates if (c := self.consumption(alt, i)) is not None}
            refused: str | None = None
            if self.rules is not None:
                for i in list(fits):
                    why = self.refusal(alt, i)
                    if why is not None:
                        del fits[i]
                        refused = why
            available = list(fits)
            if len(available) < need and refused is not None:
                self._fail(claim_i, request_i,
                           f"request {alt.result_name} needs {need} device(s) of class "
                           f"{alt.class_name}, {len(available)} on the node a sharing policy "
                           f"allows: {refused}")
                continue
            if len(available) < need:
                what = "all" if alt.all_devices else str(need)
                self._fail(claim_i, request_i,
                           f"request {alt.result_name} needs {what} device(s) of class "
                           f"{alt.class_name}, {len(available)} of {len(candidates)} matching "
                           f"on the node {'have' if available else 'has'} room "
                           f"{self._room(alt, [i for i in candidates if i not in fits])}")
                continue
            ordered = self._order(alt, available, fits)
            if need > 1 and self.topology:
                ordered = aligned(self.devices, ordered, need)
            constraints = [c for c in demand.constraints if c.applies(alt.result_name)]
            if self._choose(claim_i, request_i, alt, ordered, 0, need, constraints):
                return True
            if constraints:
                self._fail(claim_i, request_i, f"request {alt.result_name}: no {need} device(s) "
                           "satisfy " + ", ".join(describe_constraint(c) for c in constraints))
        return False

    def _room(self, alt: Alternative, full: Sequence[int]) -> str:
        """What `alt` asks of each device, with what it is charged for the capacities it leaves
        out, and which capacities the devices in `full` (those without room) lack."""
        drawn = sum(1 for i in full if self.devices[i].counters and not self._held(i)
                    and not self.counters_fit(i))
        counters = (f"; {drawn} draw on counters that devices already allocated hold "
                    "(partitionable devices: an instance of the same card, or the card "
                    "whole)") if drawn else ""
        if alt.whole:
            return "(a whole device must be free)" + counters
        parts = []
        memory = alt.capacity.get(names.CAPACITY_MEMORY)
        if memory is not None:
            parts.append(f"memory {Quantity.from_bytes(memory // NANO)}")
        elif alt.share.memory is not None:
            parts.append(f"memory {Quantity.from_bytes(alt.share.memory)}")
        elif alt.share.memory_percent is not None:
            parts.append(f"memory {alt.share.memory_percent}%")
        cores = alt.capacity.get(names.CAPACITY_CORES)
        if cores is not None or alt.share.cores is not None:
            parts.append(f"cores {cores // NANO if cores is not None else alt.share.cores}%")
        shortages: dict[str, int] = {}
        for i in full:
            device = self.devices[i]
            for cap_name in device.capacity:
                if wanted_amount(alt, device, cap_name) is not None:
                    continue
                amount, why = unnamed_charge(alt, device, cap_name)
                if amount:
                    part = f"{capacity_text(device, cap_name, amount)} ({why})"
                    if part not in parts:
                        parts.append(part)
            short: list[str] = []
            if device.shareable and self.consumption(alt, i, short) is None:
                for cap_name in short:
                    shortages[cap_name] = shortages.get(cap_name, 0) + 1
        room = f"for {' and '.join(parts)}" if parts else "for the share"
        shortages.pop("counters", None)
        if shortages:
            room += "; short of " + ", ".join(f"{cap_name} on {count}"
                                              for cap_name, count in shortages.items())
        return room + counters

    def _order(self, alt: Alternative, available: list[int],
               fits: dict[int, dict[str, int]]) -> list[int]:
        if self.strategy != FIRST_FIT and self._left is not None:
            spots = self._mig_spots(available)
            if spots is not None:
                return sorted(available, key=spots.__getitem__)
        if self.strategy == BINPACK:
            return sorted(available, key=lambda i: (self.free_of(i), i))
        if self.strategy == SPREAD:
            return sorted(available, key=lambda i: (-self.free_of(i), i))
        if self.strategy == DEFAULT:
            if alt.whole or len(available) == 1:
                return sorted(available, key=lambda i: (self.free_of(i), i))
            seen: dict[tuple[int, int], float] = {}
            return sorted(available, key=lambda i: (self._card_delta(i, fits[i], seen),
                                                    self.free_of(i), i))
        return available

    def _mig_spots(self, available: list[int]) -> dict[int, tuple[object, ...]] | None:
        """MIG placements ranked as `gpu.mig.choose` ranks them: the least taken from what
        their card could still place, biggest profiles first, then the fuller card, then slice
        order; None unless every device available is a placement of a known geometry."""
        geometries = self.state.inventory.node_mig.get(self.node)
        if not geometries or self._left is None:
            return None
        uses: dict[SetKey, CardUse] = {}
        ranks: dict[int, tuple[object, ...]] = {}
        for i in available:
            spot = self.devices[i].mig
            geometry = geometries.get(spot[0]) if spot is not None else None
            if spot is None or geometry is None:
                return None
            set_key, placement = spot
            use = uses.get(set_key)
            if use is None:
                use = uses[set_key] = card_use(set_key, geometry, self._left)
            taken = loss(geometry, use, placement)
            ranks[i] = (taken, -use.used_slices, i)
            self._mig_loss[i] = _mig_weight(taken)
        return ranks

    def _card_delta(self, i: int, consumed: dict[str, int],
                    seen: dict[tuple[int, int], float]) -> float:
        """Fragmentation after placing the share alone on card `i` (FGD's choice of card);
        cards of one size with the same free share give the same answer."""
        device = self.devices[i]
        if not device.is_gateway_gpu:
            return 0.0
        key = (self.free_of(i), device.gpu_memory)
        cached = seen.get(key)
        if cached is not None:
            return cached
        self._apply(i, consumed, False, 1)
        after = self.cards()
        self._apply(i, consumed, False, -1)
        # CPU and memory are the node's either way: only the cards differ between choices.
        value = self.workload.fragmentation(after, 1 << 62, 1 << 62, self._model())
        seen[key] = value
        return value

    def _constraint_ok(self, claim_i: int, constraints: list[Constraint], device: Device) -> bool:
        """Constraints hold between the devices of one claim (a device lacking the attribute
        is never chosen, as upstream)."""
        for constraint in constraints:
            value = device.attributes.get(constraint.attribute)
            if value is None:
                return False
            for pick in self.picks:
                if pick.claim != claim_i or not constraint.applies(pick.result_name):
                    continue
                other = self.devices[pick.device].attributes.get(constraint.attribute)
                if (other == value) == constraint.distinct:
                    return False
        return True

    def _choose(self, claim_i: int, request_i: int, alt: Alternative, ordered: list[int],
                start: int, need: int, constraints: list[Constraint]) -> bool:
        if need == 0:
            return self._solve(claim_i, request_i + 1)
        for j in range(start, len(ordered)):
            if len(ordered) - j < need:
                break
            self.budget -= 1
            if self.budget < 0:
                self._current = claim_i
                raise _Budget
            i = ordered[j]
            consumed = self.consumption(alt, i)
            if consumed is None:
                continue
            if self.rules is not None and self.extra_holders[i] and \
                    self.refusal(alt, i) is not None:
                continue  # the pod's own earlier picks count as holders too
            if constraints and not self._constraint_ok(claim_i, constraints, self.devices[i]):
                if alt.all_devices:
                    raise _AllBroken(
                        f"claim {claim_placeholder(claim_i)}: request {alt.result_name} asks for "
                        f"all devices of class {alt.class_name}, but device "
                        f"{self.devices[i].name} breaks "
                        + ", ".join(describe_constraint(c) for c in constraints)
                        + " (an error, as upstream's allocator has it: no later subrequest "
                        "is tried)")
                continue
            exclusive = alt.whole or not self.devices[i].shareable
            self._apply(i, consumed, exclusive, 1)
            self.picks.append(Pick(claim_i, alt.result_name, alt, i, consumed, exclusive))
            if self._choose(claim_i, request_i, alt, ordered, j + 1, need - 1, constraints):
                return True
            self.picks.pop()
            self._apply(i, consumed, exclusive, -1)
        return False
