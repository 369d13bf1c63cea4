"""The ConfigMap a defrag plan writes before it evicts anything, `dra-gateway-defrag` in the
gateway's namespace:

- `hold.<pod uid>`: the devices freed for a waiting pod (its claims' allocations as the plan
  made them), the node, the pods moved (or, `preempted`, evicted) for it (and, for a
  preemption, their uids), and until when the hold lasts. The allocator counts a hold as
  taken, so no newcomer (a moved pod's replacement included) gets those devices, and gives
  them to the pod first when it plans it;
- `moved.<pod uid>`: a pod moved, its controller, when and for whom: a pod is not moved twice
  in a window, nor the replacement its controller made after the move.

Only the gateway's service account and cluster admins may write in the gateway's namespace (a
tenant could otherwise hold devices with an annotation on a pod of their own). Pure: it reads
and writes the ConfigMap's data as values; `store.py` talks to the API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import Object

CONFIG_MAP = "dra-gateway-defrag"
HOLD = "hold."
MOVED = "moved."


@dataclass(frozen=True, slots=True)
class Hold:
    pod_uid: str
    pod: str  # namespace/name
    node: str
    allocations: Mapping[str, Mapping[str, Any]]  # claim uid -> status.allocation
    until: datetime
    moves: tuple[str, ...] = ()
    # Written by a preemption (the pods in `moves` were evicted for good, not moved): dropped
    # by the preemption rounds once it has served, or once they see its evictions never came.
    preempted: bool = False
    # The uids of the pods in `moves`, where the writer recorded them (a preemption does): a
    # pod its controller made again under the same name is not one of them.
    victims: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return HOLD + self.pod_uid

    def plan(self) -> PodPlan:
        """The held devices as a plan the planner state can assume."""
        return PodPlan(self.node, {uid: dict(a) for uid, a in self.allocations.items()})

    def value(self) -> str:
        body: dict[str, Any] = {"pod": self.pod, "node": self.node,
                                "allocations": self.allocations, "until": objects.stamp(self.until),
                                "moves": list(self.moves)}
        if self.preempted:
            body["preempted"] = True
        if self.victims:
            body["victims"] = list(self.victims)
        return json.dumps(body, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Moved:
    pod_uid: str
    pod: str
    owner_uid: str | None  # its controller: the replacement it makes is not moved again
    at: datetime
    for_pod: str

    @property
    def key(self) -> str:
        return MOVED + self.pod_uid

    def value(self) -> str:
        return json.dumps({"pod": self.pod, "owner": self.owner_uid, "at": objects.stamp(self.at),
                           "for": self.for_pod}, sort_keys=True)


@dataclass(slots=True)
class Records:
    holds: dict[str, Hold] = field(default_factory=dict)  # by pod uid
    moved: list[Moved] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # entries that could not be read

    def live_holds(self, now: datetime) -> dict[str, Hold]:
        return {uid: h for uid, h in self.holds.items() if h.until > now}

    def stale_keys(self, now: datetime, window_seconds: float) -> list[str]:
        """Entries to drop: holds past their time, moves older than the window."""
        keys = [h.key for h in self.holds.values() if h.until <= now]
        keys += [m.key for m in self.moved if (now - m.at).total_seconds() > window_seconds]
        return keys


def read(config_map: Mapping[str, Any] | None) -> Records:
    """The ConfigMap's records; an entry that cannot be read is named in `problems` and
    ignored (a hand-edited ConfigMap must not stop the allocator)."""
    records = Records()
    data = (config_map or {}).get("data") or {}
    for key, text in sorted(data.items()):
        try:
            body = json.loads(text)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
            if key.startswith(HOLD):
                until = objects.parse_time(body.get("until"))
                allocations = body.get("allocations")
                if until is None or not isinstance(allocations, dict) or not body.get("node"):
                    raise ValueError("needs node, allocations and until (RFC 3339, UTC)")
                records.holds[key[len(HOLD):]] = Hold(
                    key[len(HOLD):], str(body.get("pod", "")), str(body["node"]), allocations,
                    until, tuple(str(m) for m in body.get("moves") or ()),
                    preempted=body.get("preempted") is True,
                    victims=tuple(str(v) for v in body.get("victims") or ()))
            elif key.startswith(MOVED):
                at = objects.parse_time(body.get("at"))
                if at is None:
                    raise ValueError("needs at (RFC 3339, UTC)")
                records.moved.append(Moved(key[len(MOVED):], str(body.get("pod", "")),
                                           body.get("owner") or None, at,
                                           str(body.get("for", ""))))
            else:
                raise ValueError(f"keys start with {HOLD!r} or {MOVED!r}")
        except (ValueError, TypeError) as exc:
            records.problems.append(f"ConfigMap {CONFIG_MAP}: data[{key}]: {exc}")
    return records


def victims_of(hold: Hold, pods: Sequence[Object],
               claims: Sequence[Object] = ()) -> tuple[set[str], list[str]]:
    """The victims of a hold (the pods evicted or moved for it) as `pods` and `claims` show
    them: the uids of those leaving (being deleted, or gone with a claim still allocated to
    them: their devices are not free yet), and the names of those still there (live, not
    being deleted). Victims gone for good or finished are neither. By uid where the hold
    recorded them, by name otherwise (a hold written before it did; a victim gone is then
    gone). Pure."""
    if hold.victims:
        wanted = set(hold.victims)
        mine = [p for p in pods if objects.uid(p) in wanted]
    else:
        names = set(hold.moves)
        mine = [p for p in pods if "/".join(objects.namespace_name(p)) in names]
    leaving = {objects.uid(p) for p in mine if objects.is_deleting(p)}
    gone = set(hold.victims) - {objects.uid(p) for p in mine}
    leaving |= {uid for c in claims if objects.is_allocated(c)
                for uid in objects.owner_and_reserved(c) & gone}
    there = sorted("/".join(objects.namespace_name(p)) for p in mine
                   if not objects.is_deleting(p) and not objects.is_finished(p))
    return leaving, there


def never_carried_out(hold: Hold, pods: Sequence[Object],
                      claims: Sequence[Object] = ()) -> str | None:
    """Why a hold no preemption or defrag of this process has under way is spent although
    its pod still waits, or None where it may still serve: none of its victims is leaving and
    some are still there, so the evictions it was written for are not coming (the allocator
    that wrote it stopped before them). Pure."""
    leaving, there = victims_of(hold, pods, claims)
    if leaving or not there:
        return None  # its victims are on their way out, or gone: it serves its pod
    left = [v for v in hold.moves if v not in there]
    return (f"its victims {', '.join(there)} were never evicted"
            + (f" ({', '.join(left)} left)" if left else ""))


__all__ = ["CONFIG_MAP", "Hold", "Moved", "Records", "never_carried_out", "read", "victims_of"]
