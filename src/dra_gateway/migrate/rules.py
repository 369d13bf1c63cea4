"""The translation rules in force for a plan: the built-in rules, `--rules` files and the rule
ConfigMaps (label `dra-gateway.io/rules: "true"`) of the gateway's namespace found in the cluster
or the dumps, loaded as the webhook loads them (`webhook/rulestore.py`: files first, then the
ConfigMaps of its own namespace by name). A labelled ConfigMap in any other namespace is a
tenant's, which the webhook never reads: it must not change what migrate prints either.

Also what those rules do with a legacy name, in the terms the quota conversion reads
(`policy.legacyquotas.Route`). It must not read files other than `--rules`, or a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dra_gateway.kube import names, objects
from dra_gateway.migrate.inventory import Object
from dra_gateway.policy.legacyquotas import Route, legacy_name
from dra_gateway.translator.loading import config_map_label
from dra_gateway.translator.rules import RuleSet, Source, load_rules


def gateway_config_maps(config_maps: Sequence[Object], namespace: str) -> list[Object]:
    """The rule ConfigMaps the webhook reads: those of the gateway's `namespace`, by name."""
    return sorted((cm for cm in config_maps if objects.namespace(cm) == namespace),
                  key=objects.namespace_name)


def foreign_config_maps(config_maps: Sequence[Object], namespace: str) -> list[str]:
    """`NAMESPACE/NAME` of the labelled ConfigMaps outside the gateway's namespace: not read."""
    return sorted("/".join(objects.namespace_name(cm)) for cm in config_maps
                  if objects.namespace(cm) != namespace)


def rules_in_force(config_maps: Sequence[Object], *, namespace: str = names.GATEWAY_NAMESPACE,
                   files: Sequence[str] = ()) -> RuleSet:
    """The rule set with the ConfigMaps of the gateway's `namespace` (others are left out);
    `RulesError` names the ConfigMap or file and field of every problem."""
    ordered = gateway_config_maps(config_maps, namespace)
    sources: list[Source] = [*files]
    for cm in ordered:
        data = cm.get("data")
        data = data if isinstance(data, Mapping) else {}
        ns, name = objects.namespace_name(cm)
        sources.append((config_map_label(ns, name), {str(k): str(v) for k, v in data.items()}))
    return load_rules(*sources)


def is_legacy(rules: RuleSet, name: str) -> bool:
    """Whether `name` is a legacy GPU resource: a rule reads it, or the protocols know it."""
    return (rules.is_legacy(name) or rules.disabled_rule(name) is not None
            or legacy_name(name) is not None)


def router(rules: RuleSet) -> Callable[[str], Route | None]:
    """What the rules in force do with a resource name, for the quota conversion."""

    def route(name: str) -> Route | None:
        found = rules.rules_for(name)
        if found:
            gateway = [r for r in found if r.gateway_class]
            rule = max(gateway or found, key=lambda r: r.precedence)
            unit = rule.exact.get(name, rule.pattern_factor)
            return Route(rule.name, rule.class_name, rule.gateway_class, unit)
        disabled = rules.disabled_rule(name)
        if disabled is not None:
            return Route(disabled, "", False, enabled=False)
        return None

    return route


def holds_devices(rules: RuleSet, name: str) -> bool:
    """Whether asking for `name` holds devices (a card count or share), not a mere hint such as
    HAMi's nvidia.com/priority."""
    if rules.asks_for_devices(name) or rules.disabled_rule(name) is not None:
        return True
    facts = legacy_name(name)
    return facts is not None and facts.dimension is not None
