"""Visiting node classes for one pod: the memoised search per class, a full scan, the rankings.

`PodVisit` is one pod's visit of the node classes: it searches a node class once
(`NodeSearch`, memoised in `ClusterState.memo` per class state, claim shape and the part of the
rules the class's held cards make relevant, `memokeys.memo_rules`) and scores the result. Pods
the rankings can serve walk their pod signature's `Ranking` best first (`caught_up`: brought up
to date with the classes created or joined since, and those left; `walk_ranking`: each class's
score under the pod's own rules, asking `refused_picks` of the cards the ranked search picked);
the others take a full pass (`scan_classes`, `feasible_nodes`). Cheap checks (`fits_node`: CPU,
memory, taints) prune classes before any search; `score` is the packing strategy's score of a
node's placement. `plan.plan_pod` decides which walk, around the quotas. Pure: no I/O.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.allocation import PodPlan, build_plan
from dra_gateway.allocator.planner.cards import card_product
from dra_gateway.allocator.planner.demand import ClaimDemand
from dra_gateway.allocator.planner.fragmentation import Workload
from dra_gateway.allocator.planner.inputs import NodeClassKey, PodInputs, SearchInputs
from dra_gateway.allocator.planner.memokeys import memo_rules
from dra_gateway.allocator.planner.reasons import (
    RULES_PLACEHOLDER,
    TENANT_PLACEHOLDER,
    claim_placeholder,
    fill_claims,
)
from dra_gateway.allocator.planner.search import NodeSearch, NodeSearchResult
from dra_gateway.allocator.planner.settings import BINPACK, DEFAULT, SPREAD
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.kube import names
from dra_gateway.kube.nodeselectors import pod_accepts_node
from dra_gateway.policy.sharing import Holder, SharingRules, card_refusal

# A node where a pod fits: its score, its name and the devices found.
Candidate = tuple[tuple[float, ...], str, NodeSearchResult]
Candidates = Generator[Candidate, None, None]


def score(result: NodeSearchResult, strategy: str, workload: Workload, *, cpu_free: int,
          mem_free: int, cpu: int, memory: int) -> tuple[float, ...]:
    """The packing strategy's score of a found placement; lower is better, ties go to the node
    name."""
    if strategy not in (DEFAULT, BINPACK, SPREAD):
        return (0.0,)
    after = result.after
    free_after = sum(after)
    cpu_after = cpu_free - cpu
    # Cards together first (topology.misalignment: 0 for single cards and aligned sets), then
    # MIG instances where they cost the fewest bigger profiles (0 for other devices).
    aligned = float(result.misaligned)
    mig_loss = float(result.mig_loss)
    if strategy == BINPACK:
        return (aligned, mig_loss, float(free_after), float(cpu_after))
    if strategy == SPREAD:
        share = free_after / len(after) if after else 0.0
        return (aligned, mig_loss, -share, -float(cpu_after))
    delta = workload.expected_loss(after, cpu_after, mem_free - memory, result.model) - \
        workload.expected_loss(result.before, cpu_free, mem_free, result.model)
    return (aligned, mig_loss, round(delta, 6), float(free_after), float(cpu_after))


def _groups(state: ClusterState, pinned: set[str] | None,
            ) -> Iterable[tuple[NodeClassKey, list[str]]]:
    """The node classes to visit: all of them, or only those of the pinned nodes (a pod pinned
    to one node costs one class, not a pass over the cluster)."""
    if pinned is None:
        return state.groups.items()
    keys = dict.fromkeys(state.node_group[n] for n in sorted(pinned) if n in state.node_group)
    return [(key, state.groups[key]) for key in keys]


def feasible_nodes(visit: PodVisit, pod: Mapping[str, Any], *, pinned: set[str] | None,
                   needs_labels: bool, identity: bool) -> Candidates:
    """Every node class's best member where the pod fits, best first, for pods the rankings
    cannot serve."""
    state = visit.state
    found: list[Candidate] = []
    for group_key, members in _groups(state, pinned):
        candidates: Sequence[str] = members
        if pinned is not None:
            candidates = [m for m in members if m in pinned]
        if not candidates or fits_node(state, candidates[0], visit.cpu, visit.memory,
                                       visit.tolerations) is not None:
            continue
        for member in candidates:
            if needs_labels and not pod_accepts_node(pod, name=member,
                                                     labels=state.nodes[member].labels):
                continue
            result, node_score = visit.evaluate(None if identity else group_key, member)
            if result.ok:
                found.append((node_score, member, result))
            if not identity:
                break
    found.sort(key=lambda e: (e[0], e[1]))
    yield from found


# Where every card is held whole or by tenants the pod is isolated from, and none is free.
_BARRED = NodeSearchResult(False, reason=(
    f"claim {claim_placeholder(0)}: every GPU of the node is held whole or by another tenant, "
    f"isolated from {TENANT_PLACEHOLDER} (isolation), {RULES_PLACEHOLDER}"))


@dataclass(slots=True)
class PodVisit:
    """One pod's visit of the node classes: its named inputs (`inputs`: what its ranking and
    its searches are keyed by) and what they stand for (the claims' demands, the tolerations,
    the rules)."""

    state: ClusterState
    inputs: PodInputs
    claims: Sequence[tuple[str, ClaimDemand]]  # the demands `inputs.search.claims` names
    tolerations: Sequence[Mapping[str, Any]]  # what `inputs.tolerations` is the JSON of
    rules: SharingRules | None = None  # the namespace's sharing rules, when any policy exists
    # The rules rankings are kept for: a share's without its tenant and maxClaimsPerDevice
    # (`walk_ranking` asks them of the cards the best nodes pick).
    ranked_rules: SharingRules | None = None
    own_shares: int = 0  # shares of the pod that may land on one card
    # The pod shares cards and asks for gateway GPUs only: it fits no node whose GPUs are all
    # held by tenants it is isolated from (a pod of whole cards is told by its search).
    gpus_only: bool = False

    @property
    def search(self) -> SearchInputs:
        return self.inputs.search

    @property
    def strategy(self) -> str:
        return self.inputs.search.strategy

    @property
    def cpu(self) -> int:
        return self.inputs.cpu

    @property
    def memory(self) -> int:
        return self.inputs.memory

    def evaluate(self, group_key: NodeClassKey | None, node: str, *,
                 ranked: bool = False) -> tuple[NodeSearchResult, tuple[float, ...]]:
        """Devices for the pod on `node` (memoised per node class) and the strategy's score,
        under the namespace's rules (`ranked`: under the rules its ranking is kept for)."""
        result = self.search_node(group_key, node, ranked=ranked)
        if not result.ok:
            return result, ()
        return result, self.score_of(node, result)

    def search_node(self, group_key: NodeClassKey | None, node: str, *,
                    ranked: bool = False) -> NodeSearchResult:
        """The devices for the pod on `node`, or why none: its node class's search, memoised
        (`evaluate` without the score)."""
        state = self.state
        rules = self.ranked_rules if ranked else self.rules
        result: NodeSearchResult | None = None
        memo_key: tuple[object, ...] | None = None
        if group_key is not None and ranked:
            # Rankings' searches read neither tenants nor limits (`PlannerPolicies.planned`),
            # nor, for whole cards, who holds a card: only the cards' usage.
            memo_key = (group_key.static, group_key.bare, self.search, None)
        elif group_key is not None:
            summary = state.holder_summary(group_key)
            if rules is not None and self.gpus_only and summary.barred(rules.tenant):
                return _BARRED
            neutral = summary.neutral_for(rules.tenant) if rules is not None else None
            # Isolation cannot change the search there: as on a node of no isolated holder.
            usage = group_key.usage if neutral is None else neutral
            memo_key = (group_key.static, usage, self.search,
                        memo_rules(rules, summary, self.own_shares))
        classes = state.node_classes
        if not state.settings.memo:
            memo_key = None
        if memo_key is not None:
            result = classes.memo.get(memo_key)
            if result is None:
                result = classes.memo_old.get(memo_key)
                if result is not None:
                    classes.memo[memo_key] = result
        if result is None:
            result = NodeSearch(state, node, self.claims, self.search,
                                 workload=state.workload, rules=rules).run()
            if memo_key is not None:
                classes.memo[memo_key] = result
        return result

    def score_of(self, node: str, result: NodeSearchResult) -> tuple[float, ...]:
        cpu_free, mem_free = self.state.node_free(node)
        return score(result, self.strategy, self.state.workload, cpu_free=cpu_free,
                     mem_free=mem_free, cpu=self.cpu, memory=self.memory)


def scan_classes(visit: PodVisit, pod: Mapping[str, Any],
                 to_plan: Sequence[tuple[Mapping[str, Any], str, ClaimDemand]], pod_label: str, *,
                 pinned: set[str] | None, needs_labels: bool, identity: bool,
                 charges: bool = False) -> PodPlan:
    """Every node class, for pods the rankings cannot serve (pinned, node affinity, selectors
    on identity attributes)."""
    state = visit.state
    best: tuple[tuple[float, ...], str, NodeSearchResult] | None = None
    reasons: Counter[str] = Counter()
    for group_key, members in _groups(state, pinned):
        candidates: Sequence[str] = members
        if pinned is not None:
            candidates = [m for m in members if m in pinned]
            if not candidates:
                continue
        pruned = fits_node(state, candidates[0], visit.cpu, visit.memory, visit.tolerations)
        if pruned is not None:
            reasons[pruned] += len(candidates)
            continue
        for member in candidates:
            result, node_score = visit.evaluate(None if identity else group_key, member)
            if not result.ok:
                reasons[result.reason or "no devices fit"] += 1 if identity else len(candidates)
                if identity:
                    continue
                break
            if best is not None and (node_score, member) >= (best[0], best[1]):
                if identity:
                    continue
                break  # members are sorted by name: later ones cannot win
            if needs_labels and not pod_accepts_node(pod, name=member,
                                                     labels=state.nodes[member].labels):
                reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                continue
            best = (node_score, member, result)
            if not identity:
                break
    if best is None:
        return PodPlan(None, reason=no_node_reason(pod_label, state, reasons, visit.claims,
                                                    visit.rules))
    return build_plan(state, best[1], to_plan, best[2], charges=charges)


@dataclass(slots=True)
class Ranking:
    """Feasible node classes for one pod signature, best first, kept across pods.

    Entries are (score, first member, class key). A class's score never changes (the class
    key is its whole state), so an entry only goes stale when its class empties or its first
    member changes; both are checked when the entry reaches the top. Classes created or joined
    since the signature was last planned (`position`, a `NodeClasses.joins`) and still with
    members are read from `NodeClasses.joined` and evaluated then, so a pod costs the classes
    that changed, not the cluster. `failures` keeps why the other
    classes do not fit, for the reason of an unplaceable pod. `ruled` keeps, per class and
    the part of a pod's rules its ranking leaves out (tenant, maxClaimsPerDevice), the score
    and devices under those rules, read again by the next pods alike (a class key is its
    whole state, so they never change).
    """

    heap: list[tuple[tuple[float, ...], str, NodeClassKey]]
    position: int
    failures: dict[NodeClassKey, str]
    # Keyed by the class and the rules' (tenant, maxClaimsPerDevice) asked of its cards.
    ruled: dict[tuple[NodeClassKey, tuple[str, int | None]],
                tuple[tuple[float, ...], NodeSearchResult]] = field(
        default_factory=dict)
    # Nodes barred per reason, kept as classes fail, grow and shrink (the state's logs), so
    # the reason of an unplaceable pod costs the classes that changed, not the cluster.
    left_position: int = 0
    counted: dict[NodeClassKey, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def recount(self, group_key: NodeClassKey, members: Sequence[str] | None) -> None:
        """Bring the count of a failing class's reason to the class's current size."""
        reason = self.failures.get(group_key)
        if reason is None:
            return
        size = len(members) if members else 0
        delta = size - self.counted.get(group_key, 0)
        if delta:
            left = self.counts.get(reason, 0) + delta
            if left:
                self.counts[reason] = left
            else:
                del self.counts[reason]
        if size:
            self.counted[group_key] = size
        else:
            self.counted.pop(group_key, None)
            del self.failures[group_key]


def caught_up(visit: PodVisit, pod_sig: PodInputs) -> Ranking:
    """The pod signature's ranking, brought up to date with the classes that changed since
    it was last read."""
    state = visit.state
    ranking: Ranking | None = state.rankings.get(pod_sig)
    classes = state.node_classes
    left_log = classes.left_log
    fresh: Collection[NodeClassKey]
    left: Iterable[NodeClassKey] = ()
    if ranking is None:
        ranking = Ranking([], classes.joins, {}, left_position=len(left_log))
        state.rankings[pod_sig] = ranking
        fresh = list(state.groups)
    else:
        # Only classes created or joined since, that still have members: at most the nodes
        # that changed. A class that emptied meanwhile is among those left.
        fresh = set(classes.joined_since(ranking.position))
        ranking.position = classes.joins
        # Of the classes that lost members, only those failing here have counts to follow.
        left = ranking.failures.keys() & left_log[ranking.left_position:]
        ranking.left_position = len(left_log)
        if len(ranking.heap) > 2 * len(state.groups) + 64:
            ranking.heap = [e for e in ranking.heap
                            if (state.groups.get(e[2]) or ("",))[0] == e[1]]
            heapq.heapify(ranking.heap)
    heap = ranking.heap
    failures = ranking.failures
    groups = state.groups
    for group_key in left:
        if group_key not in fresh:
            ranking.recount(group_key, groups.get(group_key))
    for group_key in fresh:
        members = groups[group_key]
        if group_key in failures:  # a class's state is its key: it fails as it did
            ranking.recount(group_key, members)
            continue
        pruned = fits_node(state, members[0], visit.cpu, visit.memory, visit.tolerations)
        if pruned is not None:
            failures[group_key] = pruned
            ranking.recount(group_key, members)
            continue
        result, node_score = visit.evaluate(group_key, members[0], ranked=True)
        if result.ok:
            heapq.heappush(heap, (node_score, members[0], group_key))
        else:
            failures[group_key] = result.reason or "no devices fit"
            ranking.recount(group_key, members)
    return ranking


def _live_head(heap: list[tuple[tuple[float, ...], str, NodeClassKey]],
               groups: Mapping[NodeClassKey, Sequence[str]],
               ) -> tuple[tuple[float, ...], str, NodeClassKey] | None:
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


def ranking_reasons(state: ClusterState, ranking: Ranking,
                    more: Mapping[NodeClassKey, str]) -> Counter[str]:
    """Nodes barred per reason: the ranking's kept counts, and the classes the walk refused
    (`more`, those the ranking holds as feasible but the pod's own rules bar)."""
    counts = Counter(ranking.counts)
    groups = state.groups
    for group_key, reason in more.items():
        members = groups.get(group_key)
        if members and group_key not in ranking.failures:
            counts[reason] += len(members)
    return counts


def walk_ranking(visit: PodVisit, ranking: Ranking,
                 refused: dict[NodeClassKey, str]) -> Candidates:
    """The ranking's classes where the pod fits under its own rules, best first (each as its
    score, first member and result); `refused` gets why the others the ranking holds do not
    fit, once the walk has passed them.

    Rankings of shares are kept without the tenant and maxClaimsPerDevice (every namespace's
    pods share them); each can only keep a pod off cards. Entries are taken in order: where
    the pod's rules leave the cards the ranked search picked, the entry stands with its score
    (a search under them walks the same choices and stops at the same picks); otherwise the
    node is scored as the search under the pod's rules places it. Under the ranking's rules a
    class is given once no entry still to be taken can score better; under a pod's own, once
    every entry has been weighed, since ranked scores do not bound them. The ranking is left
    as found, however far the caller reads (close the walk).
    """
    state = visit.state
    heap = ranking.heap
    rules = visit.rules
    # What of the pod's rules its ranking leaves out; None when they are the ranking's.
    kind = None if rules is None or rules is visit.ranked_rules \
        else (rules.tenant, rules.max_claims_per_device)
    # A card the pod's rules keep it off can send the search to one that leaves the node
    # scoring better than its ranked score (a card's free share is its scarcest capacity's).
    bounded = kind is None
    ruled = ranking.ruled
    if len(ruled) > 4 * len(state.groups) + 1024:
        ruled.clear()
    taken: list[tuple[tuple[float, ...], str, NodeClassKey]] = []
    scored: list[tuple[tuple[float, ...], str, int, NodeSearchResult]] = []
    try:
        while True:
            head = _live_head(heap, state.groups)
            while scored and (head is None or (bounded and scored[0][:2] <= head[:2])):
                node_score, name, _, result = heapq.heappop(scored)
                yield node_score, name, result
            if head is None:
                return
            node_score, name, group_key = head
            taken.append(heapq.heappop(heap))
            if kind is None or rules is None:
                result = visit.search_node(group_key, name, ranked=True)
            else:
                known = ruled.get((group_key, kind))
                if known is None:
                    result = visit.search_node(group_key, name, ranked=True)
                    if refused_picks(state, name, result, rules):
                        result, node_score = visit.evaluate(group_key, name)
                    known = ruled[(group_key, kind)] = (node_score, result)
                node_score, result = known
                if not result.ok:
                    refused[group_key] = result.reason or "no devices fit"
                    continue
            heapq.heappush(scored, (node_score, name, len(taken), result))
    finally:
        for entry in taken:
            heapq.heappush(heap, entry)




def fits_node(state: ClusterState, node: str, cpu: int, memory: int,
              tolerations: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the pod's CPU, memory or tolerations rule the node out, or None."""
    cpu_free, mem_free = state.node_free(node)
    if cpu > cpu_free:
        return "Insufficient cpu"
    if memory > mem_free:
        return "Insufficient memory"
    taint = kubefit.untolerated_taint(state.nodes[node].taints, tolerations)
    if taint is not None:
        return (f"untolerated taint {taint.get('key')}={taint.get('value', '')}:"
                f"{taint.get('effect')}")
    return None


def refused_picks(state: ClusterState, node: str, result: NodeSearchResult,
                  rules: SharingRules) -> bool:
    """Whether `rules` keep the pod off a card that a search under rules without its tenant
    and maxClaimsPerDevice picked on `node`, given the card's holders and the pod's own other
    shares of it. When they do not, a search under `rules` stops at the same picks: it walks
    the same choices in the same order, with only cards the picks did not take removed.
    Allowed models, exclusive and minShare are the same under both, so not asked again."""
    if not result.ok:
        return False
    devices = state.node_devices.get(node, ())
    shares: dict[int, int] = {}
    for pick in result.picks:
        if not pick.exclusive and devices[pick.device].driver == names.DRIVER:
            shares[pick.device] = shares.get(pick.device, 0) + 1
    if not shares:
        return False
    policies = state.policies
    own = Holder(rules.tenant, rules.max_claims_per_device)
    for i, count in shares.items():
        device = devices[i]
        holders = policies.holders(state.device_usage(device.key).namespaces)
        if count > 1:
            holders.extend([own] * (count - 1))
        if holders and card_refusal(rules, whole=False, product_name=card_product(device),
                                    holders=holders) is not None:
            return True
    return False




def no_node_reason(pod_label: str, state: ClusterState, reasons: Counter[str],
                   claims: Sequence[tuple[str, ClaimDemand]],
                   rules: SharingRules | None = None) -> str:
    total = len(state.node_group)
    if not reasons:
        return f"pod {pod_label}: 0/{total} nodes are available"
    labels = [label for label, _ in claims]
    # Most nodes first; among equals, by the reason's words (the same message whatever
    # order the classes were seen in).
    top = sorted(reasons.items(), key=lambda entry: (-entry[1], entry[0]))[:4]
    parts = [f"{count} node(s): {fill_claims(reason, labels, rules)}" for reason, count in top]
    return f"pod {pod_label}: 0/{total} nodes fit; " + "; ".join(parts)


__all__ = ["Candidate", "Candidates", "PodVisit", "Ranking", "caught_up", "feasible_nodes",
           "fits_node", "no_node_reason", "ranking_reasons", "refused_picks", "scan_classes",
           "score", "walk_ranking"]
