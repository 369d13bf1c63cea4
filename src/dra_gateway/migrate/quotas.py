"""`migrate quotas`: the GPUQuota equivalent to each ResourceQuota on legacy GPU names, with
what has no equivalent said beside it (as YAML comments, in the JSON and on stderr).

The conversion itself is pure and lives in `policy.legacyquotas`; this module applies it to an
inventory under the rules in force, compares with the GPUQuotas that exist, and renders. It
must not read files or a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from dra_gateway.kube import objects, yamltext
from dra_gateway.migrate.inventory import ClusterObjects
from dra_gateway.migrate.rules import router
from dra_gateway.policy.legacyquotas import QuotaConversion, convert_resource_quota
from dra_gateway.translator.rules import RuleSet


@dataclass(frozen=True, slots=True)
class QuotaMigration:
    """Each ResourceQuota on legacy GPU names, its conversion, and what to look at."""

    conversions: tuple[QuotaConversion, ...]
    # Per conversion (same order): the GPUQuota of the same name that exists, if any.
    existing: tuple[Mapping[str, Any] | None, ...]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpuQuotas": [c.gpu_quota for c in self.conversions if c.gpu_quota is not None],
            "conversions": [{**c.to_dict(), "existing": dict(e) if e is not None else None}
                            for c, e in zip(self.conversions, self.existing, strict=True)],
            "warnings": list(self.warnings),
        }


def migrate_quotas(inventory: ClusterObjects, rules: RuleSet) -> QuotaMigration:
    route = router(rules)
    existing = {objects.namespace_name(q): q for q in inventory.gpu_quotas}
    conversions: list[QuotaConversion] = []
    found: list[Mapping[str, Any] | None] = []
    warnings: list[str] = []
    for quota in sorted(inventory.resource_quotas, key=objects.namespace_name):
        conversion = convert_resource_quota(quota, route=route)
        if conversion is None:
            continue
        conversions.append(conversion)
        warnings.extend(conversion.messages())
        same = existing.get((conversion.namespace, conversion.name))
        found.append(same)
        if same is not None and conversion.gpu_quota is not None:
            have = objects.spec(same).get("hard")
            if have != conversion.gpu_quota["spec"]["hard"]:
                warnings.append(
                    f"GPUQuota {conversion.namespace}/{conversion.name} exists with hard "
                    f"{_inline(have)}; applying this output replaces it with "
                    f"{_inline(conversion.gpu_quota['spec']['hard'])}")
    return QuotaMigration(tuple(conversions), tuple(found), tuple(warnings))


def render_yaml(migration: QuotaMigration) -> str:
    """The GPUQuotas as YAML documents, each preceded by comments on where it came from."""
    if not migration.conversions:
        return "# no ResourceQuota names a legacy GPU resource: no GPUQuota to create\n"
    parts: list[str] = []
    for conversion in migration.conversions:
        lines = [f"# from {conversion.where}"]
        lines.extend(f"#   {c.key}: {c.value} -> {c.dimension}"
                     + (f" ({c.note})" if c.note else "") for c in conversion.converted)
        lines.extend(f"# warning: {w}" for w in conversion.warnings)
        lines.extend(f"# not converted: {u.key}: {u.value}: {u.reason}"
                     for u in conversion.unconverted)
        if conversion.gpu_quota is None:
            lines.append("# no GPUQuota: nothing in it has an equivalent")
            parts.append("\n".join(lines) + "\n")
        else:
            parts.append("\n".join(lines) + "\n"
                         + yamltext.dump(conversion.gpu_quota, sort_keys=False))
    return "---\n".join(parts)


def _inline(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
