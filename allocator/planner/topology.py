"""Which cards a multi-card request tries first: as close together as the node allows.

A request for several cards on a node with topology facts prefers cards of the fewest NVLink
islands, then the fewest NUMA nodes, then the fewest PCIe roots, as the node plugin publishes
them (`nvlinkIsland`, `resource.kubernetes.io/numaNode` or the driver's `numaNode`,
`resource.kubernetes.io/pcieRoot`). It is a preference, not a constraint: `aligned` only
reorders the cards the search would try, best-aligned set first, and the search falls back to
the others (DRA's `matchAttribute` constraints are how a claim makes alignment required).

Between nodes, a placement's `misalignment` comes before the packing strategy's score: a node
where the request's cards are together is preferred to one where they would spread.

Levels are taken outermost first. At each level the cards are grouped by their value; if
groups can hold the whole request, the one whose best arrangement spans the fewest domains at
the levels below wins, the smaller group on a tie (best fit: a larger domain stays whole for a
larger request), then the first in the strategy's order; otherwise the request spans groups,
largest first. Within a group the strategy's order is kept. A card lacking a level's attribute
is a domain of its own there; a level no card publishes is skipped. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from dra_gateway.allocator.planner.devices import Device
from dra_gateway.kube import names

Key = tuple[object, ...]

# Standard names first: a driver publishing both gives the same value.
_NUMA: Final = (names.ATTR_NUMA_NODE_STANDARD, names.ATTR_NUMA_NODE)
_LEVELS: Final = 3  # NVLink island, NUMA node, PCIe root


def topology_key(device: Device) -> Key:
    """The card's domains, outermost first; None where it does not say."""
    attrs = device.attributes
    island = attrs.get(f"{device.driver}/{names.ATTR_NVLINK_ISLAND}")
    numa = next((v for name in _NUMA
                 if (v := attrs.get(name if "/" in name else f"{device.driver}/{name}"))
                 is not None), None)
    return (island, numa, attrs.get(names.ATTR_PCIE_ROOT))


def aligned(devices: Sequence[Device], ordered: list[int], need: int) -> list[int]:
    """`ordered` (device positions, in the strategy's order) rearranged so that the first
    `need` are the best-aligned set (see the module); the same list when there is no choice."""
    if need < 2 or len(ordered) <= need:
        return ordered
    keys = {i: topology_key(devices[i]) for i in ordered}
    first = keys[ordered[0]]
    if all(k == first for k in keys.values()):
        return ordered  # one domain at every level, or no topology published: no choice
    return _arrange(ordered, keys, need, 0)


def _arrange(items: list[int], keys: dict[int, Key], need: int, level: int) -> list[int]:
    if level == _LEVELS or need < 2 or len(items) <= 1:
        return items
    if all(keys[i][level] is None for i in items):
        return _arrange(items, keys, need, level + 1)  # the level is not published here
    groups = _groups(items, keys, level)
    if len(groups) == 1:
        return _arrange(items, keys, need, level + 1)
    fitting = [g for g in groups if len(g) >= need]
    if fitting:
        best: tuple[tuple[int, ...], int, int] | None = None
        best_head: list[int] = []
        best_group: list[int] = []
        for position, group in enumerate(fitting):
            head = _arrange(group, keys, need, level + 1)
            rank = (_spread(head[:need], keys, level + 1), len(group), position)
            if best is None or rank < best:
                best, best_head, best_group = rank, head, group
        taken = set(best_group)
        return best_head + [i for i in items if i not in taken]
    out: list[int] = []
    remaining = need
    for group in sorted(groups, key=len, reverse=True):  # stable: the strategy's order on ties
        take = min(len(group), remaining)
        out += _arrange(group, keys, take, level + 1) if take else group
        remaining -= take
    return out


def _groups(items: list[int], keys: dict[int, Key], level: int) -> list[list[int]]:
    """Items by their value at `level`, in order of first appearance; a card without the
    attribute alone."""
    by_value: dict[object, list[int]] = {}
    groups: list[list[int]] = []
    for i in items:
        value = keys[i][level]
        if value is None:
            groups.append([i])
            continue
        group = by_value.get(value)
        if group is None:
            group = by_value[value] = []
            groups.append(group)
        group.append(i)
    return groups


def _spread(chosen: list[int], keys: dict[int, Key], level: int) -> tuple[int, ...]:
    """How many domains `chosen` spans at each level from `level` in (a missing value counts
    as a domain of its own)."""
    out = []
    for lv in range(level, _LEVELS):
        values = [keys[i][lv] for i in chosen]
        out.append(len({v for v in values if v is not None}) + values.count(None))
    return tuple(out)


def misalignment(devices: Sequence[Device], chosen: Sequence[int]) -> int:
    """One number for how far cards `chosen` spread, 0 when together at every level: each
    NVLink island past the first weighs more than any spread of NUMA nodes, and each NUMA node
    more than any spread of PCIe roots (nodes compare by it before their packing score)."""
    islands, numas, roots = span(devices, chosen)
    return (islands - 1) * 10_000 + (numas - 1) * 100 + (roots - 1)


def span(devices: Sequence[Device], chosen: Sequence[int]) -> tuple[int, ...]:
    """How many NVLink islands, NUMA nodes and PCIe roots the cards `chosen` span."""
    keys = {i: topology_key(devices[i]) for i in chosen}
    return _spread(list(chosen), keys, 0)


__all__ = ["aligned", "misalignment", "span", "topology_key"]
