"""Carrying a defrag plan out (`Applier`): the plan's pods in order; for each pod helped by moves:

1. the hold is written first (`holds.py`: the devices freed, for that pod, until a deadline,
   and the uids of the pods to move), with a record of each pod about to move, so the
   allocator gives nobody else those devices and no pod moves twice in the window. A hold
   whose moves never came (its writer stopped in between) is dropped by the next defrag
   (`drop_unserved`), its pod planned again;
2. the pods are evicted through the Eviction API, at most `in_flight` at a time, each with its
   uid as a precondition. A PodDisruptionBudget that refuses (429) stops the plan there: what
   was done stays done (the hold keeps the devices freed so far for their pod), the rest is
   reported as not started;
3. before the next pod's moves, it waits (at most `wait_seconds`) until the pod helped is placed
   and every moved pod's controller has a replacement placed; what is not by then is reported
   (the allocator goes on placing them as usual).

Every move is a Normal Event on the pod moved and one on the pod it made room for. Nothing here
chooses moves (the planner does); each re-placement is the allocator's, checked as usual. Every
eviction and every write of the records passes the `fence` first: the allocator's defrag gives
its leader's (a replica that no longer leads moves nothing and writes no record, however long
a plan takes to carry out); `dra-gateway defrag apply`, run by hand, has none.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.evict import Evictions
from dra_gateway.allocator.eviction.inputs import Snapshot, controller_uid
from dra_gateway.allocator.eviction.store import (
    LIVE_PODS,
    drop_records,
    read_records,
    write_records,
)
from dra_gateway.allocator.planner.defrag import DefragPlan, Help, Move
from dra_gateway.allocator.work import Fence, unfenced
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import (
    ApiError,
    Cluster,
    Conflict,
    NotFound,
    Object,
    TooManyRequests,
)
from dra_gateway.kube.resources import PODS

log = logging.getLogger(__name__)

COMPONENT = "dra-gateway-defrag"
EVENT_MOVED = "DefragMoved"
EVENT_ROOM = "DefragRoomMade"


# --- carrying a plan out -----------------------------------------------------------------------


@dataclass(slots=True)
class MoveOutcome:
    move: Move
    result: str  # "evicted", "already gone", "refused: ...", "failed: ...", "not started"
    replacement: str = ""  # where its replacement went, or why it is not known
    replaced: bool = False  # its replacement is placed


@dataclass(slots=True)
class HelpOutcome:
    help: Help
    moves: list[MoveOutcome] = field(default_factory=list)
    placed: str = ""  # where the pod helped went, or why not yet
    is_placed: bool = False

    @property
    def done(self) -> bool:
        return all(m.result in ("evicted", "already gone") for m in self.moves)


@dataclass(slots=True)
class ApplyReport:
    outcomes: list[HelpOutcome] = field(default_factory=list)
    stopped: str | None = None  # why the plan stopped before its end

    @property
    def evicted(self) -> int:
        return sum(1 for o in self.outcomes for m in o.moves if m.result == "evicted")

    @property
    def incomplete(self) -> bool:
        """Moves were made, but a pod they were for, or a moved pod's replacement, was not
        placed within the wait: not an error, not done either."""
        return any((o.placed != "not started" and not o.is_placed)
                   or any(m.result == "evicted" and not m.replaced for m in o.moves)
                   for o in self.outcomes)


@dataclass(frozen=True, slots=True)
class Pace:
    in_flight: int = 2  # evictions at once
    hold_seconds: float = 600.0  # how long freed devices wait for their pod
    wait_seconds: float = 120.0  # for a pod helped and its moved pods' replacements
    poll_seconds: float = 1.0
    window_seconds: float = 3600.0  # a move is remembered this long


class Applier:
    """Carries plans out on one cluster; `clock` gives the time written in records."""

    def __init__(self, cluster: Cluster, *, namespace: str, pace: Pace | None = None,
                 clock: Callable[[], datetime] | None = None, instance: str = "",
                 fence: Fence = unfenced) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.pace = pace or Pace()
        self.clock = clock or (lambda: datetime.now(UTC))
        self.fence = fence
        self.evictions = Evictions(cluster, clock=self.clock, instance=instance,
                                   component=COMPONENT, fence=fence)

    async def carry_out(self, plan: DefragPlan, pods: Mapping[str, Object]) -> ApplyReport:
        """`pods`: the live pods the plan was made from, by uid (for owners and Events)."""
        report = ApplyReport()
        if plan.helped:
            # Records past their use go first, so the ConfigMap stays the size of the moves
            # under way and of the window.
            records, _ = await read_records(self.cluster, self.namespace)
            self.fence()
            await drop_records(self.cluster, self.namespace,
                               records.stale_keys(self.clock(), self.pace.window_seconds))
        for help_ in plan.helped:
            outcome = HelpOutcome(help_)
            report.outcomes.append(outcome)
            if report.stopped is not None:
                outcome.moves = [MoveOutcome(m, "not started") for m in help_.moves]
                outcome.placed = "not started"
                continue
            if not help_.moves:
                outcome.placed, outcome.is_placed = await self._wait_placed(
                    help_.uid, pods, short=True)
                continue
            await self._write_hold(help_, pods)
            outcome.moves = await self._evict(help_, pods)
            refused = [m for m in outcome.moves if m.result.startswith(("refused", "failed"))]
            if refused:
                report.stopped = (f"moving {refused[0].move.pod} for {help_.pod}: "
                                  f"{refused[0].result}; the moves before it stay done, the "
                                  f"devices they freed stay held for {help_.pod}")
            await self._events(help_, outcome, pods)
            outcome.placed, outcome.is_placed = await self._wait_placed(help_.uid, pods)
            for move in outcome.moves:
                if move.result == "evicted":
                    move.replacement, move.replaced = await self._replacement(move.move, pods)
        return report

    async def _write_hold(self, help_: Help, pods: Mapping[str, Object]) -> None:
        now = self.clock()
        hold = holdfmt.Hold(help_.uid, help_.pod, help_.placement.node,
                            help_.plan.allocations, now + timedelta(seconds=self.pace.hold_seconds),
                            tuple(m.pod for m in help_.moves),
                            victims=tuple(m.uid for m in help_.moves))
        data = {hold.key: hold.value()}
        for move in help_.moves:
            owner = controller_uid(pods.get(move.uid))
            moved = holdfmt.Moved(move.uid, move.pod, owner, now, help_.pod)
            data[moved.key] = moved.value()
        self.fence()
        await write_records(self.cluster, self.namespace, data)

    async def _evict(self, help_: Help, pods: Mapping[str, Object]) -> list[MoveOutcome]:
        gate = asyncio.Semaphore(max(1, self.pace.in_flight))
        stop = asyncio.Event()

        async def one(move: Move) -> MoveOutcome:
            async with gate:
                if stop.is_set():
                    return MoveOutcome(move, "not started")
                try:
                    await self.evictions.evict(move.pod, move.uid)
                    return MoveOutcome(move, "evicted")
                except NotFound:
                    return MoveOutcome(move, "already gone")
                except Conflict:
                    return MoveOutcome(move, "already gone")  # another pod has the name now
                except TooManyRequests as exc:
                    stop.set()
                    return MoveOutcome(move, f"refused: {exc.message}")
                except ApiError as exc:
                    stop.set()
                    return MoveOutcome(move, f"failed: {exc.message}")

        return list(await asyncio.gather(*(one(m) for m in help_.moves)))

    async def _events(self, help_: Help, outcome: HelpOutcome,
                      pods: Mapping[str, Object]) -> None:
        done = [m.move for m in outcome.moves if m.result == "evicted"]
        for move in done:
            await self.evictions.event(pods.get(move.uid), EVENT_MOVED,
                              f"moved by defrag to make room for {help_.pod} (frees "
                              f"{help_.frees})")
        if done:
            await self.evictions.event(pods.get(help_.uid), EVENT_ROOM,
                              f"defrag moved {', '.join(m.pod for m in done)} to free "
                              f"{help_.frees} for this pod")

    async def _wait_placed(self, uid: str, pods: Mapping[str, Object], *,
                           short: bool = False) -> tuple[str, bool]:
        """Where the pod helped went (and whether it is placed), or why not yet."""
        pod = pods.get(uid)
        if pod is None:
            return "gone", True
        ns, name = objects.namespace_name(pod)
        deadline = time.monotonic() + (min(self.pace.wait_seconds, 10.0) if short
                                       else self.pace.wait_seconds)
        while True:
            try:
                current = await self.cluster.get(PODS, name, namespace=ns)
            except NotFound:
                return "gone", True
            if objects.uid(current) != uid:
                return "gone", True
            node = objects.spec(current).get("nodeName")
            if node:
                return f"bound to {node}", True
            if not objects.is_gated(current):
                return "allocated, waiting for the scheduler", True
            if time.monotonic() >= deadline:
                return (f"not placed within {self.pace.wait_seconds:g}s: it waits, the devices "
                        f"stay held for it"), False
            await asyncio.sleep(self.pace.poll_seconds)

    async def _replacement(self, move: Move, pods: Mapping[str, Object]) -> tuple[str, bool]:
        """Where the moved pod's controller put its replacement, once placed (True), or what
        was seen of it within the wait (False)."""
        before = pods.get(move.uid)
        owner = controller_uid(before)
        if before is None or owner is None:
            return "its replacement is not known (no controller)", False
        ns = objects.namespace(before)
        deadline = time.monotonic() + self.pace.wait_seconds
        while True:
            listed = await self.cluster.list(PODS, namespace=ns, field_selector=LIVE_PODS)
            fresh = [p for p in listed.items
                     if controller_uid(p) == owner and objects.uid(p) not in pods]
            placed = [p for p in fresh if objects.spec(p).get("nodeName")]
            if placed:
                p = placed[0]
                return f"{objects.name(p)} on {objects.spec(p).get('nodeName')}", True
            if time.monotonic() >= deadline:
                if fresh:
                    return (f"its replacement {objects.name(fresh[0])} not placed within "
                            f"{self.pace.wait_seconds:g}s (the allocator's Events say why)"), \
                        False
                return (f"not replaced within {self.pace.wait_seconds:g}s: its controller made "
                        "no new pod (scaled down, paused or gone?)"), False
            await asyncio.sleep(self.pace.poll_seconds)


# --- a plan stopped between its hold and its moves ---------------------------------------------

# How old a hold must be before its missing moves mean its writer stopped: `defrag apply` run by
# hand beside the allocator's defrag writes its hold a moment before its first eviction.
UNSERVED_AFTER_SECONDS = 30.0


def unserved(snapshot: Snapshot, *,
             after_seconds: float = UNSERVED_AFTER_SECONDS) -> dict[str, str]:
    """The records of defrag holds whose moves never came, to drop, each with why: a hold (not
    a preemption's) written at least `after_seconds` ago, for a pod that still waits, none of
    whose moved pods is leaving while some are still there. The defrag that wrote it stopped
    (its allocator or `defrag apply` killed) between the hold and the evictions: the hold
    would keep its pod waiting beside the devices it holds until it expires, and the pods it
    names would count as moved. Their `moved` records go with it: those pods never moved.
    Pure."""
    gated = {objects.uid(p) for p in snapshot.pods
             if objects.is_gated(p) and not objects.is_deleting(p)}
    records = snapshot.records
    drop: dict[str, str] = {}
    for uid, hold in records.holds.items():
        if hold.preempted or not hold.victims or uid not in gated:
            continue  # preemption judges its own; a hold of before victims were recorded expires
        moved = [m for m in records.moved if m.for_pod == hold.pod and m.pod_uid in hold.victims]
        if not moved or (snapshot.now - min(m.at for m in moved)).total_seconds() < after_seconds:
            continue
        why = holdfmt.never_carried_out(hold, snapshot.pods, snapshot.claims)
        if why is not None:
            drop[hold.key] = why
            drop.update((m.key, f"moved for {hold.pod}, which never happened") for m in moved)
    return drop


async def drop_unserved(cluster: Cluster, namespace: str, snapshot: Snapshot, *,
                        fence: Fence = unfenced) -> Snapshot:
    """Drop the records `unserved` finds and return the snapshot without them (unchanged when
    none, or when the write fails: they expire by themselves)."""
    drop = unserved(snapshot)
    if not drop:
        return snapshot
    fence()
    try:
        await drop_records(cluster, namespace, list(drop))
    except ApiError as exc:
        log.warning("could not drop the hold of a defrag that stopped before its moves", extra={
            "records": sorted(drop), "error": exc.message})
        return snapshot
    for key, why in sorted(drop.items()):
        if key.startswith(holdfmt.HOLD):
            hold = snapshot.records.holds[key[len(holdfmt.HOLD):]]
            log.info("defrag: a hold was dropped, its moves never came; its pod is planned "
                     "again", extra={"pod": hold.pod, "node": hold.node, "why": why})
    records = snapshot.records
    kept = holdfmt.Records({u: h for u, h in records.holds.items() if h.key not in drop},
                           [m for m in records.moved if m.key not in drop],
                           list(records.problems))
    return replace(snapshot, records=kept)


__all__ = ["UNSERVED_AFTER_SECONDS", "Applier", "ApplyReport", "HelpOutcome", "MoveOutcome",
           "Pace", "drop_unserved", "unserved"]
