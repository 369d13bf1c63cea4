"""Shares served by MIG instances: what a GPUSharingPolicy's `shares.servedBy: MIG` does to a
translated share.

Where the namespace's sharing policies ask for it, a share of a card that a rule of the
gateway's GPU class computes (memory, a percent of the card's memory, compute) becomes one MIG
instance per card instead, which the hardware isolates: the known profiles that hold the share,
smallest first, offered in order with DRA `firstAvailable` (as the rules hami-mig and
volcano-mig offer them), then any instance of another model that fits. The instance's own slice
of memory and compute replaces the share, so HAMi-core or MPS enforcement goes with it.

A percent of the card's memory is read against each profile's memory slices (of the 8 every
known model has), at the fewest slices any model gives the name (A100 40GB's 1g.10gb holds two
slices, H100's one): the instance holds at least the percent on every model. A profile's
memory in its name is at least the instance's, so a share in bytes is checked on the device's
own capacity too. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_gateway.kube import names
from dra_gateway.translator.evaluation import MAX_SUBREQUESTS, subrequest_names
from dra_gateway.translator.ruleset import CompiledSelector
from dra_gateway.translator.selectors import render_selector

# The smallest profiles that fit, then any instance that fits: as many as firstAvailable holds.
MAX_PROFILES: Final = MAX_SUBREQUESTS - 1
MEMORY_SLICES: Final = 8  # of every known MIG model (A100, H100, H200)
COMPUTE_SLICES: Final = 7
ANY_INSTANCE: Final = ""


# The attributes of a card a rule's selectors test, and the attribute of an instance that
# names the same card (an instance's `uuid` is its own).
CARD_ATTRIBUTES: Final = {names.ATTR_UUID: names.ATTR_PARENT_UUID}


@dataclass(frozen=True, slots=True)
class KnownProfile:
    name: str  # as NVML names it: "<compute slices>g.<memory GB>gb"
    memory_slices: int  # the fewest any known model gives this name

    @property
    def compute_slices(self) -> int:
        return int(self.name.split("g.", 1)[0])

    @property
    def memory_gb(self) -> int:
        return int(self.name.split(".", 1)[1].removesuffix("gb"))


# The profiles of the MIG cards the gateway knows (A100 40GB and 80GB, H100 80GB, H200), in the
# order of the built-in rule hami-mig's knownProfiles (a test keeps them alike, and checks the
# memory slices against the stand-in's geometry): smallest memory first, then fewest compute
# slices.
KNOWN_PROFILES: Final = tuple(KnownProfile(name, slices) for name, slices in (
    ("1g.5gb", 1), ("1g.10gb", 1), ("2g.10gb", 2), ("1g.18gb", 1), ("1g.20gb", 2),
    ("2g.20gb", 2), ("3g.20gb", 4), ("4g.20gb", 4), ("1g.35gb", 2), ("2g.35gb", 2),
    ("3g.40gb", 4), ("4g.40gb", 4), ("7g.40gb", 8), ("3g.71gb", 4), ("4g.71gb", 4),
    ("7g.80gb", 8), ("7g.141gb", 8)))


@dataclass(frozen=True, slots=True)
class Share:
    """A share of one card as a rule computed it: memory in bytes, or as a percent of the card,
    and compute as a percent of the card (0: not asked)."""

    memory: int = 0
    percent: int = 0
    cores: int = 0


def holds(profile: KnownProfile, share: Share) -> bool:
    """Whether an instance of `profile` holds `share` on every model that has the profile (the
    bytes as its name says; the device's capacity is checked too)."""
    memory_mib = share.memory // (1 << 20)
    return (profile.memory_gb * 1024 >= memory_mib
            and profile.memory_slices * 100 >= share.percent * MEMORY_SLICES
            and profile.compute_slices * 100 >= share.cores * COMPUTE_SLICES)


def alternatives(share: Share) -> list[str]:
    """The profiles offered for `share`, in order, then `ANY_INSTANCE` (an instance of a model
    the gateway does not know, checked on its published memory and compute) unless the share
    is a percent of memory, which such an instance cannot be checked against."""
    fitting = [p.name for p in KNOWN_PROFILES if holds(p, share)][:MAX_PROFILES]
    return fitting if share.percent else [*fitting, ANY_INSTANCE]


def request(name: str, *, count: int, share: Share, selectors: Sequence[str],
            driver: str) -> dict[str, Any]:
    """The device request `name` becomes: `count` instances (one per card of the share), each
    of the alternatives' profile and holding the share, with the rule's own `selectors` (already
    rendered for MIG devices)."""
    items = alternatives(share)
    subrequests = []
    for label, item in zip(subrequest_names(items), items, strict=True):
        tests = list(selectors)
        if item != ANY_INSTANCE:
            tests.append(render_selector(_PROFILE, driver, [item]) or "")
        if share.memory:
            tests.append(render_selector(_MEMORY, driver, [str(share.memory)]) or "")
        if item == ANY_INSTANCE and share.cores:
            tests.append(render_selector(_CORES, driver, [str(share.cores)]) or "")
        subrequests.append({"name": label, "deviceClassName": names.MIG_CLASS,
                            "allocationMode": "ExactCount", "count": count,
                            "selectors": [{"cel": {"expression": t}} for t in tests]})
    if len(subrequests) == 1:
        only = subrequests[0]
        del only["name"]
        return {"name": name, "exactly": only}
    return {"name": name, "firstAvailable": subrequests}


def _selector(attribute: str, op: str) -> CompiledSelector:
    return CompiledSelector(cel=None, attribute=attribute, op=op, values=None, separator=None,
                            when=None)


_PROFILE: Final = _selector(names.ATTR_PROFILE, "equals")
_MEMORY: Final = _selector(names.CAPACITY_MEMORY, "atLeast")
_CORES: Final = _selector(names.CAPACITY_CORES, "atLeast")

