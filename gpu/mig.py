"""MIG geometry and placement: where each GPU instance profile may go on a card, and which
placement of a new instance keeps the most valuable profiles possible.

A MIG-capable card is cut into memory slices (8 on A100, H100 and H200) and compute slices (7).
A GPU instance of a profile takes a run of memory slices starting at one of the starts NVML
allows for that profile (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`), and at most one
instance per card may hold the media extensions (`+me`). The node plugin reads a `Geometry` from
NVML; nothing here knows a card model (other parts, such as H100 NVL or B200, differ).

Placement (`choose`): kube-scheduler takes the first device that fits in slice order, so a few
1g instances spread over a node's cards block every 3g, 4g and 7g there. Among the placements
that fit, the gateway takes the one that loses the least of what the node could still place,
the most valuable profiles first: a card's `capacity` is, for each profile from the largest down,
how many instances of that profile alone would still fit; a placement's `loss` is what it takes
from that vector on its card, compared largest profile first. Ties go to the fuller card (whole
free cards stay whole), then to the order the candidates came in, then to the lowest start.

Pure: no I/O, no cluster.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K")

MEDIA_EXTENSIONS = "+me"


@dataclass(frozen=True, slots=True)
class Profile:
    """A GPU instance profile as NVML describes it on one card model."""

    name: str  # NVIDIA's name: "1g.10gb", "1g.10gb+me", "7g.141gb"
    profile_id: int  # the GPU instance profile's id (nvidia-smi's "ID": 19, 20, 15, 14, 9, 5, 0)
    compute_slices: int
    memory_mib: int
    size: int  # memory slices per instance
    starts: tuple[int, ...]  # the memory slices an instance may start at
    # NVML's index of the profile (NVML_GPU_INSTANCE_PROFILE_*), which creating an instance
    # asks for; -1 where the profile was read from published devices.
    nvml_index: int = -1

    @property
    def media_extensions(self) -> bool:
        return MEDIA_EXTENSIONS in self.name

    def placements(self) -> tuple[Placement, ...]:
        return tuple(Placement(self, start) for start in self.starts)


@dataclass(frozen=True, slots=True)
class Placement:
    """One instance of `profile` starting at memory slice `start`."""

    profile: Profile
    start: int

    @property
    def mask(self) -> int:
        """The memory slices it takes, as bits (slice i is bit i)."""
        return ((1 << self.profile.size) - 1) << self.start

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.profile.size)


@dataclass(frozen=True, slots=True)
class Geometry:
    """What NVML says of one card model in MIG mode."""

    memory_slices: int
    compute_slices: int
    profiles: tuple[Profile, ...]
    media_extension_instances: int = 1  # instances per card that may hold them

    def __post_init__(self) -> None:
        for profile in self.profiles:
            if profile.size < 1 or any(
                    start < 0 or start + profile.size > self.memory_slices
                    for start in profile.starts):
                raise ValueError(f"MIG profile {profile.name}: placements "
                                 f"{list(profile.starts)} of {profile.size} slices do not fit "
                                 f"{self.memory_slices} memory slices")

    def profile(self, name: str) -> Profile:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        known = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"no MIG profile {name!r} on this card (it has {known})")

    def ranked(self) -> tuple[Profile, ...]:
        """The profiles, most valuable first: more memory slices, then more compute, then more
        memory, the one without media extensions before its `+me` twin."""
        return tuple(sorted(self.profiles, key=lambda p: (
            -p.size, -p.compute_slices, -p.memory_mib, p.media_extensions, p.name)))

    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1


@dataclass(frozen=True, slots=True)
class CardUse:
    """What a card's instances hold: memory slices as bits, and how many hold media
    extensions."""

    mask: int = 0
    media: int = 0

    def with_placement(self, placement: Placement) -> CardUse:
        return CardUse(self.mask | placement.mask,
                       self.media + placement.profile.media_extensions)

    def without_placement(self, placement: Placement) -> CardUse:
        if self.mask & placement.mask != placement.mask:
            raise ValueError(f"MIG {placement.profile.name} at slice {placement.start} is not "
                             "on this card")
        return CardUse(self.mask & ~placement.mask,
                       self.media - placement.profile.media_extensions)

    @property
    def used_slices(self) -> int:
        return self.mask.bit_count()


def fits(geometry: Geometry, use: CardUse, placement: Placement) -> bool:
    """Whether `placement` is free on a card holding `use`."""
    if use.mask & placement.mask:
        return False
    return not (placement.profile.media_extensions
                and use.media >= geometry.media_extension_instances)


def free_placements(geometry: Geometry, use: CardUse, profile: Profile) -> list[Placement]:
    return [p for p in profile.placements() if fits(geometry, use, p)]


def capacity(geometry: Geometry, use: CardUse) -> tuple[int, ...]:
    """For each profile of `geometry.ranked()`, how many instances of it alone still fit.

    Placements of one profile are runs of one length, so taking them by start is a largest
    disjoint set (interval scheduling). A card has few states (2^8 masks on 8 slices): cached."""
    return _capacity(geometry, use.mask, use.media)


@functools.lru_cache(maxsize=4096)
def _capacity(geometry: Geometry, used: int, media: int) -> tuple[int, ...]:
    out = []
    for profile in geometry.ranked():
        mask, count = used, 0
        room = (geometry.media_extension_instances - media
                if profile.media_extensions else geometry.memory_slices)
        for placement in profile.placements():
            if count < room and not mask & placement.mask:
                mask |= placement.mask
                count += 1
        out.append(count)
    return tuple(out)


def loss(geometry: Geometry, use: CardUse, placement: Placement) -> tuple[int, ...]:
    """What placing `placement` on a card holding `use` takes from its `capacity`."""
    before = capacity(geometry, use)
    after = capacity(geometry, use.with_placement(placement))
    return tuple(b - a for b, a in zip(before, after, strict=True))


@dataclass(frozen=True, slots=True)
class Card(Generic[K]):
    """A candidate card: its key (the caller's), its geometry and what it holds."""

    key: K
    geometry: Geometry
    use: CardUse = field(default_factory=CardUse)


def choose(cards: Iterable[Card[K]], profile_name: str) -> tuple[K, Placement] | None:
    """The card and placement for a new `profile_name` instance that keeps the most of the
    node's bigger profiles placeable (module docstring); None when it fits nowhere. Cards
    without that profile are passed over."""
    best: tuple[tuple[tuple[int, ...], int, int, int], K, Placement] | None = None
    for order, card in enumerate(cards):
        profile = _find(card.geometry, profile_name)
        if profile is None:
            continue
        for placement in free_placements(card.geometry, card.use, profile):
            rank = (loss(card.geometry, card.use, placement), -card.use.used_slices, order,
                    placement.start)
            if best is None or rank < best[0]:
                best = (rank, card.key, placement)
    return None if best is None else (best[1], best[2])


def first_fit(cards: Iterable[Card[K]], profile_name: str) -> tuple[K, Placement] | None:
    """kube-scheduler's choice among devices published card by card, placements by start:
    the first that fits."""
    for card in cards:
        profile = _find(card.geometry, profile_name)
        if profile is not None:
            for placement in free_placements(card.geometry, card.use, profile):
                return card.key, placement
    return None


def _find(geometry: Geometry, name: str) -> Profile | None:
    return next((p for p in geometry.profiles if p.name == name), None)


# --- names -------------------------------------------------------------------------------------

_PROFILE = re.compile(r"(?:[1-9][0-9]*c\.)?[1-9][0-9]*g\.[1-9][0-9]*gb")
_LEGACY_PREFIX = "nvidia.com/mig-"


def profile_of_resource(resource: str) -> str | None:
    """The MIG profile NVIDIA's device plugin (mixed strategy) names by `resource`, with its
    `+` written back (`nvidia.com/mig-1g.10gb.me` is `1g.10gb+me`); None for other names."""
    if not resource.startswith(_LEGACY_PREFIX):
        return None
    rest = resource[len(_LEGACY_PREFIX):]
    base = _PROFILE.match(rest)
    if base is None:
        return None
    extra = rest[base.end():]
    if not extra:
        return rest
    if not re.fullmatch(r"(\.[a-z][a-z0-9]*)+", extra):
        return None
    return f"{base.group()}+{extra[1:]}"


def resource_of_profile(profile: str) -> str:
    """The device plugin's resource name of `profile` (`+` written as `.`)."""
    return _LEGACY_PREFIX + profile.replace("+", ".")


def device_name(minor: int, placement: Placement) -> str:
    """The published device of a placement, as NVIDIA's DRA driver names them:
    `gpu-<minor>-mig-<profile, letters and digits only>-<profile id>-<start>`."""
    letters = re.sub(r"[^a-z0-9]", "", placement.profile.name.lower())
    return f"gpu-{minor}-mig-{letters}-{placement.profile.profile_id}-{placement.start}"


def counter_set_name(minor: int) -> str:
    return f"gpu-{minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


MEDIA_COUNTER = "media-extensions"
COMPUTE_COUNTER = "compute-slices"


def shared_counters(geometry: Geometry, minor: int) -> dict[str, Any]:
    """The card's counter set (`sharedCounters` entry): a counter per memory slice, the
    compute slices, and the instances that may hold media extensions."""
    return {"name": counter_set_name(minor), "counters": _counters(geometry)}


def _counters(geometry: Geometry) -> dict[str, dict[str, str]]:
    """Every counter of a card's set at its full value."""
    counters = {memory_slice_counter(i): {"value": "1"} for i in range(geometry.memory_slices)}
    counters[COMPUTE_COUNTER] = {"value": str(geometry.compute_slices)}
    counters[MEDIA_COUNTER] = {"value": str(geometry.media_extension_instances)}
    return counters


def consumed_counters(minor: int, placement: Placement | None,
                      geometry: Geometry) -> dict[str, Any]:
    """A device's `consumesCounters` entry: a placement's slices, compute and media extension;
    `placement` None is the whole card, which consumes every counter."""
    if placement is None:
        counters = _counters(geometry)
    else:
        counters = {memory_slice_counter(i): {"value": "1"} for i in placement.slices}
        counters[COMPUTE_COUNTER] = {"value": str(placement.profile.compute_slices)}
        if placement.profile.media_extensions:
            counters[MEDIA_COUNTER] = {"value": "1"}
    return {"counterSet": counter_set_name(minor), "counters": counters}


def compute_percent(geometry: Geometry, compute_slices: int) -> int:
    """An instance's compute as the gateway's `cores` count it (100 = the card's), rounded
    down so that a card's instances never add up past the card: 1 slice of 7 is 14."""
    if geometry.compute_slices <= 0:
        return 0
    return compute_slices * 100 // geometry.compute_slices


def smallest_fitting(geometry: Geometry, *, memory_mib: int = 0,
                     compute_percent: int = 0, limit: int = 8) -> list[Profile]:
    """The profiles without media extensions that give at least `memory_mib` of memory and
    `compute_percent` of the card's compute, smallest first (HAMi's and Volcano's MIG modes:
    offered in order, at most `limit` — a claim's `firstAvailable` takes 8)."""
    fitting = [p for p in geometry.profiles
               if not p.media_extensions and p.memory_mib >= memory_mib
               and p.compute_slices * 100 >= compute_percent * geometry.compute_slices]
    fitting.sort(key=lambda p: (p.memory_mib, p.compute_slices, p.size, p.name))
    return fitting[:limit]


def placements_of(geometry: Geometry, profiles: Sequence[Profile] | None = None
                  ) -> list[Placement]:
    """Every legal placement of `profiles` (all by default), by profile then start, as a card's
    devices are published."""
    return [p for profile in (profiles or geometry.profiles) for p in profile.placements()]
