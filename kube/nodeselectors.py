"""core/v1 NodeSelector matching, as the scheduler and the kubelet apply it, and metav1
LabelSelector matching (`label_selector_matches`).

One implementation for everything that checks a node against a NodeSelector: a claim
allocation's `nodeSelector`, a pod's required node affinity. Terms are ORed, the requirements
of a term ANDed; `matchFields` supports `metadata.name`; an empty term matches no node. Pure:
it must not read the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def node_selector_matches(selector: Mapping[str, Any] | None, *, name: str,
                          labels: Mapping[str, str]) -> bool:
    """Whether the node `name` with `labels` is selected; no selector selects every node."""
    if not selector:
        return True
    fields = {"metadata.name": name}
    return any(_term_matches(term, labels, fields)
               for term in selector.get("nodeSelectorTerms") or ())


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str],
                  fields: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or ()
    field_expressions = term.get("matchFields") or ()
    if not expressions and not field_expressions:
        return False  # an empty term matches no node, as upstream
    return (all(_requirement(r, labels) for r in expressions)
            and all(_requirement(r, fields) for r in field_expressions))


def _requirement(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key = str(requirement.get("key"))
    operator = requirement.get("operator")
    wanted = list(requirement.get("values") or ())
    present = key in values
    have = values.get(key)
    if operator == "In":
        return present and have in wanted
    if operator == "NotIn":
        return not present or have not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and wanted:
        try:
            number, bound = int(str(have)), int(str(wanted[0]))
        except ValueError:
            return False
        return number > bound if operator == "Gt" else number < bound
    return False


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (a PodDisruptionBudget's, a Deployment's) against labels: an
    empty selector selects everything, a missing one nothing (policy/v1's reading)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_requirement(r, labels) for r in selector.get("matchExpressions") or ())
