"""How the device search words why a node does not fit, and how a pod's reason is filled in.

Outcomes are memoised across pods whose claims have the same spec but other names and other
sharing policies, so a search's reason carries placeholders (`claim_placeholder`,
`RULES_PLACEHOLDER`, `TENANT_PLACEHOLDER`) that `fill_claims` replaces with the pod's claim
labels and its policies' names when the reason is reported. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dra_gateway.allocator.planner.demand import Constraint
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.kube import names
from dra_gateway.policy.sharing import SharingRules


def capacity_text(device: Device, cap_name: str, nanos: int) -> str:
    if cap_name == names.CAPACITY_CORES:
        return f"cores {device.quantity(cap_name, nanos)}%"
    return f"{cap_name} {device.quantity(cap_name, nanos)}"


def claim_placeholder(index: int) -> str:
    """Where a reason names the claim: outcomes are memoised across pods whose claims have the
    same spec but other names, so the name is filled in when the reason is reported."""
    return f"\x00{index}\x00"


RULES_PLACEHOLDER = "\x00rules\x00"
TENANT_PLACEHOLDER = "\x00tenant\x00"


def tenant_label(rules: SharingRules | None) -> str:
    return (rules.tenant if rules is not None else "") or "a tenant without isolation"


def fill_claims(reason: str, labels: Sequence[str], rules: SharingRules | None = None) -> str:
    """The reason with the pod's claim labels and the names of its sharing policies."""
    if RULES_PLACEHOLDER in reason:
        named = rules.named() if rules is not None and not rules.empty \
            else "a holder's GPUSharingPolicy"
        reason = reason.replace(RULES_PLACEHOLDER, named)
    if TENANT_PLACEHOLDER in reason:
        reason = reason.replace(TENANT_PLACEHOLDER, tenant_label(rules))
    return _PLACEHOLDER.sub(lambda m: labels[int(m.group(1))], reason)


_PLACEHOLDER = re.compile("\x00(\\d+)\x00")


def verdict_reason(verdict: bool | str, device: Device, what: str) -> bool | str:
    if isinstance(verdict, str):
        return (f"selector evaluation failed on device {device.pool}/{device.name} ({what}): "
                f"{verdict}")
    return False


def describe_constraint(constraint: Constraint) -> str:
    kind = "distinctAttribute" if constraint.distinct else "matchAttribute"
    return f"{kind} {constraint.attribute}"


__all__ = ["RULES_PLACEHOLDER", "TENANT_PLACEHOLDER", "capacity_text", "claim_placeholder",
           "describe_constraint", "fill_claims", "tenant_label", "verdict_reason"]
