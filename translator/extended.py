"""Legacy resource names the cluster's DeviceClasses declare for kube-scheduler (KEP 5004).

With `DRAExtendedResource` (alpha in 1.34 and 1.35, beta and on by default in 1.36, GA in 1.37)
a DeviceClass whose `spec.extendedResourceName` is, say, `nvidia.com/gpu` makes kube-scheduler
serve a container's legacy request for that name itself: it allocates devices of that class
through a claim it makes for the pod. Translating the same name as well would take the request
away from the driver the administrator gave it to, so the translator steps aside for it unless
the rule reading it says `extendedResourceNames: translate` (translator/README.md).

`ExtendedResources` is what the translator needs to know: which classes declare which name,
the one kube-scheduler uses first. It is built from DeviceClass objects, wherever they come
from (the webhook's watch, a file given to the CLI). `deferred_resources` says which of a
container's resources a translation leaves in place, for checks that run on translated pods;
`report` is what `rules check` prints. Pure: no I/O, no logging.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from dra_gateway.kube import names
from dra_gateway.translator.rules import CompiledRule, RuleSet

__all__ = [
    "DEFER",
    "TRANSLATE",
    "ExtendedResourceUse",
    "ExtendedResources",
    "deferred_resources",
    "device_class_objects",
    "report",
]

# Values of a rule's `extendedResourceNames`.
DEFER: Final = "defer"
TRANSLATE: Final = "translate"

Action = Literal["deferred", "translated"]


@dataclass(frozen=True, slots=True, eq=True)
class ExtendedResources:
    """Resource name -> names of the DeviceClasses declaring it as `spec.extendedResourceName`.

    The first class of each entry is the one kube-scheduler uses: when several classes declare
    one name, the class created last wins, and among classes created in the same second the
    first by name (the API's documentation of the field). Empty when nothing is declared, which
    is false, so that callers test it before paying for any lookup.
    """

    classes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.classes)

    def classes_of(self, resource: str) -> tuple[str, ...]:
        """The classes declaring `resource`, the one kube-scheduler uses first; () if none."""
        return self.classes.get(resource, ())

    def relevant(self, resources: Iterable[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The declarations that concern `resources` (part of the translator's cache key)."""
        classes = self.classes
        return tuple(sorted((r, classes[r]) for r in set(resources) if r in classes))

    @classmethod
    def from_device_classes(cls, objects: Iterable[Mapping[str, Any]]) -> ExtendedResources:
        """From DeviceClass objects as the API serves them; classes without the field, or with
        something other than a non-empty string in it, declare nothing."""
        declared: list[tuple[str, str, str]] = []  # (resource, creationTimestamp, class)
        for obj in objects:
            spec = obj.get("spec")
            meta = obj.get("metadata")
            resource = spec.get("extendedResourceName") if isinstance(spec, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(resource, str) or not resource or not isinstance(name, str):
                continue
            created = meta.get("creationTimestamp") if isinstance(meta, dict) else None
            declared.append((resource, created if isinstance(created, str) else "", name))
        # By name first, then (stable) newest first: RFC 3339 UTC timestamps as the API server
        # writes them sort as text.
        declared.sort(key=lambda d: d[2])
        declared.sort(key=lambda d: d[1], reverse=True)
        out: dict[str, list[str]] = {}
        for resource, _, name in declared:
            out.setdefault(resource, []).append(name)
        return cls({resource: tuple(classes) for resource, classes in sorted(out.items())})


@dataclass(frozen=True, slots=True)
class ExtendedResourceUse:
    """A container's resource that a DeviceClass declares, and what the translation did.

    `deferred`: left in the container for kube-scheduler, with `resources` (everything of the
    rule's in that container, the declared name included); `translated`: the rule takes the name
    back (`extendedResourceNames: translate`).
    """

    container: str
    resource: str
    device_class: str  # the class kube-scheduler would use for `resource`
    rule: str
    action: Action
    resources: tuple[str, ...]


def device_class_objects(documents: Iterable[Any]) -> list[dict[str, Any]]:
    """The DeviceClasses among parsed documents: single objects and items of a `List` (as
    `kubectl get deviceclasses -o yaml` writes them); every other kind is skipped."""
    out: list[dict[str, Any]] = []
    for document in documents:
        if not isinstance(document, dict):
            continue
        kind = document.get("kind")
        if kind == "DeviceClass":
            out.append(document)
        elif isinstance(kind, str) and kind.endswith("List"):
            items = document.get("items")
            out.extend(device_class_objects(items if isinstance(items, list) else ()))
    return out


def _defers(rules: RuleSet, resource: str) -> tuple[str, ...]:
    return tuple(r.name for r in rules.rules_for(resource)
                 if r.extended_resource_names == DEFER)


def deferred_resources(resources: Collection[str], rules: RuleSet,
                       extended: ExtendedResources) -> frozenset[str]:
    """Which of one container's `resources` a translation may leave for kube-scheduler.

    A declared name that some enabled rule reading it defers, and every resource that such a
    rule reads beside it in the container (a HAMi `nvidia.com/gpumem` stays with a deferred
    `nvidia.com/gpu`: half a HAMi request cannot be translated). Which rule applies depends on
    precedence and conditions; this errs on the side of leaving alone, for checks such as
    /validate's that must not refuse what /mutate left in place on purpose.
    """
    if not extended:
        return frozenset()
    out: set[str] = set()
    for resource in resources:
        if not extended.classes_of(resource):
            continue
        for rule in rules.rules_for(resource):
            if rule.extended_resource_names == DEFER:
                out.add(resource)
                out.update(r for r in resources if rule.claims(r))
    return frozenset(out)


def report(rules: RuleSet, extended: ExtendedResources) -> list[str]:
    """One line per declared name that an enabled rule reads: which class serves it, which
    rules step aside for it and which take it back; and a warning for the gateway's own
    classes, whose devices kube-scheduler would then allocate outside the gateway's allocator."""
    lines: list[str] = []
    for resource, classes in sorted(extended.classes.items()):
        readers = rules.rules_for(resource)
        if not readers:
            continue
        first = classes[0]
        if len(classes) == 1:
            who = f"DeviceClass {first} declares {resource} (spec.extendedResourceName)"
        else:
            who = (f"DeviceClasses {', '.join(classes)} declare {resource} "
                   f"(spec.extendedResourceName); kube-scheduler uses {first}, the newest")
        deferring = _defers(rules, resource)
        taking = sorted(r.name for r in readers if r.extended_resource_names == TRANSLATE)
        parts = [who]
        if deferring:
            parts.append(f"{_rules(deferring, 'leave')} it to kube-scheduler "
                         f"(set extendedResourceNames: {TRANSLATE} on a rule to translate it)")
            companions = [f"rule {r.name}: {', '.join(others)}" for r in readers
                          if r.name in deferring
                          and (others := _other_resources_read(r, resource))]
            if companions:
                parts.append("what else such a rule reads stays in the container with it, "
                             "for a device plugin or another DeviceClass to serve ("
                             + "; ".join(companions) + ")")
        if taking:
            parts.append(f"{_rules(taking, 'translate')} it anyway "
                         f"(extendedResourceNames: {TRANSLATE})")
        lines.append(f"{resource}: " + "; ".join(parts))
        if first in names.GATEWAY_CLASSES and deferring:
            lines.append(
                f"{resource}: {first} is a dra-gateway DeviceClass: kube-scheduler allocates "
                f"its devices for {resource} itself, outside the gateway's allocator (whole "
                f"devices, no shares, no enforcement); remove spec.extendedResourceName from "
                f"DeviceClass {first}, or set extendedResourceNames: {TRANSLATE} on "
                f"{_rules(deferring)}")
    return lines


def _other_resources_read(rule: CompiledRule, resource: str) -> list[str]:
    """What else `rule` reads besides `resource` (its pattern as `prefix*`)."""
    others = sorted(n for n in rule.exact if n != resource)
    return others + ([f"{rule.pattern}*"] if rule.pattern is not None else [])


def _rules(rule_names: Iterable[str], verb: str = "") -> str:
    """`rule a` or `rules a, b`, with `verb` agreeing (`rule a leaves`, `rules a, b leave`)."""
    listed = sorted(rule_names)
    one = len(listed) == 1
    agreed = f" {verb}s" if verb and one else f" {verb}" if verb else ""
    return f"rule{'' if one else 's'} {', '.join(listed)}{agreed}"
