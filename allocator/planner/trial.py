"""The trial core of the planners that make room by making pods leave: take pods out of the
state, plan a pod without them, then put back, one at a time, each pod it can do without.

Preemption and reclaim (`planner/preemption.py`) and defragmentation (`planner/defrag/rooms.py`)
differ in whom they take out and in what order they give reprieves; the trial itself is this
one: a pod put back stays back when the pod still fits, otherwise it is taken out again and must
leave, so the pods left out are minimal (putting any one of them back leaves the pod
unplaceable). `undo` puts back every pod still out: the state ends as it started, unless the
caller keeps the pods out (a defrag trial that succeeded moves them). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.ledger import TakenOut

__all__ = ["Trial"]


class Trial:
    """Pods taken out of the planner state for one pod's plan, by pod uid.

    `take_out` and `put_back` change the state (a planner that keeps its own index of who holds
    what passes its own, which keep the index in step)."""

    def __init__(self, take_out: Callable[[str], TakenOut],
                 put_back: Callable[[TakenOut], None]) -> None:
        self._take_out = take_out
        self._put_back = put_back
        self.out: dict[str, TakenOut] = {}

    def take_out(self, uid: str) -> None:
        self.out[uid] = self._take_out(uid)

    def put_back(self, uid: str) -> None:
        self._put_back(self.out.pop(uid))

    def reprieve(self, order: Iterable[str], plan: Callable[[], PodPlan | None],
                 placed: PodPlan) -> tuple[PodPlan, list[str]]:
        """Put each pod of `order` back in turn, keeping it back when `plan` still places the
        pod without it. Returns the last plan that placed it and the pods that must leave, in
        `order`'s order."""
        leaving = []
        for uid in order:
            self.put_back(uid)
            again = plan()
            if again is not None:
                placed = again
                continue
            self.take_out(uid)
            leaving.append(uid)
        return placed, leaving

    def undo(self) -> None:
        """Put back every pod still out."""
        for uid in list(self.out):
            self.put_back(uid)
