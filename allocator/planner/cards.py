"""What a share takes of one card, and what the sharing rules read of the card.

`wanted_amount` and `unnamed_charge` say what a request is charged of each capacity of a
device (upstream's `capacity.requests` rule, and the GpuShareConfig where the API server
dropped it); `card_product` is the card's model as allowedModels reads it; `short_share` a
share relative to the card that falls below minShare. The device search (`search.py`) and the
checks of its picks (`visit.py`) ask them. Pure: no I/O.
"""

from __future__ import annotations

from dra_gateway.allocator.planner.demand import Alternative, memory_for
from dra_gateway.allocator.planner.devices import NANO, Device
from dra_gateway.kube import names
from dra_gateway.policy.sharing import SharingRules


def wanted_amount(alt: Alternative, device: Device, cap_name: str) -> int | None:
    """The amount of `cap_name` (nanos) a share names on `device`, or None if it names none:
    `capacity.requests` first, else the GpuShareConfig (memory resolved for the card)."""
    wanted = alt.capacity.get(cap_name)
    if wanted is None and cap_name == names.CAPACITY_MEMORY:
        share_memory = memory_for(alt.share, device.gpu_memory)
        if share_memory is not None:
            wanted = share_memory * NANO
    if wanted is None and cap_name == names.CAPACITY_CORES and alt.share.cores is not None:
        wanted = alt.share.cores * NANO
    return wanted


def unnamed_charge(alt: Alternative, device: Device, cap_name: str) -> tuple[int, str]:
    """What a share is charged (nanos) for a capacity of `device` it names no amount of, and why.

    Upstream's rule for `capacity.requests`: a capacity left out is charged its request
    policy's default, or the whole capacity where it has no policy. Without the
    DRAConsumableCapacity gate the devices carry no policy, so a request that states
    `capacity.requests` there is charged the whole capacity it leaves out: what the node
    plugin's policy (whose default is the whole card) charges it with the gate on, so the same
    claim gets the same share in both worlds. A share given by its GpuShareConfig alone is
    charged nothing for what it leaves out: that is how every share reaches the planner
    without the gate (the API server drops `capacity.requests`), and a memory-only share
    (gpushare, HAMi `gpumem`) limits no compute and shares the card with others.
    """
    policy = device.policies.get(cap_name)
    if policy is not None and policy.default is not None:
        return policy.default, "the request policy's default"
    if device.raw.get("allowMultipleAllocations"):
        return device.capacity[cap_name], "all of it: the device has no request policy for it"
    if alt.capacity:
        return device.capacity[cap_name], "all of it: capacity.requests leaves it out"
    return 0, ""




def card_product(device: Device) -> str | None:
    """The card's productName attribute, as allowedModels reads it."""
    value = device.attributes.get(f"{device.driver}/{names.ATTR_PRODUCT_NAME}")
    return None if value is None else str(value)


def short_share(alt: Alternative, device: Device, rules: SharingRules) -> int | None:
    """The bytes of a share relative to the card's memory where they fall below the rules'
    minShare memory, else None (a share naming its memory is checked at admission)."""
    if rules.min_memory is None or alt.whole or not device.shareable \
            or alt.share.memory_percent is None or names.CAPACITY_MEMORY in alt.capacity:
        return None
    share = memory_for(alt.share, device.gpu_memory) or 0
    return share if share < rules.min_memory else None


__all__ = ["card_product", "short_share", "unnamed_charge", "wanted_amount"]
