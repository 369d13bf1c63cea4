"""`plan_pod`: one node and the devices of every claim of one pod, or why not.

The entry point used by the controller and the benchmark alike: it reads the pod's claims,
checks the sharing rules and quotas, and has the node classes visited (`visit`). Nodes are
visited by equivalence class (`ClusterState.groups`): one device search per class state and
claim shape, memoised, and for each pod signature a ranking of the feasible classes kept up to
date from the log of classes that changed, so a pod costs the nodes that changed since a pod
like it was planned, not the whole cluster. Cheap checks (CPU, memory, taints) prune classes
before any search. Pods the rankings cannot serve (node affinity, a claim already allocated,
selectors on identity attributes) take a full pass over the classes.

GPU policies (`state.set_policies`): a pod whose namespace's sharing rules its requests break
by themselves (exclusive, minShare, requireCores, allowedEnforcement) does not fit anywhere;
the rules that depend on the card are applied in the device search. Rankings of shares are
kept once for every namespace, without tenant and maxClaimsPerDevice, and each pod walks its
ranking best first asking its own rules of the cards picked (`visit.walk_ranking`). Quotas are
checked around the search: a pod behind an earlier pod waiting for one of its quotas waits too
(creation order); one whose least cost exceeds a quota (stated amounts, whole cards, relative
memory on the smallest card) is refused without a search; otherwise the best plan's charges are
checked against the ledger, and only if they exceed (the card decides: a quota scoped by a
device selector, cards the namespace already touches) are the other feasible nodes tried, best
first (the walk read on).

Pure: no I/O, no clock, no logging; it touches only the state's memos, rankings and learned
workload. It never writes to the API: the controller writes what it returns.

The allocations a plan writes are built in `allocation`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any, Final

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.allocation import PodPlan, build_plan
from dra_gateway.allocator.planner.demand import ClaimDemand, memory_for, share_strategy
from dra_gateway.allocator.planner.devices import NANO
from dra_gateway.allocator.planner.fragmentation import FULL, TaskType, task_of
from dra_gateway.allocator.planner.inputs import NodeClassKey, PodInputs, SearchInputs
from dra_gateway.allocator.planner.memokeys import card_rules, memoisable
from dra_gateway.allocator.planner.policies import Waiting, exceeded_by_least_cost
from dra_gateway.allocator.planner.settings import BINPACK, DEFAULT, SPREAD, STRATEGIES
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.allocator.planner.visit import (
    Candidates,
    PodVisit,
    caught_up,
    feasible_nodes,
    no_node_reason,
    ranking_reasons,
    scan_classes,
    walk_ranking,
)
from dra_gateway.kube import names, objects
from dra_gateway.kube.models import Strategy
from dra_gateway.policy.admission import check_admission
from dra_gateway.policy.amounts import RequestShape
from dra_gateway.policy.quotas import Exceeded, Quota
from dra_gateway.policy.sharing import SharingRules

HAMI_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
# HAMi's annotation values (its wire names) and the strategies they mean.
_HAMI_STRATEGIES: Final[Mapping[str, Strategy]] = {"binpack": BINPACK, "spread": SPREAD}
_MEMO_LIMIT = 200_000
_RANKINGS_LIMIT = 4_096


QUOTA_EXCEEDED = "QuotaExceeded"
QUEUED_FOR_QUOTA = "QueuedForQuota"


def _claim_label(claim: Mapping[str, Any]) -> str:
    return "/".join(objects.namespace_name(claim))


def _pinned_node(allocation: Mapping[str, Any]) -> set[str] | None:
    """Nodes an existing allocation's nodeSelector allows by name, None when unrestricted."""
    selector = allocation.get("nodeSelector")
    if not selector:
        return None
    allowed: set[str] = set()
    for term in selector.get("nodeSelectorTerms") or ():
        for expr in term.get("matchFields") or ():
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In":
                allowed.update(expr.get("values") or ())
    return allowed or None


def resolve_strategy(state: ClusterState, pod: Mapping[str, Any],
                     demands: Sequence[ClaimDemand], strategy: str | None) -> str:
    """The packing strategy the pod is planned with: a claim's `GpuShareConfig.policy`, then
    HAMi's pod annotation, then `strategy`, then the state's default.

    A translated claim carries the annotation already (the built-in rules copy it into
    `policy`), so for it the annotation decides nothing here; it is still read for the claims
    written by hand, which carry no policy of their own and follow the pod's annotation."""
    for demand in demands:
        named = share_strategy(demand.configs)
        if named in STRATEGIES:
            return named
    annotated = _HAMI_STRATEGIES.get(objects.annotations(pod).get(HAMI_POLICY_ANNOTATION, ""))
    if annotated is not None:
        return annotated
    if strategy in STRATEGIES:
        return strategy
    return state.settings.default_strategy


@dataclass(frozen=True, slots=True)
class _PodClaims:
    """The pod's claims as the planner reads them: those still to plan, each with its demand key
    (its spec as the planner reads it) and demand, and the only nodes it may use (None: any),
    from the node selectors of its claims already allocated and from the caller."""

    to_plan: list[tuple[Mapping[str, Any], str, ClaimDemand]]
    pinned: set[str] | None
    keys: tuple[str, ...]  # the demand keys of `to_plan`, in its order
    demands: list[ClaimDemand]  # the demands of `to_plan`, in its order


@dataclass(frozen=True, slots=True)
class _PodPolicies:
    """The GPU policies over the pod: its namespace's sharing rules (None while no sharing
    policy exists) and the quotas its claims count against."""

    rules: SharingRules | None
    quotas: list[Quota]


def plan_pod(state: ClusterState, pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]],
             *, strategy: str | None = None, nodes: Iterable[str] | None = None) -> PodPlan:
    """Place every claim of one pod (gateway classes only) on ONE node, jointly, honouring the
    pod's CPU/memory requests, node taints vs pod tolerations, node selector/affinity (required
    terms), and the claims' requests, selectors, constraints and configs. Packing strategy
    precedence: GpuShareConfig.policy of the claim, then pod annotation
    hami.io/gpu-scheduler-policy (binpack|spread), then `strategy`, then
    settings.default_strategy. `nodes`, when given, are the only nodes it may use (defrag
    asks whether a pod fits on one node once some pods have left it)."""
    pod_label = "/".join(objects.namespace_name(pod))
    pod_claims = _read_claims(state, claims, nodes)
    if isinstance(pod_claims, PodPlan):
        return pod_claims
    policies = _apply_policies(state, pod, pod_label, pod_claims)
    if isinstance(policies, PodPlan):
        return policies
    visit, identity = _pod_visit(state, pod, pod_claims, policies.rules, strategy)
    _bound_memos(state)
    plan, candidates = _first_plan(visit, pod, pod_claims, pod_label, identity=identity,
                                   rules=policies.rules, charges=bool(policies.quotas))
    if not policies.quotas:
        return plan
    if plan.node_name is None:
        # Within its quotas but no room: it waits for room like any pod, not at the head of
        # the quota's queue (where it would hold back every later pod of the namespace).
        state.policies.queue.leave(objects.uid(pod))
        return plan
    return _within_quota(visit, pod, pod_claims.to_plan, plan, policies.quotas, candidates)


def _read_claims(state: ClusterState, claims: Sequence[Mapping[str, Any]],
                 nodes: Iterable[str] | None) -> _PodClaims | PodPlan:
    """The claims to plan and the nodes the pod is pinned to, or the plan of a pod one of
    whose claims the planner cannot read."""
    to_plan: list[tuple[Mapping[str, Any], str, ClaimDemand]] = []
    pinned: set[str] | None = None
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            allowed = _pinned_node(allocation)
            if allowed is not None:
                pinned = allowed if pinned is None else pinned & allowed
            continue
        key, demand = state.demand(claim.get("spec") or {})
        if demand.error:
            return PodPlan(None, reason=f"claim {_claim_label(claim)}: {demand.error}")
        to_plan.append((claim, key, demand))
    if nodes is not None:
        pinned = set(nodes) if pinned is None else pinned & set(nodes)
    return _PodClaims(to_plan, pinned, keys=tuple(k for _, k, _ in to_plan),
                      demands=[d for _, _, d in to_plan])


def _apply_policies(state: ClusterState, pod: Mapping[str, Any], pod_label: str,
                    claims: _PodClaims) -> _PodPolicies | PodPlan:
    """The sharing rules and quotas over the pod, or the plan of a pod they refuse or hold
    back before any search (its requests break a sharing rule by themselves; a quota holds
    it)."""
    namespace = objects.namespace(pod)
    policies = state.policies
    rules = policies.rules(namespace) if policies.sharing_active else None
    shapes = [state.shapes(k, c.get("spec") or {}) for c, k, _ in claims.to_plan]
    claims_sig = claims.keys
    if rules is not None and not rules.empty and not policies.admitted(namespace, claims_sig):
        violations = check_admission(what=f"pod {pod_label}", claims=shapes, quotas=(),
                                     sharing=rules)
        if violations:
            return PodPlan(None, reason="; ".join(v.message for v in violations))
        policies.admit(namespace, claims_sig)
    quotas = policies.quotas_for(namespace, shapes, claims_key=claims_sig) \
        if claims.to_plan and policies.has_quotas(namespace) else []
    if quotas:
        held = _held_for_quota(state, pod, quotas, shapes, claims_sig)
        if held is not None:
            return held
    return _PodPolicies(rules, quotas)


def _pod_visit(state: ClusterState, pod: Mapping[str, Any], claims: _PodClaims,
               rules: SharingRules | None, strategy: str | None) -> tuple[PodVisit, bool]:
    """The pod's visit of the node classes, with its named inputs (the learned workload
    observes the pod first), and whether its searches depend on which card (selectors on
    identity attributes, more of its own shares on one card than the class key counts): then
    no ranking or memo serves it."""
    policies = state.policies
    namespace = objects.namespace(pod)
    chosen_strategy = resolve_strategy(state, pod, claims.demands, strategy)
    cpu, memory = kubefit.pod_requests(pod)
    tolerations = (pod.get("spec") or {}).get("tolerations") or ()
    labelled = [(_claim_label(c), d) for c, _, d in claims.to_plan]
    if not state.workload_given:
        state.workload.observe(_task(state, cpu, memory, labelled))
    identity = any(d.identity_sensitive for _, d in labelled)
    version = state.workload.version if chosen_strategy == DEFAULT else 0
    own_shares, relative = _own_shares(claims.demands)
    if rules is not None and not memoisable(policies.count_from, own_shares):
        identity = True  # more of its own shares on one card than the class key counts
    search_rules = ranked_rules = rules
    if rules is not None:
        # Whole cards only, or no claim: isolation, maxClaimsPerDevice, exclusive and minShare
        # rule shares alone, so the pod plans as one of no tenant and no limit, and shares
        # the searches and rankings of every namespace that allows the same models. Shares
        # rank without tenant and limit, for every namespace alike.
        search_rules, ranked_rules = policies.planned(namespace, shares=own_shares > 0)
    # Searches and rankings are keyed by the parts of the rules that decide which card fits,
    # not by the rules: namespaces under different policies share them (see memo_rules).
    search = SearchInputs(claims=claims.keys, strategy=chosen_strategy, workload=version,
                          card_rules=card_rules(search_rules, relative_shares=relative),
                          topology=state.settings.topology,
                          budget=state.settings.search_budget)
    pod_sig = PodInputs(search, cpu, memory,
                        json.dumps(tolerations, sort_keys=True) if tolerations else "")
    gpus_only = own_shares > 0 and all(alt.class_name == names.GPU_CLASS
                                       for d in claims.demands for r in d.requests
                                       for alt in r.alternatives)
    visit = PodVisit(state, pod_sig, labelled, tolerations, search_rules, ranked_rules,
                     own_shares, gpus_only)
    return visit, identity


def _bound_memos(state: ClusterState) -> None:
    """The node classes brought up to date, the memoised searches and rankings kept bounded."""
    state.refresh_groups()
    if len(state.memo) > _MEMO_LIMIT:
        state.node_classes.age_memo()
    if len(state.rankings) > _RANKINGS_LIMIT:
        state.rankings.clear()


def _first_plan(visit: PodVisit, pod: Mapping[str, Any], claims: _PodClaims, pod_label: str,
                *, identity: bool, rules: SharingRules | None,
                charges: bool) -> tuple[PodPlan, Callable[[], Candidates]]:
    """The best node's plan, before quotas, from the pod signature's ranking or a full pass
    over the classes, and the nodes where the pod fits, best first, from the same walk."""
    state = visit.state
    spec = pod.get("spec") or {}
    needs_labels = bool(spec.get("nodeSelector") or spec.get("affinity"))
    pinned = claims.pinned
    if pinned is not None or needs_labels or identity or not state.settings.rankings:
        plan = scan_classes(visit, pod, claims.to_plan, pod_label, pinned=pinned,
                            needs_labels=needs_labels, identity=identity, charges=charges)
        return plan, lambda: feasible_nodes(
            visit, pod, pinned=pinned, needs_labels=needs_labels, identity=identity)
    ranking = caught_up(visit, visit.inputs)
    refused: dict[NodeClassKey, str] = {}
    with closing(walk_ranking(visit, ranking, refused)) as walk:
        found = next(walk, None)
    if found is None:  # the walk read every class: `refused` has them all
        plan = PodPlan(None, reason=no_node_reason(
            pod_label, state, ranking_reasons(state, ranking, refused), visit.claims, rules))
    else:
        plan = build_plan(state, found[1], claims.to_plan, found[2], charges=charges)
    return plan, lambda: walk_ranking(visit, ranking, {})


def _waiting(pod: Mapping[str, Any], quotas: Iterable[Quota]) -> Waiting:
    meta = objects.meta(pod)
    return Waiting(rank=-objects.pod_priority(pod),
                   created=str(meta.get("creationTimestamp") or ""),
                   name=str(meta.get("name", "")), namespace=objects.namespace(pod),
                   uid=objects.uid(pod), quotas=frozenset(q.key for q in quotas))


def _quota_message(exceeded: Sequence[Exceeded]) -> str:
    return "; ".join(e.message for e in exceeded)


def _held_for_quota(state: ClusterState, pod: Mapping[str, Any], quotas: Sequence[Quota],
                    shapes: Sequence[Sequence[RequestShape]],
                    claims_key: tuple[str, ...]) -> PodPlan | None:
    """The plan of a pod its quotas hold back before any search, or None (`claims_key`: the
    specs of the claims `shapes` were read from)."""
    policies = state.policies
    if policies.queue.any_waiting(objects.namespace(pod)):
        entry = _waiting(pod, quotas)
        ahead = policies.queue.ahead_of(entry.namespace, entry.rank, entry.created,
                                        entry.name, entry.uid, entry.quotas)
        if ahead is not None:
            shared = entry.quotas & ahead.quotas
            policies.queue.wait(Waiting(entry.rank, entry.created, entry.name, entry.namespace,
                                        entry.uid, shared))
            names_ = ", ".join(sorted(k[1] for k in shared))
            why = "of higher priority" if ahead.rank < entry.rank else "created earlier"
            return PodPlan(None, reason=(
                f"waiting for quota {names_} behind pod {ahead.label}, {why}: pods waiting for "
                f"a quota are placed by priority, then in creation order"),
                quota_reason=QUEUED_FOR_QUOTA)
    never, now = exceeded_by_least_cost(policies, quotas, shapes,
                                        smallest_card=state.smallest_card_memory(),
                                        claims_key=claims_key)
    if never:
        policies.queue.leave(objects.uid(pod))
        return PodPlan(None, reason=(
            f"{_quota_message(never)}; the pod alone is more than the quota allows, so it "
            f"could never run: ask for less or raise spec.hard"),
            quota_reason=QUOTA_EXCEEDED, quota=tuple(never))
    if now:
        policies.queue.wait(_waiting(pod, [e.quota for e in now]))
        return PodPlan(None, reason=_quota_message(now), quota_reason=QUOTA_EXCEEDED,
                       quota=tuple(now))
    return None


def _within_quota(visit: PodVisit, pod: Mapping[str, Any],
                  to_plan: Sequence[tuple[Mapping[str, Any], str, ClaimDemand]], plan: PodPlan,
                  quotas: Sequence[Quota], candidates: Callable[[], Candidates],
                  ) -> PodPlan:
    """The plan if its charges fit the quotas, else the best other node's that does (from
    `candidates`, the nodes where the pod fits, best first), else the pod waits for quota."""
    state = visit.state
    policies = state.policies
    namespace = objects.namespace(pod)
    charges = plan.charges  # from the search's picks (build_plan)
    exceeded = policies.ledger.excess(namespace, list(charges.values()))
    if exceeded:
        # The card decides (a quota scoped by a device selector, cards the namespace already
        # touches, the memory of a whole card): try the other feasible nodes, best first.
        with closing(candidates()) as walk:
            for _, member, outcome in walk:
                if member == plan.node_name:
                    continue
                candidate = build_plan(state, member, to_plan, outcome, charges=True)
                candidate_charges = candidate.charges
                if not policies.ledger.excess(namespace, list(candidate_charges.values())):
                    plan, charges, exceeded = candidate, candidate_charges, []
                    break
    if exceeded:
        policies.queue.wait(_waiting(pod, [e.quota for e in exceeded]))
        return PodPlan(None, reason=_quota_message(exceeded), quota_reason=QUOTA_EXCEEDED,
                       quota=tuple(exceeded))
    policies.queue.leave(objects.uid(pod))
    annotations = plan.annotations
    borrowed = policies.ledger.borrows(namespace, list(charges.values()))
    if borrowed:
        # Marked on its claims: what runs on quota borrowed from a cohort.
        cohorts = ",".join(sorted({q.cohort for q in borrowed if q.cohort}))
        annotations = {uid: {**annotations.get(uid, {}), names.ANNOTATION_BORROWED: cohorts}
                       for uid in plan.allocations}
    return PodPlan(plan.node_name, plan.allocations, annotations, None, charges=charges)


def _own_shares(demands: Sequence[ClaimDemand]) -> tuple[int, bool]:
    """How many shares of the pod may land on one card (a request for all devices counts as
    unbounded), and whether any share's memory is relative to the card."""
    shares = 0
    relative = False
    for demand in demands:
        for request in demand.requests:
            most = 0
            for alt in request.alternatives:
                if alt.whole:
                    continue
                most = max(most, 1 << 20 if alt.all_devices else alt.count)
                if alt.share.memory_percent is not None \
                        and names.CAPACITY_MEMORY not in alt.capacity:
                    relative = True
            shares += most
    return shares, relative


def _task(state: ClusterState, cpu: int, memory: int,
          claims: Sequence[tuple[str, ClaimDemand]]) -> TaskType:
    """The pod as a task type of the learned workload (shares relative to a typical card)."""
    shares: list[int] = []
    typical = state.typical_card_memory()
    for _, demand in claims:
        for request in demand.requests:
            alt = request.alternatives[0]
            if alt.class_name != names.GPU_CLASS:
                continue
            count = max(alt.count, 1)
            if alt.whole:
                shares.extend([FULL] * count)
                continue
            milli = 0
            if alt.share.cores is not None:
                milli = alt.share.cores * 10
            mem = alt.capacity.get(names.CAPACITY_MEMORY)
            mem_bytes = mem // NANO if mem is not None else memory_for(alt.share, typical)
            if mem_bytes is not None and typical:
                milli = max(milli, mem_bytes * FULL // typical)
            shares.extend([min(max(milli, 1), FULL)] * count)
    return task_of(cpu, memory, shares)
