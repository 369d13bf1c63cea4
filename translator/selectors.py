"""Device selectors built from pod text: CEL for an attribute test, safe whatever the pod says.

Annotation values (HAMi's `use-gputype`, say) only ever land inside CEL string literals, and
the rendered selector is guarded so that it never errors on a device lacking the attribute.
Used by the compiler's dry run and by the translator; it must not evaluate CEL itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dra_gateway.kube import names
from dra_gateway.translator.ruleset import CompiledSelector


def selector_values(selector: CompiledSelector, value: Any) -> list[str]:
    """The strings a selector's `values` expression gave, split and trimmed."""
    items = [value] if isinstance(value, (str, int)) else list(value)
    out: list[str] = []
    for item in items:
        text = str(item)
        parts = text.split(selector.separator) if selector.separator else [text]
        out.extend(p.strip() for p in parts if p.strip())
    return out


def _literal(text: str) -> str:
    # JSON string syntax (with \uXXXX escapes) is valid CEL string syntax.
    return json.dumps(text)


def hami_core_selector(driver: str) -> str:
    """Cards whose node has HAMi-core's library (the node plugin publishes `hamiCore`): a share
    HAMi-core enforces lands only where it can be enforced, for the allocator and kube-scheduler
    alike. Guarded: a card without the attribute (another driver's) is simply not selected."""
    attrs = f"device.attributes[{_literal(driver)}]"
    return (f"{_literal(names.ATTR_HAMI_CORE)} in {attrs} && "
            f"{attrs}.{names.ATTR_HAMI_CORE} == true")


def render_selector(selector: CompiledSelector, driver: str, values: Sequence[str]) -> str | None:
    """A DRA CEL selector for an attribute test, guarded so it never errors on a device.

    Values come from pods (annotations) and are only ever placed inside string literals.
    Returns None when there is nothing to test (no values).
    """
    if not values:
        return None
    if selector.op == "atLeast":
        # A whole number the rule computed (never pod text): the largest of them.
        amount = max(int(v) for v in values)
        capacities = f"device.capacity[{_literal(driver)}]"
        return (f"{_literal(selector.attribute)} in {capacities} && "
                f"{capacities}.{selector.attribute}.compareTo(quantity({_literal(str(amount))}))"
                " >= 0")
    attrs = f"device.attributes[{_literal(driver)}]"
    present = f"{_literal(selector.attribute)} in {attrs}"
    attr = f"{attrs}.{selector.attribute}"
    op = selector.op
    if op in ("equals", "in", "notIn"):
        if len(values) == 1:
            test = f"{attr} == {_literal(values[0])}"
        else:
            test = f"{attr} in [{', '.join(_literal(v) for v in values)}]"
    else:
        lowered = [v.lower() for v in values]
        test = " || ".join(f"{attr}.lowerAscii().contains({_literal(v)})" for v in lowered)
        if len(lowered) > 1:
            test = f"({test})"
    if op in ("notIn", "notContainsAnyIgnoreCase"):
        return f"!({present}) || !({test})"
    return f"{present} && {test}"
