"""kube/nodeselectors.py, the one implementation of node selectors, a pod's required node
placement and label selectors, case by case against Kubernetes' own reading
(k8s.io/component-helpers/scheduling/corev1/nodeaffinity, apimachinery's labels.NewRequirement
and metav1.LabelSelectorAsSelector)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube.nodeselectors import (
    label_selector_matches,
    node_selector_matches,
    parse_int64,
    pod_accepts_node,
)

NODE = "node-a"
LABELS = {"zone": "z1", "gpus": "8", "odd": "1_6", "empty": ""}


def _on(name: str) -> dict[str, object]:
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [name]}]}]}


def _expr(key: Any, operator: str, *values: str, with_values: bool = True) -> dict[str, Any]:
    requirement: dict[str, Any] = {"operator": operator}
    if key is not None:
        requirement["key"] = key
    if with_values:
        requirement["values"] = list(values)
    return requirement


def _terms(*requirements: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": list(requirements)}]}


def test_node_selectors_follow_core_semantics() -> None:
    labels = {"zone": "z1", "gpus": "8"}
    assert node_selector_matches(None, name="node-a", labels=labels)
    assert node_selector_matches(_on("node-a"), name="node-a", labels=labels)
    assert not node_selector_matches(_on("node-b"), name="node-a", labels=labels)
    either = {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
        {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]},
                              {"key": "spot", "operator": "DoesNotExist"}]}]}
    assert node_selector_matches(either, name="node-a", labels=labels)
    assert not node_selector_matches({"nodeSelectorTerms": [{}]}, name="node-a", labels=labels)
    lower = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "gpus", "operator": "Lt", "values": ["eight"]}]}]}
    assert not node_selector_matches(lower, name="node-a", labels=labels)
    unknown = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "Near", "values": ["z1"]}]}]}
    assert not node_selector_matches(unknown, name="node-a", labels=labels)
    absent = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "spot", "operator": "NotIn", "values": ["true"]}]}]}
    assert node_selector_matches(absent, name="node-a", labels=labels)


# Each row: why, the selector, whether node-a with LABELS is selected (upstream's answer).
NODE_CASES: list[tuple[str, dict[str, Any] | None, bool]] = [
    # The selector itself.
    ("no selector selects every node", None, True),
    ("an empty selector (no terms) selects no node", {}, False),
    ("an empty nodeSelectorTerms list selects no node", {"nodeSelectorTerms": []}, False),
    ("an empty term matches no node", {"nodeSelectorTerms": [{}]}, False),
    ("a term with empty lists matches no node",
     {"nodeSelectorTerms": [{"matchExpressions": [], "matchFields": []}]}, False),
    ("an empty term does not spoil the others",
     {"nodeSelectorTerms": [{}, {"matchExpressions": [_expr("zone", "In", "z1")]}]}, True),
    ("terms are ORed",
     {"nodeSelectorTerms": [{"matchExpressions": [_expr("zone", "In", "z2")]},
                            {"matchExpressions": [_expr("zone", "In", "z1")]}]}, True),
    ("requirements of a term are ANDed",
     _terms(_expr("zone", "In", "z1"), _expr("gpus", "In", "4")), False),
    ("a bad requirement fails its term only",
     {"nodeSelectorTerms": [{"matchExpressions": [_expr("zone", "Near", "z1")]},
                            {"matchExpressions": [_expr("gpus", "Exists", with_values=False)]}]},
     True),
    # In / NotIn.
    ("In a value the label has", _terms(_expr("zone", "In", "z2", "z1")), True),
    ("In with the label missing", _terms(_expr("spot", "In", "true")), False),
    ("In without values is refused", _terms(_expr("zone", "In")), False),
    ("In the empty value against an empty label", _terms(_expr("empty", "In", "")), True),
    ("NotIn a value the label has", _terms(_expr("zone", "NotIn", "z1")), False),
    ("NotIn with the label missing", _terms(_expr("spot", "NotIn", "true")), True),
    ("NotIn without values is refused", _terms(_expr("spot", "NotIn")), False),
    ("NotIn with values left out is refused",
     _terms(_expr("spot", "NotIn", with_values=False)), False),
    # Exists / DoesNotExist.
    ("Exists with the label present", _terms(_expr("zone", "Exists", with_values=False)), True),
    ("Exists with an empty label value", _terms(_expr("empty", "Exists")), True),
    ("Exists with the label missing", _terms(_expr("spot", "Exists")), False),
    ("Exists with values is refused", _terms(_expr("zone", "Exists", "z1")), False),
    ("DoesNotExist with the label missing", _terms(_expr("spot", "DoesNotExist")), True),
    ("DoesNotExist with the label present", _terms(_expr("zone", "DoesNotExist")), False),
    ("DoesNotExist with values is refused", _terms(_expr("spot", "DoesNotExist", "x")), False),
    # Gt / Lt.
    ("Gt a smaller bound", _terms(_expr("gpus", "Gt", "4")), True),
    ("Gt an equal bound", _terms(_expr("gpus", "Gt", "8")), False),
    ("Lt a larger bound", _terms(_expr("gpus", "Lt", "9")), True),
    ("Lt a negative bound", _terms(_expr("gpus", "Lt", "-1")), False),
    ("Gt a signed bound", _terms(_expr("gpus", "Gt", "+7")), True),
    ("Gt with the label missing", _terms(_expr("spot", "Gt", "0")), False),
    ("Gt without values is refused", _terms(_expr("gpus", "Gt")), False),
    ("Gt with two values is refused", _terms(_expr("gpus", "Gt", "4", "100")), False),
    ("Gt a bound that is no integer", _terms(_expr("gpus", "Gt", "four")), False),
    ("Gt a bound with a space (Go's ParseInt refuses it)", _terms(_expr("gpus", "Gt", " 4")),
     False),
    ("Gt a bound with an underscore (Go's ParseInt refuses it)",
     _terms(_expr("gpus", "Gt", "0_4")), False),
    ("Lt a bound past int64", _terms(_expr("gpus", "Lt", str(2**63))), False),
    ("Gt on a label with an underscore (a valid label value, no integer)",
     _terms(_expr("odd", "Gt", "4")), False),
    ("Lt on an empty label", _terms(_expr("empty", "Lt", "4")), False),
    # The key and the operator.
    ("an unknown operator is refused", _terms(_expr("zone", "Near", "z1")), False),
    ("a missing key is refused", _terms(_expr(None, "DoesNotExist")), False),
    ("an empty key is refused", _terms(_expr("", "NotIn", "x")), False),
    # matchFields.
    ("matchFields metadata.name In the node's name", _on(NODE), True),
    ("matchFields metadata.name In another name", _on("node-b"), False),
    ("matchFields metadata.name NotIn another name",
     {"nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "NotIn", "node-b")]}]},
     True),
    ("matchFields with two values is refused",
     {"nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "In", NODE, "node-b")]}]},
     False),
    ("matchFields Exists is refused",
     {"nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "Exists")]}]}, False),
    ("matchFields on a field nodes lack reads it empty",
     {"nodeSelectorTerms": [{"matchFields": [_expr("spec.unknown", "NotIn", "x")]}]}, True),
    ("matchFields on a label's key is no label",
     {"nodeSelectorTerms": [{"matchFields": [_expr("zone", "In", "z1")]}]}, False),
    ("matchFields and matchExpressions are ANDed",
     {"nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "In", NODE)],
                             "matchExpressions": [_expr("zone", "In", "z2")]}]}, False),
]


@pytest.mark.parametrize(("selector", "selected"), [(s, m) for _, s, m in NODE_CASES],
                         ids=[why for why, _, _ in NODE_CASES])
def test_node_selector_edge_cases(selector: dict[str, Any] | None, selected: bool) -> None:
    assert node_selector_matches(selector, name=NODE, labels=LABELS) is selected


def test_match_fields_are_not_checked_on_a_node_without_a_name() -> None:
    # nodeaffinity.nodeSelectorTerm.match skips matchFields when the node has no fields.
    assert node_selector_matches(_on("node-b"), name="", labels=LABELS)
    # ... but a requirement it refuses to parse still fails the term.
    refused = {"nodeSelectorTerms": [{"matchFields": [_expr("metadata.name", "Exists")]}]}
    assert not node_selector_matches(refused, name="", labels=LABELS)


def _pod(node_selector: dict[str, str] | None = None,
         required: dict[str, Any] | None = None, *, affinity: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if affinity:
        node_affinity = {} if required is None else {
            "requiredDuringSchedulingIgnoredDuringExecution": required}
        spec["affinity"] = {"nodeAffinity": node_affinity}
    return {"spec": spec}


POD_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("a pod asking nothing", {"spec": {}}, True),
    ("an empty nodeSelector asks nothing", _pod({}), True),
    ("nodeSelector on a label the node has", _pod({"zone": "z1"}), True),
    ("nodeSelector on another value", _pod({"zone": "z2"}), False),
    ("nodeSelector on a label the node lacks", _pod({"spot": "true"}), False),
    ("nodeSelector on the empty value of a label the node lacks", _pod({"spot": ""}), False),
    ("nodeSelector on the empty value of an empty label", _pod({"empty": ""}), True),
    ("node affinity without a required part asks nothing", _pod(), True),
    ("required node affinity without terms admits no node", _pod(required={}), False),
    ("required node affinity that selects the node", _pod(required=_on(NODE)), True),
    ("nodeSelector and required affinity are ANDed",
     _pod({"zone": "z1"}, _on("node-b")), False),
]


@pytest.mark.parametrize(("pod", "accepted"), [(p, a) for _, p, a in POD_CASES],
                         ids=[why for why, _, _ in POD_CASES])
def test_pod_accepts_node(pod: dict[str, Any], accepted: bool) -> None:
    assert pod_accepts_node(pod, name=NODE, labels=LABELS) is accepted


# metav1.LabelSelector: no Gt/Lt, a nil selector selects nothing, an empty one everything.
LABEL_CASES: list[tuple[str, dict[str, Any] | None, bool]] = [
    ("a nil selector selects nothing", None, False),
    ("an empty selector selects everything", {}, True),
    ("empty lists select everything", {"matchLabels": {}, "matchExpressions": []}, True),
    ("matchLabels the labels have", {"matchLabels": {"zone": "z1", "gpus": "8"}}, True),
    ("matchLabels with another value", {"matchLabels": {"zone": "z2"}}, False),
    ("matchLabels on a missing label", {"matchLabels": {"spot": "true"}}, False),
    ("matchLabels on the empty value of a missing label", {"matchLabels": {"spot": ""}}, False),
    ("matchLabels and matchExpressions are ANDed",
     {"matchLabels": {"zone": "z1"}, "matchExpressions": [_expr("spot", "Exists")]}, False),
    ("In", {"matchExpressions": [_expr("zone", "In", "z1")]}, True),
    ("NotIn with the label missing", {"matchExpressions": [_expr("spot", "NotIn", "x")]}, True),
    ("NotIn without values is refused", {"matchExpressions": [_expr("spot", "NotIn")]}, False),
    ("Exists", {"matchExpressions": [_expr("zone", "Exists")]}, True),
    ("Exists with values is refused", {"matchExpressions": [_expr("zone", "Exists", "z1")]},
     False),
    ("DoesNotExist", {"matchExpressions": [_expr("spot", "DoesNotExist")]}, True),
    ("Gt is no LabelSelector operator", {"matchExpressions": [_expr("gpus", "Gt", "4")]}, False),
    ("a missing key is refused", {"matchExpressions": [_expr(None, "DoesNotExist")]}, False),
]


@pytest.mark.parametrize(("selector", "selected"), [(s, m) for _, s, m in LABEL_CASES],
                         ids=[why for why, _, _ in LABEL_CASES])
def test_label_selector_edge_cases(selector: dict[str, Any] | None, selected: bool) -> None:
    assert label_selector_matches(selector, LABELS) is selected


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("42", 42), ("-42", -42), ("+42", 42), ("007", 7),
    (str(2**63 - 1), 2**63 - 1), (str(-(2**63)), -(2**63)),
    (str(2**63), None), ("", None), (" 4", None), ("4 ", None), ("4\n", None), ("1_0", None),
    ("0x10", None), ("1e3", None), ("٣", None), ("+", None), (4, None),
])
def test_integers_are_read_as_gos_parse_int(text: object, value: int | None) -> None:
    assert parse_int64(text) == value
