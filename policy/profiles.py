"""Device profiles: the distinct kinds of card a cluster publishes, and the models a request's
selectors can reach among them, for /validate's allowed-models check.

A GPUSharingPolicy's `allowedModels` depends on the card, so the allocator enforces it per card
(`sharing.card_refusal`). /validate refuses at once a request that can never be admitted: one
whose selectors match only cards of forbidden models. It need not look at every device for that:
devices that differ only in what identifies one physical card (`IDENTITY_ATTRIBUTES`: its UUID,
its PCI address) answer every other selector alike, so a cluster of thousands of cards publishes
a few dozen **profiles** (one per model, MIG profile, index, driver version...).

`profile_signature` is what makes two devices one profile; `DeviceProfiles` is the set a mirror
of ResourceSlices publishes, with a generation that moves only when the set changes.
`ModelReach.models` evaluates a request's selectors (its DeviceClass's, then its own, each
alternative of a firstAvailable request) against the profiles with the same CEL evaluation the
allocator runs on devices (`Selector.matches` on a `device_view`), within a cost budget, and
remembers the answer per (selectors, generation): repeated reviews cost no CEL.

It answers None, "cannot tell, leave it to the allocator", when a selector cannot be judged on
profiles (one that reads an identity attribute or walks the attributes with a macro, as the
allocator's own grouping of devices decides), a selector does not compile or fails on a profile
(the allocator reports the error to the user), the budget is spent, or an alternative's
DeviceClass is unknown or not the gateway's. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from dra_gateway.kube import cel, names
from dra_gateway.kube.cel.devices import IDENTITY_ATTRIBUTES, may_read_identity
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.policy.amounts import RequestShape
from dra_gateway.policy.sharing import SharingRules

# One review evaluates each selector on each profile at most once; ten times what a selector may
# cost by itself (cel.COST_LIMIT) is far above a few selectors over a few dozen profiles.
DEFAULT_COST_LIMIT = 10 * cel.COST_LIMIT

Models = frozenset[str | None]  # product names; None for a card publishing none
# An alternative as the check reads it: its DeviceClass's selectors (None: the class is unknown
# or not the gateway's) and its own selectors, CEL expressions in the order they apply.
Selectors = tuple[tuple[str, ...] | None, tuple[str, ...]]


def _identity(driver: str, name: str) -> bool:
    domain, slash, ident = name.rpartition("/")
    return name in IDENTITY_ATTRIBUTES or (bool(slash) and domain in ("", driver)
                                           and ident in IDENTITY_ATTRIBUTES)


def profile_device(driver: str, device: Mapping[str, Any]) -> dict[str, Any]:
    """What a selector can see of a published device, identity attributes left out."""
    attributes = device.get("attributes")
    capacity = device.get("capacity")
    return {
        "attributes": {k: v for k, v in attributes.items() if not _identity(driver, k)}
        if isinstance(attributes, Mapping) else {},
        "capacity": {k: {"value": v.get("value")} for k, v in capacity.items()
                     if isinstance(v, Mapping)} if isinstance(capacity, Mapping) else {},
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }


def profile_signature(driver: str, device: Mapping[str, Any]) -> str:
    """Equal for devices every selector that reads no identity attribute answers alike."""
    return json.dumps([driver, profile_device(driver, device)], sort_keys=True, default=str)


def product_name(driver: str, device: Mapping[str, Any]) -> str | None:
    """The card's model as the allocator reads it: the driver's `productName` attribute."""
    attributes = device.get("attributes")
    if not isinstance(attributes, Mapping):
        return None
    for key in (names.ATTR_PRODUCT_NAME, f"{driver}/{names.ATTR_PRODUCT_NAME}"):
        value = attributes.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("string"), str):
            return str(value["string"])
    return None


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    signature: str
    driver: str
    device: Mapping[str, Any]  # profile_device(): treat as read-only
    product_name: str | None


@dataclass(frozen=True, slots=True)
class DeviceProfiles:
    """The distinct profiles of the devices published now; `generation` moves when they change."""

    profiles: tuple[DeviceProfile, ...] = ()
    generation: int = 0

    def smallest_card_memory(self) -> int:
        """Bytes of the smallest GPU (not MIG instance) of the gateway's driver published, 0
        when none: the least a whole card costs wherever it lands, as the allocator reads it."""
        sizes = []
        for profile in self.profiles:
            if profile.driver != names.DRIVER:
                continue
            attributes = profile.device.get("attributes") or {}
            kind = attributes.get(names.ATTR_TYPE) or \
                attributes.get(f"{names.DRIVER}/{names.ATTR_TYPE}") or {}
            if isinstance(kind, Mapping) and kind.get("string", "gpu") != "gpu":
                continue
            memory = (profile.device.get("capacity") or {}).get(names.CAPACITY_MEMORY)
            value = memory.get("value") if isinstance(memory, Mapping) else None
            try:
                sizes.append(parse_quantity(str(value)).value())
            except (QuantityError, TypeError):
                continue
        return min(sizes, default=0)


class ModelReach:
    """Which models a request's selectors reach among the cluster's profiles, remembered per
    (selectors, profile generation), and whether sharing rules allow any of them, remembered
    with the rules' patterns. Not thread-safe: one event loop uses it."""

    def __init__(self, *, cost_limit: int = DEFAULT_COST_LIMIT, cache_size: int = 4096) -> None:
        self._cost_limit = cost_limit
        self._answers: LRUCache[tuple[int, tuple[Selectors, ...]], Models | None] = \
            LRUCache(cache_size)
        self._verdicts: LRUCache[
            tuple[int, tuple[Selectors, ...], tuple[tuple[str, ...], ...]], Models | None] = \
            LRUCache(cache_size)
        self._selectors: LRUCache[str, cel.Selector | cel.CelError] = LRUCache(cache_size)
        # The CEL views of the profiles of one generation; each keeps the verdict of every
        # selector evaluated on it, so they are built afresh after `cache_size` misses.
        self._views: dict[str, cel.DeviceView] = {}
        self._views_generation = -1
        self._misses = 0
        self._cache_size = cache_size
        self.evaluations = 0  # answers computed (cache misses), for tests and metrics

    def forbidden(self, profiles: DeviceProfiles, alternatives: tuple[Selectors, ...],
                  rules: SharingRules) -> Models | None:
        """The models the alternatives reach when `rules` allow none of them (the request can
        never be admitted), else None; remembered with the rules' patterns, so that a repeated
        review costs one lookup (matching the patterns costs more than that)."""
        key = (profiles.generation, alternatives, rules.models)
        try:
            return self._verdicts[key]
        except KeyError:
            pass
        reached = self.models(profiles, alternatives)
        verdict = reached if reached and not any(rules.allows_model(m) for m in reached) \
            else None
        self._verdicts[key] = verdict
        return verdict

    def models(self, profiles: DeviceProfiles,
               alternatives: Sequence[Selectors]) -> Models | None:
        """The models of the profiles some alternative selects (empty when none is selected),
        or None when profiles cannot tell (see the module's docstring)."""
        key = (profiles.generation, tuple(alternatives))
        try:
            return self._answers[key]
        except KeyError:
            pass
        answer = self._evaluate(profiles, key[1])
        self._answers[key] = answer
        return answer

    def _evaluate(self, profiles: DeviceProfiles,
                  alternatives: tuple[Selectors, ...]) -> Models | None:
        self.evaluations += 1
        if not alternatives:
            return None
        compiled: list[list[cel.Selector]] = []
        for class_selectors, own in alternatives:
            if class_selectors is None:
                return None
            expressions = (*class_selectors, *own)
            if any(may_read_identity(e) for e in expressions):
                return None
            try:
                compiled.append([self._compiled(e) for e in expressions])
            except cel.CelError:
                return None
        views = self._views_of(profiles)
        found: set[str | None] = set()
        try:
            with cel.cost_budget(self._cost_limit):
                for profile in profiles.profiles:
                    view = views.get(profile.signature)
                    if view is None:
                        return None
                    # A device is selected when every selector holds, checked in order and
                    # stopping at the first that does not, as the allocator does; any error
                    # stops the check.
                    if any(all(s.matches(view) for s in selectors) for selectors in compiled):
                        found.add(profile.product_name)
        except (cel.CelError, cel.CostBudgetExceeded):
            return None
        return frozenset(found)

    def _compiled(self, expression: str) -> cel.Selector:
        """A selector compiled once (kept across generations: the cards change, not it)."""
        found = self._selectors.get(expression)
        if found is None:
            try:
                found = cel.compile_selector(expression)
            except cel.CelError as exc:
                found = exc
            self._selectors[expression] = found
        if isinstance(found, cel.CelError):
            raise found
        return found

    def _views_of(self, profiles: DeviceProfiles) -> dict[str, cel.DeviceView]:
        self._misses += 1
        if self._views_generation != profiles.generation or self._misses > self._cache_size:
            views: dict[str, cel.DeviceView] = {}
            for profile in profiles.profiles:
                try:
                    views[profile.signature] = cel.device_view(profile.driver,
                                                               profile.device)
                except ValueError:
                    continue  # an attribute the API server would have refused: cannot judge
            self._views = views
            self._views_generation = profiles.generation
            self._misses = 0
        return self._views


def model_lookup(reach: ModelReach, profiles: DeviceProfiles,
                 class_selectors: Callable[[str], tuple[str, ...] | None]
                 ) -> Callable[[RequestShape, SharingRules], Models | None]:
    """`check_admission`'s `models`: a request's alternatives, each with its DeviceClass's
    selectors (`class_selectors(name)`, None when unknown), asked of `reach`. An alternative of
    another driver's class may land on cards no sharing policy reads: then it cannot tell."""
    def lookup(shape: RequestShape, rules: SharingRules) -> Models | None:
        return reach.forbidden(profiles, tuple(
            (class_selectors(class_name) if class_name in names.GATEWAY_CLASSES else None, own)
            for class_name, own in shape.alternatives), rules)
    return lookup
