"""All or nothing: the members of a pod group planned together on one state.

`plan_group` plans each member in turn (the oldest first), each on the state as the members
before it left it (their devices, CPU, memory and quota charges assumed), so that the members
never share a device and their quotas are checked for the group as a whole. Either every
member is placed, and the plans are returned to be assumed and written together, or the group
does not fit and no plan is kept: the state ends as it started, so two groups that cannot both
fit never both hold devices.

One model per group (`same_model`): every member's cards are of one GPU model (the driver's
`productName`). The members are planned as they ask first; if their cards are of more than one
model, the group is planned again on each model in turn (the models the first plan used most
first, then the others by name), each member's claims narrowed to the model by a selector, and
the first model where they all fit wins. A model already held by the group's placed members
(`model`) is the only one tried. The selector narrows a copy of the claim the planner reads,
never the claim written, and is part of the claim's key like any selector, so no memoised
search of one model serves another.

Members close together: each member after the first is planned first on the nodes the members
before it use, then on the nodes that share each of the admin's domain labels with those
(`PlannerSettings.group_domains`, innermost first: a rack label, then the zone), and only then
anywhere. A group that names a required domain (`domain`, a node label) is planned on the nodes
of one value of that label at a time, the values in the order of their names, and waits when
no single value has room for all of it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.cards import card_product
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.kube import names, objects

Member = tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]  # (pod, its gateway claims)


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """Every member's plan (in the order given), or how many fit and why the next did not."""

    plans: tuple[PodPlan, ...]
    fitted: int  # members placed before the first that was not
    reason: str | None = None  # why member `fitted` was not placed; None: all were
    quota_reason: str | None = None
    model: str | None = None  # the one model every member's cards are of (same_model)

    @property
    def placed(self) -> bool:
        return self.reason is None


def model_selector(model: str) -> str:
    """A device selector for cards of `model`, guarded: false, never an error, on a device
    without a productName."""
    attrs = f"device.attributes[{json.dumps(names.DRIVER)}]"
    return (f"{json.dumps(names.ATTR_PRODUCT_NAME)} in {attrs} && "
            f"{attrs}.{names.ATTR_PRODUCT_NAME} == {json.dumps(model)}")


def _narrowed(request: Mapping[str, Any], selector: Mapping[str, Any]) -> dict[str, Any]:
    return {**request, "selectors": [*(request.get("selectors") or ()), selector]}


def narrow_to_model(claim: Mapping[str, Any], model: str) -> dict[str, Any]:
    """A copy of `claim` whose every request (and every alternative of a firstAvailable)
    asks for cards of `model` too; the claim itself is left as it is."""
    selector = {"cel": {"expression": model_selector(model)}}
    spec = claim.get("spec") or {}
    devices = spec.get("devices") or {}
    requests = []
    for request in devices.get("requests") or ():
        request = dict(request)
        if request.get("exactly") is not None:
            request["exactly"] = _narrowed(request["exactly"], selector)
        if request.get("firstAvailable"):
            request["firstAvailable"] = [_narrowed(sub, selector)
                                         for sub in request["firstAvailable"]]
        requests.append(request)
    return {**claim, "spec": {**spec, "devices": {**devices, "requests": requests}}}


def _allocated(state: ClusterState,
               allocations: Iterable[Mapping[str, Any]]) -> Iterator[Device | None]:
    """The published devices `allocations` (status.allocation values) hold, None for one the
    state does not know."""
    for allocation in allocations:
        for result in (allocation.get("devices") or {}).get("results") or ():
            yield state.devices.get((result.get("driver"), result.get("pool"),
                                     result.get("device")))


def _claims_allocations(placed: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [(c.get("status") or {}).get("allocation") or {} for c in placed]


def plan_models(state: ClusterState, plan: PodPlan) -> Counter[str | None]:
    """The models of the devices a plan allocates (None: a device without a productName)."""
    return Counter(card_product(d) if d is not None else None
                   for d in _allocated(state, plan.allocations.values()))


def group_model(state: ClusterState, placed: Sequence[Mapping[str, Any]]) -> str | None:
    """The model of the cards allocated to a group's placed members (`placed`: their claims),
    the most common one should they hold several; None when they hold no card of a model."""
    found = Counter(m for d in _allocated(state, _claims_allocations(placed))
                    if d is not None and (m := card_product(d)) is not None)
    return found.most_common(1)[0][0] if found else None


def _sharing_label(state: ClusterState, nodes: Iterable[str], label: str) -> set[str] | None:
    """The nodes whose node label `label` has a value one of `nodes` has; None when none of
    them has the label."""
    values = {state.nodes[n].labels.get(label) for n in nodes if n in state.nodes}
    values.discard(None)
    if not values:
        return None
    return {n for n, info in state.nodes.items() if info.labels.get(label) in values}


def domain_nodes(state: ClusterState, placed: Sequence[Mapping[str, Any]],
                 label: str) -> list[str] | None:
    """The nodes sharing node label `label`'s value with the nodes a group's placed members'
    claims (`placed`) hold devices on; None when they hold none on a node with the label (any
    value will do)."""
    held = {d.node for d in _allocated(state, _claims_allocations(placed))
            if d is not None and d.node}
    sharing = _sharing_label(state, held, label)
    return sorted(sharing) if sharing is not None else None


def published_models(state: ClusterState) -> list[str]:
    """Every GPU model the gateway's slices publish, by name."""
    return sorted({m for d in state.devices.values()
                   if d.driver == names.DRIVER and (m := card_product(d)) is not None})


def plan_group(state: ClusterState, members: Sequence[Member], *,
               strategy: str | None = None, same_model: bool = False,
               model: str | None = None, domain: str | None = None) -> GroupPlan:
    """Plan `members` together (see the module); the state is left as it was."""
    if domain is not None:
        return _in_one_domain(state, members, domain, strategy=strategy,
                              same_model=same_model, model=model)
    return _on_one_model(state, members, strategy=strategy, same_model=same_model, model=model,
                         within=None)


def _on_one_model(state: ClusterState, members: Sequence[Member], *, strategy: str | None,
                  same_model: bool, model: str | None,
                  within: frozenset[str] | None) -> GroupPlan:
    if not same_model:
        return _plan_members(state, members, strategy, within)
    if model is None:
        free = _plan_members(state, members, strategy, within)
        used: Counter[str | None] = Counter()
        for plan in free.plans:
            used.update(plan_models(state, plan))
        if free.placed and len(used) <= 1:
            return GroupPlan(free.plans, free.fitted, model=next(iter(used), None))
        tried = [m for m, _ in used.most_common() if m is not None]
        candidates = tried + [m for m in published_models(state) if m not in tried]
    else:
        candidates = [model]
    outcomes: list[tuple[str, GroupPlan]] = []
    for candidate in candidates:
        narrowed = [(pod, [narrow_to_model(c, candidate) for c in claims])
                    for pod, claims in members]
        planned = _plan_members(state, narrowed, strategy, within)
        if planned.placed:
            return GroupPlan(planned.plans, planned.fitted, model=candidate)
        outcomes.append((candidate, planned))
    return _no_model(members, outcomes, held=model)


def _no_model(members: Sequence[Member], outcomes: Sequence[tuple[str, GroupPlan]],
              held: str | None) -> GroupPlan:
    """No model has room for them all: the model where most fit speaks for the group, and
    the reason says how far each model got."""
    if not outcomes:
        return GroupPlan((), 0, "no GPU model is published for the group's claims")
    best_model, best = max(outcomes, key=lambda o: o[1].fitted)
    if held is not None:
        reason = (f"its placed members hold cards of model {held}, and {best.fitted} of "
                  f"{len(members)} fit on that model ({best.reason})")
    else:
        tried = "; ".join(f"{m}: {o.fitted} of {len(members)} fit ({o.reason})"
                          for m, o in outcomes)
        reason = f"its members need cards of one model, and no model has room for all: {tried}"
    return GroupPlan(best.plans, best.fitted, reason, best.quota_reason, model=best_model)


def _in_one_domain(state: ClusterState, members: Sequence[Member], label: str, *,
                   strategy: str | None, same_model: bool, model: str | None) -> GroupPlan:
    """The group on the nodes of one value of node label `label`, one value after another."""
    by_value: dict[str, list[str]] = {}
    for name, info in state.nodes.items():
        value = info.labels.get(label)
        if value is not None:
            by_value.setdefault(value, []).append(name)
    if not by_value:
        return GroupPlan((), 0, f"its members must share the node label {label}, and no node "
                                "has it")
    tried: list[tuple[str, GroupPlan]] = []
    for value in sorted(by_value):
        found = _on_one_model(state, members, strategy=strategy, same_model=same_model,
                              model=model, within=frozenset(by_value[value]))
        if found.placed:
            return found
        tried.append((value, found))
    value, best = max(tried, key=lambda t: t[1].fitted)
    return GroupPlan(best.plans, best.fitted,
                     f"its members must share the node label {label}, and no value has room "
                     f"for all: most fit in {label}={value}, {best.fitted} of {len(members)} "
                     f"({best.reason})", best.quota_reason, best.model)


def _plan_members(state: ClusterState, members: Sequence[Member], strategy: str | None,
                  within: frozenset[str] | None) -> GroupPlan:
    """Each member in turn on the state the ones before it left (`within`: the only nodes
    they may use)."""
    assumed: list[tuple[Mapping[str, Any], PodPlan]] = []
    try:
        for pod, claims in members:
            plan = _plan_member(state, pod, list(claims), strategy,
                                [p.node_name for _, p in assumed if p.node_name], within)
            if plan.node_name is None:
                label = "/".join(objects.namespace_name(pod))
                return GroupPlan(tuple(p for _, p in assumed), len(assumed),
                                 plan.reason or f"pod {label}: no node fits it",
                                 plan.quota_reason)
            state.assume(pod, plan)
            assumed.append((pod, plan))
        return GroupPlan(tuple(p for _, p in assumed), len(assumed))
    finally:
        for pod, plan in reversed(assumed):
            state.forget(pod, plan)


def _plan_member(state: ClusterState, pod: Mapping[str, Any],
                 claims: list[Mapping[str, Any]], strategy: str | None, used: list[str],
                 within: frozenset[str] | None) -> PodPlan:
    """One member: on the nodes the members before it use, then in their domains (the
    admin's labels, innermost first), then anywhere (`within`, when given, bounds them all)."""
    tiers: list[set[str]] = []
    if used:
        tiers.append(set(used))
        for label in state.settings.group_domains:
            sharing = _sharing_label(state, used, label)
            if sharing is not None:
                tiers.append(sharing)
    for tier in tiers:
        nodes = tier & within if within is not None else tier
        if nodes:
            plan = plan_pod(state, pod, claims, strategy=strategy, nodes=sorted(nodes))
            if plan.node_name is not None:
                return plan
    return plan_pod(state, pod, claims, strategy=strategy,
                    nodes=sorted(within) if within is not None else None)


__all__ = ["GroupPlan", "Member", "domain_nodes", "group_model", "model_selector",
           "narrow_to_model", "plan_group", "plan_models", "published_models"]
