"""Partitionable devices (KEP-4815): the counter sets a pool's slices share, and what each
device draws from them.

A device that consumes counters fits only while every counter it consumes has room: the set's
value less what the devices already allocated consume, each allocated device once whoever
holds it, as kube-scheduler counts them. A counter set the pool does not publish (yet) gives
no room. Counters are keyed `(driver, pool, counter set, counter)`: a device names sets of its
own pool, and from 1.35 the sets sit in a slice of their own beside the devices' slices.

Where the API server drops the fields (`DRAPartitionableDevices` off, the default of 1.34 and
1.35), the gateway's own MIG devices say the same in attributes every release keeps: a device
with `counterSet` and `migStart` is an instance of `migMemorySlices` memory slices from
`migStart` with `migComputeSlices` compute slices (media extensions when its profile has
`+me`); one with `counterSet` and no `migStart` is the whole card, which consumes the whole
set and declares its value (`migMemorySlices`, `migComputeSlices`, `migMediaExtensions`); an
instance that exists already (made by hand, so it has a `uuid`) draws nothing and holds its
slices out of the set for good, as the published set leaves them out where it is kept.
The counters are those the node plugin publishes where the fields are kept
(`gpu.mig.shared_counters`, `consumed_counters`), so both worlds count alike.

`placement` reads a device's MIG placement from the memory-slice counters it consumes
(NVIDIA's driver names them as the gateway does), which the planner's choice among MIG
placements needs (`gpu.mig.choose`). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dra_gateway.gpu import mig
from dra_gateway.kube import names
from dra_gateway.kube.quantity import QuantityError, parse_quantity

CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter
SetKey = tuple[str, str, str]  # driver, pool, counter set
Consumption = tuple[tuple[CounterKey, int], ...]

ONE = 10**9  # a counter of value 1, in nanos
_MEMORY_SLICE = re.compile(r"memory-slice-(\d+)")


def _nanos(entry: Any) -> int | None:
    try:
        return parse_quantity((entry or {}).get("value", "0")).nanos
    except (QuantityError, AttributeError, TypeError):
        return None


def shared_counters(driver: str, pool: str, spec: Mapping[str, Any]) -> dict[CounterKey, int]:
    """A slice's `sharedCounters`, in nanos (a value that is not a quantity gives no room)."""
    out: dict[CounterKey, int] = {}
    for counter_set in spec.get("sharedCounters") or ():
        set_name = (counter_set or {}).get("name", "")
        for counter, entry in ((counter_set or {}).get("counters") or {}).items():
            out[(driver, pool, set_name, counter)] = _nanos(entry) or 0
    return out


def consumed(driver: str, pool: str, raw: Mapping[str, Any],
             attributes: Mapping[str, Any]) -> Consumption:
    """What the device draws from its pool's counter sets: its `consumesCounters`, else what
    the gateway's attributes say (module docstring)."""
    out: dict[CounterKey, int] = {}
    for entry in raw.get("consumesCounters") or ():
        set_name = (entry or {}).get("counterSet", "")
        for counter, value in ((entry or {}).get("counters") or {}).items():
            key = (driver, pool, set_name, counter)
            amount = _nanos(value)
            # A value that is not a quantity draws everything: never a free ride.
            out[key] = out.get(key, 0) + (1 << 62 if amount is None else amount)
    if not out and driver == names.DRIVER:
        out = _attribute_consumption(driver, pool, attributes)
    return tuple(sorted(out.items()))


def declared(driver: str, pool: str, raw: Mapping[str, Any],
             attributes: Mapping[str, Any]) -> dict[CounterKey, int]:
    """The counter set a gateway whole card declares by its attributes, where the API server
    dropped its `consumesCounters` (and so the pool's `sharedCounters`)."""
    if driver != names.DRIVER or raw.get("consumesCounters"):
        return {}
    attr = _reader(driver, attributes)
    set_name, start = attr(names.ATTR_COUNTER_SET), attr(names.ATTR_MIG_START)
    slices, compute = attr(names.ATTR_MIG_MEMORY_SLICES), attr(names.ATTR_MIG_COMPUTE_SLICES)
    media = attr(names.ATTR_MIG_MEDIA_EXTENSIONS)
    if not isinstance(set_name, str) or start is not None or not _counts(slices, compute):
        return {}
    out = {(driver, pool, set_name, mig.memory_slice_counter(i)): ONE for i in range(slices)}
    out[(driver, pool, set_name, mig.COMPUTE_COUNTER)] = compute * ONE
    out[(driver, pool, set_name, mig.MEDIA_COUNTER)] = (media if isinstance(media, int)
                                                        else 1) * ONE
    return out


def _attribute_consumption(driver: str, pool: str,
                           attributes: Mapping[str, Any]) -> dict[CounterKey, int]:
    attr = _reader(driver, attributes)
    set_name, start = attr(names.ATTR_COUNTER_SET), attr(names.ATTR_MIG_START)
    slices, compute = attr(names.ATTR_MIG_MEMORY_SLICES), attr(names.ATTR_MIG_COMPUTE_SLICES)
    if not isinstance(set_name, str) or not _counts(slices, compute):
        return {}
    if start is None:
        return declared(driver, pool, {}, attributes)  # the whole card: all of its set
    if not isinstance(start, int) or start < 0 or attr(names.ATTR_UUID) is not None:
        return {}  # an instance that exists (made by hand) draws nothing: `standing`
    out = {(driver, pool, set_name, mig.memory_slice_counter(i)): ONE
           for i in range(start, start + slices)}
    out[(driver, pool, set_name, mig.COMPUTE_COUNTER)] = compute * ONE
    profile = attr(names.ATTR_PROFILE)
    if isinstance(profile, str) and mig.MEDIA_EXTENSIONS in profile:
        out[(driver, pool, set_name, mig.MEDIA_COUNTER)] = ONE
    return out


def standing(driver: str, pool: str, raw: Mapping[str, Any],
             attributes: Mapping[str, Any]) -> dict[CounterKey, int]:
    """What an instance that exists (made by hand: it has a `uuid`) holds of its card's set for
    good, where the fields were dropped: the node plugin leaves it out of the set it publishes
    where they are kept, so the declared set must lose it too."""
    attr = _reader(driver, attributes)
    if driver != names.DRIVER or raw.get("consumesCounters") or attr(names.ATTR_UUID) is None \
            or attr(names.ATTR_MIG_START) is None:
        return {}
    return _attribute_consumption(driver, pool, {k: v for k, v in attributes.items()
                                                 if k != f"{driver}/{names.ATTR_UUID}"})


def _reader(driver: str, attributes: Mapping[str, Any]) -> Any:
    return lambda name: attributes.get(f"{driver}/{name}")


def _counts(*values: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


def placement(consumption: Consumption, profile: Any, memory_mib: int
              ) -> tuple[SetKey, mig.Placement] | None:
    """The MIG placement a device's counters describe: one run of memory slices of one set
    (not all of them: the whole card is no placement); None for any other device."""
    if not isinstance(profile, str) or not consumption:
        return None
    set_key = consumption[0][0][:3]
    slices: list[int] = []
    compute = 0
    for key, amount in consumption:
        if key[:3] != set_key:
            return None
        match = _MEMORY_SLICE.fullmatch(key[3])
        if match is not None:
            slices.append(int(match.group(1)))
        elif key[3] == mig.COMPUTE_COUNTER:
            compute = amount // ONE
    slices.sort()
    if not slices or slices != list(range(slices[0], slices[0] + len(slices))):
        return None
    shape = mig.Profile(name=profile, profile_id=-1, compute_slices=compute,
                        memory_mib=memory_mib, size=len(slices), starts=(slices[0],))
    return set_key, mig.Placement(shape, slices[0])


def geometry(totals: Mapping[CounterKey, int],
             placements: list[tuple[SetKey, mig.Placement]]) -> dict[SetKey, mig.Geometry]:
    """Each card's MIG geometry as its published placements draw it: a profile per name, its
    starts those published; a set whose placements disagree on a profile's size is left out
    (the planner then keeps the strategy's order there)."""
    by_set: dict[SetKey, dict[str, list[mig.Placement]]] = {}
    for set_key, spot in placements:
        by_set.setdefault(set_key, {}).setdefault(spot.profile.name, []).append(spot)
    out: dict[SetKey, mig.Geometry] = {}
    for set_key, profiles in by_set.items():
        slices = sum(1 for key in totals if key[:3] == set_key
                     and _MEMORY_SLICE.fullmatch(key[3]))
        compute = totals.get((*set_key, mig.COMPUTE_COUNTER), 0) // ONE
        media = totals.get((*set_key, mig.MEDIA_COUNTER), ONE) // ONE
        shapes = []
        for name, spots in sorted(profiles.items()):
            first = spots[0].profile
            if any(s.profile.size != first.size for s in spots):
                break
            shapes.append(mig.Profile(name, first.profile_id, first.compute_slices,
                                      first.memory_mib, first.size,
                                      tuple(sorted({s.start for s in spots}))))
        else:
            try:
                out[set_key] = mig.Geometry(slices, compute, tuple(shapes), media)
            except ValueError:
                continue
    return out


def card_use(set_key: SetKey, geometry_: mig.Geometry, left: Mapping[CounterKey, int]
             ) -> mig.CardUse:
    """What a card's instances hold, read from its counters' room."""
    mask = 0
    for i in range(geometry_.memory_slices):
        if left.get((*set_key, mig.memory_slice_counter(i)), 0) < ONE:
            mask |= 1 << i
    media_left = left.get((*set_key, mig.MEDIA_COUNTER))
    media = 0 if media_left is None else max(
        0, geometry_.media_extension_instances - media_left // ONE)
    return mig.CardUse(mask, media)


__all__ = ["ONE", "Consumption", "CounterKey", "SetKey", "card_use", "consumed", "declared",
           "geometry", "placement", "shared_counters", "standing"]
