"""core/v1 NodeSelector matching, as the scheduler and the kubelet apply it, a pod's required
node placement (`pod_accepts_node`), and metav1 LabelSelector matching
(`label_selector_matches`).

The one implementation of each for the whole gateway: a claim allocation's `nodeSelector` (node
plugin), a pod's `spec.nodeSelector` and required node affinity (allocator's planner), a
PodDisruptionBudget's selector (defrag, preemption), a GPUSharingPolicy's namespaceSelector
(policies). It follows k8s.io/component-helpers/scheduling/corev1/nodeaffinity and
k8s.io/apimachinery's `labels.NewRequirement` / `metav1.LabelSelectorAsSelector`:

- node selector terms are ORed, the requirements of a term ANDed; a term with neither
  `matchExpressions` nor `matchFields` matches no node, and so does a selector without terms;
- a requirement upstream refuses to parse (an unknown operator, an empty key, `In`/`NotIn`
  without values, `Exists`/`DoesNotExist` with values, `Gt`/`Lt` without exactly one integer)
  makes its term (node selectors) or the whole selector (label selectors) match nothing;
- `Gt`/`Lt` compare base-10 int64 as Go's `strconv.ParseInt` reads them (no spaces, no
  underscores, ASCII digits only); a label that is not such an integer does not match;
- `matchFields` supports `metadata.name` with `In`/`NotIn` and exactly one value, and, as
  upstream, is not checked against a node without a name.

Label keys and values are not checked for syntax: the API server refuses the objects that
carry bad ones before the gateway reads them. Pure: it must not read the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_NODE_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
_LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})
_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def node_selector_matches(selector: Mapping[str, Any] | None, *, name: str,
                          labels: Mapping[str, str]) -> bool:
    """Whether the node `name` with `labels` is selected. None (no selector: an allocation
    for every node, no required affinity) selects every node; a selector without terms none."""
    if selector is None:
        return True
    fields = {"metadata.name": name} if name else {}
    return any(_term_matches(term, labels, fields)
               for term in selector.get("nodeSelectorTerms") or ())


def pod_accepts_node(pod: Mapping[str, Any], *, name: str, labels: Mapping[str, str]) -> bool:
    """The pod's `spec.nodeSelector` and required node affinity both accept the node (the
    scheduler's NodeAffinity filter, `GetRequiredNodeAffinity(pod).Match(node)`)."""
    spec = pod.get("spec") or {}
    wanted = spec.get("nodeSelector")
    # labels.SelectorFromSet: each entry an Equals requirement; an empty map asks nothing.
    if wanted and not label_selector_matches({"matchLabels": wanted}, labels):
        return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    return node_selector_matches(affinity, name=name, labels=labels)


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against labels, as `LabelSelectorAsSelector` reads it: the empty
    selector selects everything, a missing (nil) one nothing, and one upstream refuses to
    parse (Gt/Lt are not LabelSelector operators) nothing. Callers whose field reads nil
    otherwise (a webhook's namespaceSelector defaults to the empty one) pass `{}` for it."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if not key or key not in labels or labels[key] != value:
            return False
    return all(_requirement(r, labels, _LABEL_OPERATORS)
               for r in selector.get("matchExpressions") or ())


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str],
                  fields: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or ()
    field_expressions = term.get("matchFields") or ()
    if not expressions and not field_expressions:
        return False  # an empty term matches no node, as upstream
    return (all(_requirement(r, labels, _NODE_OPERATORS) for r in expressions)
            and all(_field_requirement(r, fields) for r in field_expressions))


def _requirement(requirement: Mapping[str, Any], labels: Mapping[str, str],
                 operators: frozenset[str]) -> bool:
    """One `matchExpressions` entry; False for one `labels.NewRequirement` refuses."""
    key = requirement.get("key")
    operator = requirement.get("operator")
    wanted: Sequence[Any] = requirement.get("values") or ()
    if not key or not isinstance(key, str) or operator not in operators:
        return False
    if operator == "In":
        return bool(wanted) and key in labels and labels[key] in wanted
    if operator == "NotIn":
        return bool(wanted) and (key not in labels or labels[key] not in wanted)
    if operator == "Exists":
        return not wanted and key in labels
    if operator == "DoesNotExist":
        return not wanted and key not in labels
    # Gt, Lt
    if len(wanted) != 1 or key not in labels:
        return False
    bound, have = parse_int64(wanted[0]), parse_int64(labels[key])
    if bound is None or have is None:
        return False
    return have > bound if operator == "Gt" else have < bound


def _field_requirement(requirement: Mapping[str, Any], fields: Mapping[str, str]) -> bool:
    """One `matchFields` entry (`nodeSelectorRequirementsAsFieldSelector`): In or NotIn with
    exactly one value, against the node's fields, a missing field reading as ""."""
    operator = requirement.get("operator")
    wanted: Sequence[Any] = requirement.get("values") or ()
    if operator not in ("In", "NotIn") or len(wanted) != 1:
        return False
    if not fields:
        return True  # upstream checks matchFields only on a node with a name
    equal = fields.get(str(requirement.get("key") or ""), "") == wanted[0]
    return equal if operator == "In" else not equal


def parse_int64(text: Any) -> int | None:
    """`strconv.ParseInt(text, 10, 64)`, or None where it fails."""
    if not isinstance(text, str) or not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


__all__ = ["label_selector_matches", "node_selector_matches", "parse_int64", "pod_accepts_node"]
