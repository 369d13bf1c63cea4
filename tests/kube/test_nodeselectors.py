from __future__ import annotations

from dra_gateway.kube.nodeselectors import node_selector_matches


def _on(name: str) -> dict[str, object]:
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [name]}]}]}


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
