"""The compiled rule set: plain, precompiled structures that the admission hot path reads.

`CompiledRule` holds a rule's CEL programs and indexes; `RuleSet` holds the enabled rules,
indexed by the resource names they read, and a bounded cache of translated request shapes that
it owns. Built by `loading.load_rules`; nothing here parses YAML, validates documents or
compiles CEL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.kube.cel import Expression
from dra_gateway.translator.documents import ExtendedResourceNames


@dataclass(frozen=True, slots=True)
class CompiledSelector:
    cel: str | None
    attribute: str
    op: str
    values: Expression | None
    separator: str | None
    when: Expression | None


@dataclass(frozen=True, slots=True)
class CompiledRule:
    name: str
    source: str
    precedence: int
    class_name: str
    driver: str
    gateway_class: bool
    gated: bool
    exact: Mapping[str, int]
    pattern: str | None
    pattern_factor: int
    triggers: frozenset[str]
    trigger_pattern: bool
    annotations: tuple[str, ...]
    node_selector: tuple[str, ...]
    match_annotations: Mapping[str, str | None]
    match_node_selector: Mapping[str, str | None]
    when: Expression | None
    variables: tuple[tuple[str, Expression], ...]
    refusals: tuple[tuple[Expression, str], ...]
    warnings: tuple[tuple[Expression, str], ...]
    count: Expression
    memory: Expression | None
    memory_percent: Expression | None
    cores: Expression | None
    enforcement: Expression | None
    policy: Expression | None
    selectors: tuple[CompiledSelector, ...]
    constraints: tuple[tuple[str, Expression | None], ...]
    # A list of strings: one alternative of the request per item (DRA firstAvailable), the
    # selectors rendered with `item` set to it; None: one plain request (`item` is "").
    first_available: Expression | None = None
    # The same expressions batched into one list each, because every evaluation pays for a
    # fresh engine context: refusal then warning conditions; [count, memory, memoryPercent, cores,
    # enforcement, policy] with 0 / "" for unset; selector then constraint conditions.
    refusal_batch: Expression | None = None
    output_batch: Expression | None = None
    condition_batch: Expression | None = None
    # "defer" or "translate": see ExtendedResourceNames.
    extended_resource_names: ExtendedResourceNames = "defer"
    # Resources whose value may have a fraction: value × unit is rounded down.
    fractional: frozenset[str] = frozenset()
    # Resources whose value is bytes and may carry any suffix (others refuse mistaken ones).
    suffixed: frozenset[str] = frozenset()

    def claims(self, resource: str) -> bool:
        """Whether this rule reads `resource`."""
        if resource in self.exact:
            return True
        return self.pattern is not None and resource.startswith(self.pattern)

    def triggered_by(self, resource: str) -> bool:
        """Whether asking for `resource` makes this rule apply (a hint it reads does not)."""
        return resource in self.triggers or (
            self.trigger_pattern and self.pattern is not None
            and resource.startswith(self.pattern))


@dataclass(slots=True)
class RuleSet:
    """Enabled rules, indexed for the hot path, plus a bounded cache of translated shapes.

    The cache maps a container's or pod's request shape to what the translator computed for it;
    it is owned by this object (not a module global) and is dropped with it when rules change.
    """

    rules: tuple[CompiledRule, ...]
    disabled: tuple[str, ...] = ()
    by_resource: dict[str, tuple[CompiledRule, ...]] = field(default_factory=dict)
    by_prefix: tuple[tuple[str, CompiledRule], ...] = ()
    cache: dict[Any, Any] = field(default_factory=dict)
    cache_size: int = 4096
    # Resource names (exact, and prefixes ending in *) that only disabled rules read -> rule.
    disabled_resources: Mapping[str, str] = field(default_factory=dict)
    disabled_prefixes: tuple[tuple[str, str], ...] = ()
    # Sorted pod annotation and nodeSelector keys some rule reads: part of the shape key.
    annotation_order: tuple[str, ...] = ()
    node_selector_order: tuple[str, ...] = ()
    # The domains of the resource names the enabled rules read (`nvidia.com`, `volcano.sh`):
    # a name under one that no rule reads is likely a typo (`typos.py`).
    vendor_domains: frozenset[str] = frozenset()
    # What `typos.misspelt` found per resource name, owned here as `cache` is.
    spellings: dict[str, str | None] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"RuleSet(rules={list(self.rule_names)}, disabled={list(self.disabled)}, "
                f"cached={len(self.cache)})")

    def __post_init__(self) -> None:
        index: dict[str, list[CompiledRule]] = {}
        prefixes: list[tuple[str, CompiledRule]] = []
        for rule in self.rules:
            for name in rule.exact:
                index.setdefault(name, []).append(rule)
            if rule.pattern is not None:
                prefixes.append((rule.pattern, rule))
        self.by_resource = {k: tuple(v) for k, v in index.items()}
        self.by_prefix = tuple(prefixes)
        self.disabled_prefixes = tuple((name[:-1], rule) for name, rule in
                                       sorted(self.disabled_resources.items())
                                       if name.endswith("*"))
        self.annotation_order = tuple(sorted(self.annotation_keys()))
        self.node_selector_order = tuple(sorted(self.node_selector_keys()))
        self.vendor_domains = frozenset(
            name.split("/", 1)[0] for name in (*self.by_resource, *(p for p, _ in prefixes))
            if "/" in name)

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(rule.name for rule in self.rules)

    def rule(self, name: str) -> CompiledRule:
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(name)

    def legacy_resource_names(self) -> frozenset[str]:
        """Exact resource names the enabled rules translate (see `legacy_resource_prefixes`)."""
        return frozenset(self.by_resource)

    def legacy_resource_prefixes(self) -> frozenset[str]:
        """Prefixes of resource names the enabled rules translate, e.g. `nvidia.com/mig-`."""
        return frozenset(prefix for prefix, _ in self.by_prefix)

    def annotation_keys(self) -> frozenset[str]:
        """Pod annotations the enabled rules read or match on."""
        keys: set[str] = set()
        for rule in self.rules:
            keys.update(rule.annotations)
            keys.update(rule.match_annotations)
        return frozenset(keys)

    def node_selector_keys(self) -> frozenset[str]:
        keys: set[str] = set()
        for rule in self.rules:
            keys.update(rule.node_selector)
            keys.update(rule.match_node_selector)
        return frozenset(keys)

    def disabled_rule(self, resource: str) -> str | None:
        """The disabled rule that would translate `resource`, if only disabled rules read it."""
        rule = self.disabled_resources.get(resource)
        if rule is not None:
            return rule
        for prefix, rule in self.disabled_prefixes:
            if resource.startswith(prefix):
                return rule
        return None

    def is_legacy(self, resource: str) -> bool:
        if resource in self.by_resource:
            return True
        return any(resource.startswith(prefix) for prefix, _ in self.by_prefix)

    def asks_for_devices(self, resource: str) -> bool:
        """Whether `resource` asks for devices: some enabled rule applies when a container asks
        for it. A resource rules only read alongside others (HAMi's nvidia.com/priority, or
        nvidia.com/gpu when only the HAMi rule is enabled) does not."""
        return any(rule.triggered_by(resource) for rule in self.rules_for(resource))

    def rules_for(self, resource: str) -> tuple[CompiledRule, ...]:
        found = self.by_resource.get(resource, ())
        for prefix, rule in self.by_prefix:
            if resource.startswith(prefix):
                found = (*found, rule)
        return found

    def by_precedence(self, resources: Iterable[str]) -> list[CompiledRule]:
        """Every enabled rule reading one of `resources`, once, in the order the translator
        tries them: highest precedence first, then by name."""
        candidates: dict[str, CompiledRule] = {}
        for resource in resources:
            for rule in self.rules_for(resource):
                candidates.setdefault(rule.name, rule)
        return sorted(candidates.values(), key=lambda r: (-r.precedence, r.name))

    def remember(self, key: Any, value: Any) -> None:
        if len(self.cache) >= self.cache_size:
            # Shapes repeat heavily in practice; a full reset keeps the bound without tracking
            # recency on the hot path.
            self.cache.clear()
        self.cache[key] = value
