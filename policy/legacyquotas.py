"""ResourceQuotas on legacy GPU names, turned into the equivalent `GPUQuota`.

A namespace moving to the gateway keeps its limits only if every ResourceQuota on a legacy GPU
name (`requests.nvidia.com/gpu`, HAMi's `limits.nvidia.com/gpumem`, Volcano, gpushare, qGPU,
Koordinator...) has a GPUQuota counting the same thing in the gateway's terms: cards
(`devices`), bytes of GPU memory (`memory`) and percent of a card's compute (`cores`).
`convert_resource_quota` does that for one ResourceQuota and says, entry by entry, what each
key became, and what has no equivalent and why (a percentage of a card's memory, a scope, a
count of cards another driver allocates): nothing is dropped without a word.

What a name counts and in what unit are the protocols' facts, one row per name in the core's
table (`gpu/legacy_resources.py`), turned here into GPUQuota terms (`KNOWN_NAMES`, derived:
a new name needs no line here). The caller may pass what the translation rules in force say
about a name (`Route`: the rule, its class and its unit), so a site that reads gpushare memory
in MiB gets its quota in MiB too, and a name the rules send to another driver's class is
reported rather than counted.

Pure: it takes the ResourceQuota as a plain dict and returns data. It must not do I/O, read the
cluster or import the translator (the caller turns its rules into `Route`s).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from dra_gateway.gpu.legacy_resources import (
    LEGACY_RESOURCES,
    UNITS,
    LegacyResource,
    legacy_resource,
)
from dra_gateway.kube import names
from dra_gateway.kube.quantity import (
    Quantity,
    QuantityError,
    mistaken_suffix,
    mistaken_unit_message,
    parse_quantity,
)

__all__ = [
    "KNOWN_NAMES",
    "SOURCE_ANNOTATION",
    "Converted",
    "Dimension",
    "LegacyName",
    "QuotaConversion",
    "Route",
    "Unconverted",
    "convert_resource_quota",
    "legacy_name",
]

Dimension = Literal["devices", "memory", "cores"]

# The annotation naming, on a GPUQuota this module produced, the ResourceQuota it came from.
SOURCE_ANNOTATION: Final = f"{names.DOMAIN}/resource-quota"
# A ResourceQuota refuses a pod at creation; the GPUQuota equivalent does the same (the gateway's
# default, Queue, would let the pod wait instead: a change of behaviour the user should choose).
ADMISSION: Final = "Refuse"
_PREFIXES: Final = ("requests.", "limits.")


@dataclass(frozen=True, slots=True)
class LegacyName:
    """What a legacy resource name counts, in GPUQuota terms.

    `dimension` None: it has no GPUQuota equivalent, for the reason in `why`. `unit` is what
    one of it is worth in the dimension (bytes for memory; 1 for cards and percent)."""

    dimension: Dimension | None
    unit: int = 1
    why: str = ""
    note: str = ""  # how the equivalence is loose, when it is


_PERCENT_OF_MEMORY: Final = ("a percentage of each card's memory, while a GPUQuota counts "
                             "bytes; set spec.hard.memory by hand (percent x the cards' memory)")
# Why a name that counts none of the GPUQuota's dimensions has no equivalent, by what it counts.
_NO_DIMENSION: Final[Mapping[str, str]] = {
    "memory-percent": _PERCENT_OF_MEMORY,
    "priority": "a task priority hint, not an amount",
}


def _in_gpu_quota_terms(resource: LegacyResource) -> LegacyName:
    """What a row of the core's table counts in GPUQuota terms."""
    if resource.allocator:
        return LegacyName(None, why=f"{resource.allocator} allocates these, not the gateway; "
                                    "keep the ResourceQuota for them")
    counts = resource.counts
    if counts in ("devices", "memory", "cores"):
        return LegacyName(counts, UNITS[resource.unit], note=resource.note)
    return LegacyName(None, why=_NO_DIMENSION[counts])


# Protocol facts in GPUQuota terms, for every name of the core's table
# (gpu.legacy_resources, reference "Legacy and vendor GPU request protocols"), keyed as it is
# there: a name ending in "*" is a prefix.
KNOWN_NAMES: Final[Mapping[str, LegacyName]] = {
    resource.name: _in_gpu_quota_terms(resource) for resource in LEGACY_RESOURCES}


@dataclass(frozen=True, slots=True)
class Route:
    """What the translation rules in force do with a legacy name.

    `rule` translates it to `class_name`; `gateway` is whether that class is one the gateway
    allocates (and a GPUQuota counts); `unit` is the rule's unit for the name (bytes per unit
    for memory). `enabled` False: only a disabled rule reads it."""

    rule: str
    class_name: str
    gateway: bool
    unit: int = 1
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class Converted:
    """A key of `spec.hard` and what it became in the GPUQuota."""

    key: str
    value: str
    dimension: Dimension
    amount: int  # cards, bytes or percent
    note: str = ""


@dataclass(frozen=True, slots=True)
class Unconverted:
    """A legacy GPU key of `spec.hard` with no GPUQuota equivalent, and why."""

    key: str
    value: str
    reason: str


@dataclass(frozen=True, slots=True)
class QuotaConversion:
    """One ResourceQuota on legacy GPU names and the GPUQuota equivalent to it.

    `gpu_quota` is None when no key converts (then `unconverted` says why each does not).
    `warnings` are about the quota as a whole (its scopes, limits summed over names)."""

    namespace: str
    name: str
    gpu_quota: dict[str, Any] | None
    converted: tuple[Converted, ...] = ()
    unconverted: tuple[Unconverted, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def where(self) -> str:
        return f"ResourceQuota {self.namespace}/{self.name}"

    def messages(self) -> list[str]:
        """Every warning and unconverted key, each a line naming the ResourceQuota."""
        out = [f"{self.where}: {w}" for w in self.warnings]
        out.extend(f"{self.where}: spec.hard[{u.key!r}] = {u.value} has no GPUQuota "
                   f"equivalent: {u.reason}" for u in self.unconverted)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "resourceQuota": {"namespace": self.namespace, "name": self.name},
            "gpuQuota": self.gpu_quota,
            "converted": [{"key": c.key, "value": c.value, "dimension": c.dimension,
                           "amount": c.amount, **({"note": c.note} if c.note else {})}
                          for c in self.converted],
            "unconverted": [{"key": u.key, "value": u.value, "reason": u.reason}
                            for u in self.unconverted],
            "warnings": list(self.warnings),
        }


def legacy_name(name: str) -> LegacyName | None:
    """The protocol facts of a resource name (no prefix such as `requests.`), None if unknown."""
    known = legacy_resource(name)
    return KNOWN_NAMES.get(known.name) if known is not None else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _base(key: str) -> str:
    for prefix in _PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def _amount(value: Any, unit: int) -> tuple[int | None, str]:
    """The whole amount `value` (a quantity) times `unit`, or why it is not one."""
    try:
        quantity = parse_quantity(value if isinstance(value, (str, int)) else str(value))
    except (QuantityError, TypeError, ValueError) as exc:
        return None, f"{value!r} is not a quantity ({exc})"
    if quantity.sign() < 0:
        return None, f"{value} is negative"
    scaled = quantity.as_fraction() * unit
    if scaled.denominator != 1:
        return None, f"{value} is not a whole number of {'bytes' if unit > 1 else 'units'}"
    return int(scaled), ""


def _facts(name: str, route: Callable[[str], Route | None] | None) -> LegacyName | None:
    """The facts of `name` under the rules in force (the protocol's when no rule reads it)."""
    known = legacy_name(name)
    found = route(name) if route is not None else None
    if found is None:
        return known
    if not found.enabled:
        return LegacyName(None, why=f"only rule {found.rule} reads it, and it is disabled: the "
                                    "gateway does not translate it")
    if not found.gateway:
        return LegacyName(None, why=f"rule {found.rule} translates it to {found.class_name}, a "
                                    "class another driver allocates; a GPUQuota counts only the "
                                    "gateway's classes: keep the ResourceQuota for it")
    if known is None:
        return LegacyName(None, why=f"rule {found.rule} translates it to {found.class_name}, but "
                                    "its unit in GPUQuota terms is not known: write the GPUQuota's "
                                    "limit by hand")
    if known.dimension is None:
        return known
    # The rule's unit is the site's (gpushare in MiB, say); counts and percent are plain.
    unit = found.unit if known.dimension == "memory" else known.unit
    return LegacyName(known.dimension, unit, note=known.note)


def memory_quantity(amount: int) -> str:
    """Bytes as the shortest exact quantity (`3000Mi`, `4Gi`, `1234`)."""
    return str(Quantity.from_bytes(amount))


def convert_resource_quota(quota: Mapping[str, Any], *,
                           route: Callable[[str], Route | None] | None = None,
                           ) -> QuotaConversion | None:
    """The GPUQuota equivalent to a ResourceQuota, None when it names no legacy GPU resource.

    Keys of one name under several prefixes (`nvidia.com/gpu`, `requests.nvidia.com/gpu`,
    `limits.nvidia.com/gpu`) must all hold: the smallest wins. Different names counting the same
    thing (`nvidia.com/gpu` and `volcano.sh/vgpu-number`) were separate limits, and the gateway
    counts their cards together: their sum, with a warning. `route` says what the rules in
    force do with a name (see `Route`); without it every known name counts as the protocol says.
    """
    metadata = _mapping(quota.get("metadata"))
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or "")
    spec = _mapping(quota.get("spec"))
    hard = _mapping(spec.get("hard"))

    converted: list[Converted] = []
    unconverted: list[Unconverted] = []
    for key in sorted(hard, key=str):
        base = _base(str(key))
        facts = _facts(base, route)
        if facts is None:
            continue  # not a GPU name (cpu, pods, another vendor's unrelated resource)
        value = str(hard[key])
        if facts.dimension is None:
            unconverted.append(Unconverted(str(key), value, facts.why))
            continue
        takes_suffixes = facts.dimension == "memory" and facts.unit == 1  # bytes
        if not takes_suffixes and mistaken_suffix(value) is not None:
            unconverted.append(Unconverted(str(key), value, mistaken_unit_message(
                base, value, facts.unit) + " (a mistaken unit; fix the ResourceQuota)"))
            continue
        amount, problem = _amount(hard[key], facts.unit)
        if amount is None:
            unconverted.append(Unconverted(str(key), value,
                                           f"{problem}; write a whole amount"))
            continue
        converted.append(Converted(str(key), value, facts.dimension, amount, facts.note))
    if not converted and not unconverted:
        return None

    warnings: list[str] = []
    hard_out: dict[str, Any] = {}
    for dimension in ("devices", "memory", "cores"):
        per_name: dict[str, int] = {}
        for item in converted:
            if item.dimension == dimension:
                base = _base(item.key)
                per_name[base] = min(per_name.get(base, item.amount), item.amount)
        if not per_name:
            continue
        total = sum(per_name.values())
        if len(per_name) > 1:
            warnings.append(f"{dimension} is the sum of the limits on {', '.join(sorted(per_name))}"
                            f" ({total}): the gateway counts them together, so one name may now "
                            "use what another left")
        hard_out[dimension] = memory_quantity(total) if dimension == "memory" else total
    scopes = [str(s) for s in spec.get("scopes") or ()]
    if scopes:
        warnings.append(f"spec.scopes ({', '.join(scopes)}) has no GPUQuota equivalent: the "
                        "GPUQuota counts every pod of the namespace")
    if spec.get("scopeSelector"):
        warnings.append("spec.scopeSelector has no GPUQuota equivalent: the GPUQuota counts "
                        "every pod of the namespace")

    gpu_quota: dict[str, Any] | None = None
    if hard_out:
        gpu_quota = {
            "apiVersion": names.API_VERSION,
            "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {SOURCE_ANNOTATION: name}},
            "spec": {"hard": hard_out, "admission": ADMISSION},
        }
    return QuotaConversion(namespace=namespace, name=name, gpu_quota=gpu_quota,
                           converted=tuple(converted), unconverted=tuple(unconverted),
                           warnings=tuple(warnings))

