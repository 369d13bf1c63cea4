"""The fragmentation model the `default` strategy scores placements by: task types, the workload.

Which node and which cards once several fit is the strategy's, scored in `visit.score` (nodes)
and ordered in `search` (cards): `first-fit` takes nodes in name order and devices in slice
order, `binpack` the least free, `spread` the emptiest, and `default` the smallest rise of the
expected loss this module computes. It follows fragmentation gradient descent, after Weng et
al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient
Descent" (USENIX ATC'23). A node's fragmentation for a task type is the free GPU share the task
could not use there (all of it when the task does not fit the node's CPU, memory or model; the
cards with less free than the task's share; for whole-card tasks, the partly used cards, or
everything when too few cards are free). Its expected fragmentation weighs the task types by
how often they occur. FGD sees CPU and memory only once a task no longer fits them, so a node
can hand out its CPU long before its cards and strand them; the expected loss therefore adds
the free share the node's CPU or memory cannot carry at the workload's average CPU and memory
per share of a card (a fluid estimate of where filling the node with the workload ends). A
placement is scored by how much it raises the expected loss, and the smallest rise wins.

The workload distribution is given (the benchmark passes the trace's, as the paper does) or
learned from the pods the planner has seen. Pure: no I/O. Fragmentation values are memoised by
node state, because the same card vectors recur across the many identical nodes of a cluster.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FULL = 1000  # a whole card, in thousandths


@dataclass(frozen=True, slots=True)
class TaskType:
    """One kind of pod in the workload: CPU (milli), memory (bytes), GPUs.

    `gpus` whole cards when `milli` is 1000, else one card's share of `milli` thousandths;
    `models` restricts the product names the task accepts (empty: any).
    """

    cpu: int
    memory: int
    gpus: int
    milli: int
    models: frozenset[str] = frozenset()


class Workload:
    """A distribution over task types with the memo of node fragmentation it implies."""

    __slots__ = ("_cpus", "_frag", "_learned", "_mems", "_pending", "_profiles",
                 "cpu_per_milli", "memory_per_milli", "types", "version")

    # Types kept for scoring: the most frequent ones carry nearly all the mass of real traces
    # and the cost of one fragmentation evaluation grows with their number.
    MAX_TYPES = 1024

    def __init__(self, types: Iterable[tuple[TaskType, float]] = (), *, version: int = 0) -> None:
        self.types: tuple[tuple[TaskType, float], ...] = ()
        self._cpus: list[int] = []
        self._mems: list[int] = []
        self.cpu_per_milli = 0.0
        self.memory_per_milli = 0.0
        self._frag: dict[tuple[object, ...], float] = {}
        self._profiles: dict[tuple[object, ...], _Profile] = {}
        self._learned: Counter[TaskType] = Counter()
        self._pending = 0
        self.version = version
        self._set(types)

    @classmethod
    def from_counts(cls, counts: Iterable[tuple[TaskType, int]]) -> Workload:
        return cls([(t, float(n)) for t, n in counts])

    def _set(self, weighted: Iterable[tuple[TaskType, float]]) -> None:
        gpu_types = sorted(((t, w) for t, w in weighted if t.gpus > 0 and w > 0),
                           key=lambda tw: -tw[1])[: self.MAX_TYPES]
        total = sum(w for _, w in gpu_types)
        self.types = tuple((t, w / total) for t, w in gpu_types) if total else ()
        self._cpus = sorted({t.cpu for t, _ in self.types})
        self._mems = sorted({t.memory for t, _ in self.types})
        milli = sum(p * t.gpus * t.milli for t, p in self.types)
        self.cpu_per_milli = sum(p * t.cpu for t, p in self.types) / milli if milli else 0.0
        self.memory_per_milli = sum(p * t.memory for t, p in self.types) / milli if milli else 0.0
        self._frag.clear()
        self._profiles.clear()
        self.version += 1

    def observe(self, task: TaskType) -> None:
        """Learn from one pod seen; the distribution moves in steps so memos stay useful."""
        if task.gpus <= 0:
            return
        self._learned[task] += 1
        self._pending += 1
        seen = sum(self._learned.values())
        if not self.types or self._pending >= max(16, seen // 4):
            self._pending = 0
            self._set(self._learned.items())

    def fragmentation(self, cards: tuple[int, ...], cpu_free: int, mem_free: int,
                      model: str) -> float:
        """Expected free GPU share (thousandths) the workload could not use on this node."""
        # Which task types fit the node's CPU and memory depends only on where the free amounts
        # fall among the types' requests: memoise by those ranks, not the exact amounts.
        key = (cards, bisect_right(self._cpus, cpu_free), bisect_right(self._mems, mem_free),
               model)
        cached = self._frag.get(key)
        if cached is not None:
            return cached
        total = sum(cards)
        value = 0.0
        if total:
            profile = self._profiles.get(key[1:])
            if profile is None:
                profile = self._profile(cpu_free, mem_free, model)
                self._profiles[key[1:]] = profile
            value = profile.fragmentation(cards, total)
        if len(self._frag) > 500_000:
            self._frag.clear()
        self._frag[key] = value
        return value

    def stranded(self, free: int, cpu_free: int, mem_free: int) -> float:
        """Free GPU share (thousandths) that the node's CPU or memory cannot carry.

        The workload asks on average `cpu_per_milli` CPU and `memory_per_milli` memory with each
        thousandth of a card; a node filled from it runs out of the scarcer of the two with
        `free` minus what that leaves room for still unallocated. FGD's fragmentation counts
        such cards only once no task fits the CPU or memory left; this sees it coming.
        """
        carried = float(free)
        if self.cpu_per_milli > 0:
            carried = min(carried, max(cpu_free, 0) / self.cpu_per_milli)
        if self.memory_per_milli > 0:
            carried = min(carried, max(mem_free, 0) / self.memory_per_milli)
        return free - carried

    def expected_loss(self, cards: tuple[int, ...], cpu_free: int, mem_free: int,
                      model: str) -> float:
        """What the `default` strategy minimises: fragmentation plus the stranded share."""
        return (self.fragmentation(cards, cpu_free, mem_free, model)
                + self.stranded(sum(cards), cpu_free, mem_free))

    def _profile(self, cpu_free: int, mem_free: int, model: str) -> _Profile:
        """The workload as seen by nodes with this much CPU and memory and this model."""
        no_fit = 0.0
        shares: dict[int, float] = {}
        wholes: dict[int, float] = {}
        for task, p in self.types:
            if task.cpu > cpu_free or task.memory > mem_free or (
                task.models and model not in task.models
            ):
                no_fit += p
            elif task.milli < FULL:
                shares[task.milli] = shares.get(task.milli, 0.0) + p
            else:
                wholes[task.gpus] = wholes.get(task.gpus, 0.0) + p
        needs = sorted(shares)
        # above[i]: probability of a share task needing more than needs[i - 1] (all for i = 0).
        above = [0.0] * (len(needs) + 1)
        for i in range(len(needs) - 1, -1, -1):
            above[i] = above[i + 1] + shares[needs[i]]
        counts = sorted(wholes)
        at_most = [0.0]
        for k in counts:
            at_most.append(at_most[-1] + wholes[k])
        return _Profile(no_fit, needs, above, counts, at_most)


class _Profile:
    """Aggregated task types for one fit: fragmentation in O(cards x log types).

    F = P(no fit) x S + sum over cards of f x P(share needs more than f)
        + P(whole tasks that find enough free cards) x (S - free of full cards)
        + P(whole tasks that do not) x S.
    """

    __slots__ = ("above", "at_most", "counts", "needs", "no_fit", "whole")

    def __init__(self, no_fit: float, needs: list[int], above: list[float], counts: list[int],
                 at_most: list[float]) -> None:
        self.no_fit = no_fit
        self.needs = needs
        self.above = above
        self.counts = counts
        self.at_most = at_most
        self.whole = at_most[-1]

    def fragmentation(self, cards: tuple[int, ...], total: int) -> float:
        value = self.no_fit * total
        needs, above = self.needs, self.above
        for f in cards:
            if f:
                value += f * above[bisect_right(needs, f)]
        if self.whole:
            full = cards.count(FULL)
            satisfied = self.at_most[bisect_right(self.counts, full)]
            value += satisfied * (total - FULL * full) + (self.whole - satisfied) * total
        return value


def free_milli(capacity: dict[str, int], consumed: dict[str, int], exclusive: bool) -> int:
    """Free share of one card in thousandths: the scarcer of its capacities."""
    if exclusive:
        return 0
    if not capacity:
        return FULL
    least = FULL
    for name, cap in capacity.items():
        if cap > 0:
            left = (cap - consumed.get(name, 0)) * FULL // cap
            least = min(least, left)
    return max(least, 0)


def task_of(cpu: int, memory: int, shares: Sequence[int]) -> TaskType:
    """The task type of a pod: `shares` lists each card's share in thousandths."""
    if not shares:
        return TaskType(cpu, memory, 0, 0)
    if len(shares) == 1:
        return TaskType(cpu, memory, 1, shares[0])
    return TaskType(cpu, memory, len(shares), FULL)
