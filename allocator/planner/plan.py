"""`plan_pod`: one node and the devices of every claim of one pod, or why not.

The entry point used by the controller and the benchmark alike. Nodes are visited by
equivalence class (`ClusterState.groups`): one device search per class state and claim shape,
memoised, and for each pod signature a ranking of the feasible classes kept up to date from the
log of classes that changed, so a pod costs the nodes that changed since a pod like it was
planned, not the whole cluster. Cheap checks (CPU, memory, taints) prune classes before any
search. Pods the rankings cannot serve (node affinity, a claim already allocated, selectors on
identity attributes) take a full pass over the classes.

GPU policies (`state.set_policies`): a pod whose namespace's sharing rules its requests break
by themselves (exclusive, minShare, requireCores, allowedEnforcement) does not fit anywhere;
the rules that depend on the card are applied in the device search. Rankings of shares are
kept once for every namespace, without tenant and maxClaimsPerDevice, and each pod walks its
ranking best first asking its own rules of the cards picked (`_walk`). Quotas are checked around
the search: a pod behind an earlier pod waiting for one of its quotas waits too (creation
order); one whose least cost exceeds a quota (stated amounts, whole cards, relative memory on the
smallest card) is refused without a search; otherwise the best plan's charges are checked
against the ledger, and only if they exceed (the card decides: a quota scoped by a device
selector, cards the namespace already touches) are the other feasible nodes tried, best first
(the walk read on).

Pure: no I/O, no clock, no logging; it touches only the state's memos, rankings and learned
workload. It never writes to the API: the controller writes what it returns.

The allocations a plan writes are built in `allocation`.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.allocation import PodPlan, build_plan
from dra_gateway.allocator.planner.demand import ClaimDemand, memory_for, share_strategy
from dra_gateway.allocator.planner.devices import NANO
from dra_gateway.allocator.planner.policies import (
    NO_HOLDERS,
    Waiting,
    card_rules,
    exceeded_by_least_cost,
    memo_rules,
)
from dra_gateway.allocator.planner.scoring import FULL, TaskType, task_of
from dra_gateway.allocator.planner.search import (
    RULES_PLACEHOLDER,
    TENANT_PLACEHOLDER,
    NodeSearch,
    Outcome,
    claim_placeholder,
    fill_claims,
    fits_node,
    refused_picks,
    score,
)
from dra_gateway.allocator.planner.settings import STRATEGIES
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.kube import names, objects
from dra_gateway.policy.admission import check_admission
from dra_gateway.policy.amounts import RequestShape
from dra_gateway.policy.quotas import Exceeded, Quota
from dra_gateway.policy.sharing import SharingRules

HAMI_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
_HAMI_STRATEGIES = {"binpack": "binpack", "spread": "spread"}
_MEMO_LIMIT = 200_000
_RANKINGS_LIMIT = 4_096


QUOTA_EXCEEDED = "QuotaExceeded"
QUEUED_FOR_QUOTA = "QueuedForQuota"

# A node where a pod fits: its score, its name and the devices found.
_Candidate = tuple[tuple[float, ...], str, Outcome]
_Candidates = Generator[_Candidate, None, None]


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
    for demand in demands:
        named = share_strategy(demand.configs)
        if named in STRATEGIES:
            return named
    annotation = objects.annotations(pod).get(HAMI_POLICY_ANNOTATION)
    if annotation in _HAMI_STRATEGIES:
        return _HAMI_STRATEGIES[annotation]
    if strategy in STRATEGIES:
        return strategy
    return state.settings.default_strategy


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
    namespace = objects.namespace(pod)
    policies = state.policies
    rules = policies.rules(namespace) if policies.sharing_active else None
    shapes = [state.shapes(k, c.get("spec") or {}) for c, k, _ in to_plan]
    claims_sig = tuple(k for _, k, _ in to_plan)
    if rules is not None and not rules.empty and not policies.admitted(namespace, claims_sig):
        violations = check_admission(what=f"pod {pod_label}", claims=shapes, quotas=(),
                                     sharing=rules)
        if violations:
            return PodPlan(None, reason="; ".join(v.message for v in violations))
        policies.admit(namespace, claims_sig)
    quotas = policies.quotas_for(namespace, shapes, claims_key=claims_sig) \
        if to_plan and policies.has_quotas(namespace) else []
    if quotas:
        held = _held_for_quota(state, pod, quotas, shapes, claims_sig)
        if held is not None:
            return held
    chosen_strategy = resolve_strategy(state, pod, [d for _, _, d in to_plan], strategy)
    cpu, memory = kubefit.pod_requests(pod)
    tolerations = (pod.get("spec") or {}).get("tolerations") or ()
    labelled = [(_claim_label(c), d) for c, _, d in to_plan]
    if not state.workload_given:
        state.workload.observe(_task(state, cpu, memory, labelled))
    identity = any(d.identity_sensitive for _, d in labelled)
    version = state.workload.version if chosen_strategy == "default" else 0
    own_shares, relative = _own_shares([d for _, _, d in to_plan])
    if rules is not None and not policies.memoisable(own_shares):
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
    card_key = card_rules(search_rules, relative_shares=relative)
    ctx = _Context(state, labelled, chosen_strategy, cpu, memory, tolerations,
                   (claims_sig, chosen_strategy, version, card_key), search_rules,
                   ranked_rules, own_shares,
                   own_shares > 0 and all(alt.class_name == names.GPU_CLASS
                                          for _, _, d in to_plan for r in d.requests
                                          for alt in r.alternatives))
    pod_sig = (claims_sig, cpu, memory,
               json.dumps(tolerations, sort_keys=True) if tolerations else "", chosen_strategy,
               version, card_key)
    state.refresh_groups()
    if len(state.memo) > _MEMO_LIMIT:
        state.node_classes.age_memo()
    if len(state.rankings) > _RANKINGS_LIMIT:
        state.rankings.clear()
    spec = pod.get("spec") or {}
    needs_labels = bool(spec.get("nodeSelector") or spec.get("affinity"))
    candidates: Callable[[], _Candidates]
    if pinned is None and not needs_labels and not identity:
        ranking = _caught_up(ctx, pod_sig)
        refused: dict[tuple[object, ...], str] = {}
        with closing(_walk(ctx, ranking, refused)) as walk:
            found = next(walk, None)
        if found is None:  # the walk read every class: `refused` has them all
            plan = PodPlan(None, reason=_no_node_reason(
                pod_label, state, _ranking_reasons(state, ranking, refused), labelled, rules))
        else:
            plan = build_plan(state, found[1], to_plan, found[2], charges=bool(quotas))
        candidates = lambda: _walk(ctx, ranking, {})  # noqa: E731
    else:
        plan = _scan(ctx, pod, to_plan, pod_label, pinned=pinned, needs_labels=needs_labels,
                     identity=identity, charges=bool(quotas))
        candidates = lambda: _feasible(  # noqa: E731
            ctx, pod, pinned=pinned, needs_labels=needs_labels, identity=identity)
    if not quotas:
        return plan
    if plan.node_name is None:
        # Within its quotas but no room: it waits for room like any pod, not at the head of
        # the quota's queue (where it would hold back every later pod of the namespace).
        policies.queue.leave(objects.uid(pod))
        return plan
    return _within_quota(ctx, pod, to_plan, plan, quotas, candidates)


def _waiting(pod: Mapping[str, Any], quotas: Iterable[Quota]) -> Waiting:
    meta = objects.meta(pod)
    return Waiting(created=str(meta.get("creationTimestamp") or ""),
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
        ahead = policies.queue.ahead_of(entry.namespace, entry.created, entry.name, entry.uid,
                                        entry.quotas)
        if ahead is not None:
            shared = entry.quotas & ahead.quotas
            policies.queue.wait(Waiting(entry.created, entry.name, entry.namespace, entry.uid,
                                        shared))
            names_ = ", ".join(sorted(k[1] for k in shared))
            return PodPlan(None, reason=(
                f"waiting for quota {names_} behind pod {ahead.label}, created earlier: pods "
                f"waiting for a quota are placed in creation order"),
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


def _within_quota(ctx: _Context, pod: Mapping[str, Any],
                  to_plan: Sequence[tuple[Mapping[str, Any], str, ClaimDemand]], plan: PodPlan,
                  quotas: Sequence[Quota], candidates: Callable[[], _Candidates],
                  ) -> PodPlan:
    """The plan if its charges fit the quotas, else the best other node's that does (from
    `candidates`, the nodes where the pod fits, best first), else the pod waits for quota."""
    state = ctx.state
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
    return PodPlan(plan.node_name, plan.allocations, plan.annotations, None, charges=charges)


def _groups(state: ClusterState, pinned: set[str] | None,
            ) -> Iterable[tuple[tuple[object, ...], list[str]]]:
    """The node classes to visit: all of them, or only those of the pinned nodes (a pod pinned
    to one node costs one class, not a pass over the cluster)."""
    if pinned is None:
        return state.groups.items()
    keys = dict.fromkeys(state.node_group[n] for n in sorted(pinned) if n in state.node_group)
    return [(key, state.groups[key]) for key in keys]


def _feasible(ctx: _Context, pod: Mapping[str, Any], *, pinned: set[str] | None,
              needs_labels: bool, identity: bool) -> _Candidates:
    """Every node class's best member where the pod fits, best first, for pods the rankings
    cannot serve."""
    state = ctx.state
    found: list[_Candidate] = []
    for group_key, members in _groups(state, pinned):
        candidates: Sequence[str] = members
        if pinned is not None:
            candidates = [m for m in members if m in pinned]
        if not candidates or fits_node(state, candidates[0], ctx.cpu, ctx.memory,
                                       ctx.tolerations) is not None:
            continue
        for member in candidates:
            if needs_labels and not kubefit.pod_accepts_node(pod, member,
                                                             state.nodes[member].labels):
                continue
            outcome, node_score = ctx.evaluate(None if identity else group_key, member)
            if outcome.ok:
                found.append((node_score, member, outcome))
            if not identity:
                break
    found.sort(key=lambda e: (e[0], e[1]))
    yield from found


# Where every card is held whole or by tenants the pod is isolated from, and none is free.
_BARRED = Outcome(False, reason=(
    f"claim {claim_placeholder(0)}: every GPU of the node is held whole or by another tenant, "
    f"isolated from {TENANT_PLACEHOLDER} (isolation), {RULES_PLACEHOLDER}"))


@dataclass(slots=True)
class _Context:
    state: ClusterState
    claims: Sequence[tuple[str, ClaimDemand]]
    strategy: str
    cpu: int
    memory: int
    tolerations: Sequence[Mapping[str, Any]]
    device_sig: tuple[object, ...]  # what device search results depend on besides the node
    rules: SharingRules | None = None  # the namespace's sharing rules, when any policy exists
    # The rules rankings are kept for: a share's without its tenant and maxClaimsPerDevice
    # (`_walk` asks them of the cards the best nodes pick).
    ranked_rules: SharingRules | None = None
    own_shares: int = 0  # shares of the pod that may land on one card
    # The pod shares cards and asks for gateway GPUs only: it fits no node whose GPUs are all
    # held by tenants it is isolated from (a pod of whole cards is told by its search).
    gpus_only: bool = False

    def evaluate(self, group_key: tuple[object, ...] | None, node: str, *,
                 ranked: bool = False) -> tuple[Outcome, tuple[float, ...]]:
        """Devices for the pod on `node` (memoised per node class) and the strategy's score,
        under the namespace's rules (`ranked`: under the rules its ranking is kept for)."""
        outcome = self.outcome(group_key, node, ranked=ranked)
        if not outcome.ok:
            return outcome, ()
        return outcome, self.score_of(node, outcome)

    def outcome(self, group_key: tuple[object, ...] | None, node: str, *,
                ranked: bool = False) -> Outcome:
        """`evaluate`'s devices, without the score."""
        state = self.state
        rules = self.ranked_rules if ranked else self.rules
        outcome: Outcome | None = None
        memo_key: tuple[object, ...] | None = None
        if group_key is not None and ranked:
            # Rankings' searches read neither tenants nor limits (`PlannerPolicies.planned`),
            # nor, for whole cards, who holds a card: only the cards' usage.
            memo_key = (group_key[0], group_key[5], self.device_sig, None)
        elif group_key is not None:
            summary = state.holder_summary(group_key)
            if rules is not None and self.gpus_only and summary.barred(rules.tenant):
                return _BARRED
            neutral = summary.neutral_for(rules.tenant) if rules is not None else None
            # Isolation cannot change the search there: as on a node of no isolated holder.
            usage = group_key[1] if neutral is None else neutral
            memo_key = (group_key[0], usage, self.device_sig,
                        None if summary is NO_HOLDERS
                        else memo_rules(rules, summary, self.own_shares))
        classes = state.node_classes
        if memo_key is not None:
            outcome = classes.memo.get(memo_key)
            if outcome is None:
                outcome = classes.memo_old.get(memo_key)
                if outcome is not None:
                    classes.memo[memo_key] = outcome
        if outcome is None:
            outcome = NodeSearch(state, node, self.claims, strategy=self.strategy,
                                 workload=state.workload,
                                 budget=state.settings.search_budget, rules=rules).run()
            if memo_key is not None:
                classes.memo[memo_key] = outcome
        return outcome

    def score_of(self, node: str, outcome: Outcome) -> tuple[float, ...]:
        cpu_free, mem_free = self.state.node_free(node)
        return score(outcome, self.strategy, self.state.workload, cpu_free=cpu_free,
                     mem_free=mem_free, cpu=self.cpu, memory=self.memory)


def _scan(ctx: _Context, pod: Mapping[str, Any],
          to_plan: Sequence[tuple[Mapping[str, Any], str, ClaimDemand]], pod_label: str, *,
          pinned: set[str] | None, needs_labels: bool, identity: bool,
          charges: bool = False) -> PodPlan:
    """Every node class, for pods the rankings cannot serve (pinned, node affinity, selectors
    on identity attributes)."""
    state = ctx.state
    best: tuple[tuple[float, ...], str, Outcome] | None = None
    reasons: Counter[str] = Counter()
    for group_key, members in _groups(state, pinned):
        candidates: Sequence[str] = members
        if pinned is not None:
            candidates = [m for m in members if m in pinned]
            if not candidates:
                continue
        pruned = fits_node(state, candidates[0], ctx.cpu, ctx.memory, ctx.tolerations)
        if pruned is not None:
            reasons[pruned] += len(candidates)
            continue
        for member in candidates:
            outcome, node_score = ctx.evaluate(None if identity else group_key, member)
            if not outcome.ok:
                reasons[outcome.reason or "no devices fit"] += 1 if identity else len(candidates)
                if identity:
                    continue
                break
            if best is not None and (node_score, member) >= (best[0], best[1]):
                if identity:
                    continue
                break  # members are sorted by name: later ones cannot win
            if needs_labels and not kubefit.pod_accepts_node(pod, member,
                                                             state.nodes[member].labels):
                reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                continue
            best = (node_score, member, outcome)
            if not identity:
                break
    if best is None:
        return PodPlan(None, reason=_no_node_reason(pod_label, state, reasons, ctx.claims,
                                                    ctx.rules))
    return build_plan(state, best[1], to_plan, best[2], charges=charges)


@dataclass(slots=True)
class Ranking:
    """Feasible node classes for one pod signature, best first, kept across pods.

    Entries are (score, first member, class key). A class's score never changes (the class
    key is its whole state), so an entry only goes stale when its class empties or its first
    member changes; both are checked when the entry reaches the top. Classes created or joined
    since the signature was last planned are read from the state's log and evaluated then, so
    a pod costs the classes that changed, not the cluster. `failures` keeps why the other
    classes do not fit, for the reason of an unplaceable pod. `ruled` keeps, per class and
    the part of a pod's rules its ranking leaves out (tenant, maxClaimsPerDevice), the score
    and devices under those rules, read again by the next pods alike (a class key is its
    whole state, so they never change).
    """

    heap: list[tuple[tuple[float, ...], str, tuple[object, ...]]]
    position: int
    failures: dict[tuple[object, ...], str]
    ruled: dict[tuple[object, ...], tuple[tuple[float, ...], Outcome]] = field(
        default_factory=dict)


def _caught_up(ctx: _Context, pod_sig: tuple[object, ...]) -> Ranking:
    """The pod signature's ranking, brought up to date with the classes that changed since
    it was last read."""
    state = ctx.state
    ranking: Ranking | None = state.rankings.get(pod_sig)
    log = state.group_log
    fresh: Iterable[tuple[object, ...]]
    if ranking is None:
        ranking = Ranking([], len(log), {})
        state.rankings[pod_sig] = ranking
        fresh = list(state.groups)
    else:
        # Only classes created or joined since: at most the nodes that changed.
        fresh = set(log[ranking.position:])
        ranking.position = len(log)
        if len(ranking.heap) > 2 * len(state.groups) + 64:
            ranking.heap = [e for e in ranking.heap
                            if (state.groups.get(e[2]) or ("",))[0] == e[1]]
            heapq.heapify(ranking.heap)
    heap = ranking.heap
    failures = ranking.failures
    for group_key in fresh:
        members = state.groups.get(group_key)
        if not members:
            continue
        pruned = fits_node(state, members[0], ctx.cpu, ctx.memory, ctx.tolerations)
        if pruned is not None:
            failures[group_key] = pruned
            continue
        outcome, node_score = ctx.evaluate(group_key, members[0], ranked=True)
        if outcome.ok:
            heapq.heappush(heap, (node_score, members[0], group_key))
        else:
            failures[group_key] = outcome.reason or "no devices fit"
    return ranking


def _live_head(heap: list[tuple[tuple[float, ...], str, tuple[object, ...]]],
               groups: Mapping[tuple[object, ...], Sequence[str]],
               ) -> tuple[tuple[float, ...], str, tuple[object, ...]] | None:
    """The ranking heap's best entry, after dropping entries of classes that are gone and
    re-keying those whose first node changed (the heap is brought up to date lazily); None
    when it is empty."""
    while heap:
        node_score, name, group_key = heap[0]
        members = groups.get(group_key)
        if not members:
            heapq.heappop(heap)
        elif members[0] != name:
            heapq.heapreplace(heap, (node_score, members[0], group_key))
        else:
            return heap[0]
    return None


def _ranking_reasons(state: ClusterState, ranking: Ranking,
                     more: Mapping[tuple[object, ...], str]) -> Counter[str]:
    counts: dict[str, int] = {}
    live: dict[tuple[object, ...], str] = {}
    groups = state.groups
    for group_key, reason in ranking.failures.items():
        members = groups.get(group_key)
        if members:
            live[group_key] = reason
            counts[reason] = counts.get(reason, 0) + len(members)
    ranking.failures = live
    for group_key, reason in more.items():
        members = groups.get(group_key)
        if members and group_key not in live:
            counts[reason] = counts.get(reason, 0) + len(members)
    return Counter(counts)


def _walk(ctx: _Context, ranking: Ranking,
          refused: dict[tuple[object, ...], str]) -> _Candidates:
    """The ranking's classes where the pod fits under its own rules, best first (each as its
    score, first member and outcome); `refused` gets why the others the ranking holds do not
    fit, once the walk has passed them.

    Rankings of shares are kept without the tenant and maxClaimsPerDevice (every namespace's
    pods share them); each can only keep a pod off cards. Entries are taken in order: where
    the pod's rules leave the cards the ranked search picked, the entry stands with its score
    (a search under them walks the same choices and stops at the same picks); otherwise the
    node is scored as the search under the pod's rules places it. A class is given once no
    entry still to be taken can score better. The ranking is left as found, however far the
    caller reads (close the walk).
    """
    state = ctx.state
    heap = ranking.heap
    rules = ctx.rules
    # What of the pod's rules its ranking leaves out; None when they are the ranking's.
    kind = None if rules is None or rules is ctx.ranked_rules \
        else (rules.tenant, rules.max_claims_per_device)
    ruled = ranking.ruled
    if len(ruled) > 4 * len(state.groups) + 1024:
        ruled.clear()
    taken: list[tuple[tuple[float, ...], str, tuple[object, ...]]] = []
    scored: list[tuple[tuple[float, ...], str, int, Outcome]] = []
    try:
        while True:
            head = _live_head(heap, state.groups)
            while scored and (head is None or scored[0][:2] <= head[:2]):
                node_score, name, _, outcome = heapq.heappop(scored)
                yield node_score, name, outcome
            if head is None:
                return
            node_score, name, group_key = head
            taken.append(heapq.heappop(heap))
            if kind is None or rules is None:
                outcome = ctx.outcome(group_key, name, ranked=True)
            else:
                known = ruled.get((group_key, kind))
                if known is None:
                    outcome = ctx.outcome(group_key, name, ranked=True)
                    if refused_picks(state, name, outcome, rules):
                        outcome, node_score = ctx.evaluate(group_key, name)
                    known = ruled[(group_key, kind)] = (node_score, outcome)
                node_score, outcome = known
                if not outcome.ok:
                    refused[group_key] = outcome.reason or "no devices fit"
                    continue
            heapq.heappush(scored, (node_score, name, len(taken), outcome))
    finally:
        for entry in taken:
            heapq.heappush(heap, entry)


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


def _no_node_reason(pod_label: str, state: ClusterState, reasons: Counter[str],
                    claims: Sequence[tuple[str, ClaimDemand]],
                    rules: SharingRules | None = None) -> str:
    total = len(state.node_group)
    if not reasons:
        return f"pod {pod_label}: 0/{total} nodes are available"
    labels = [label for label, _ in claims]
    parts = [f"{count} node(s): {fill_claims(reason, labels, rules)}"
             for reason, count in reasons.most_common(4)]
    return f"pod {pod_label}: 0/{total} nodes fit; " + "; ".join(parts)


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
