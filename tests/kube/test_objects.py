"""Typed views of raw Kubernetes objects: where each field sits, and what absence means."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names, objects


def _pod(**overrides: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                     "labels": {"app": "x"}, "annotations": {"a": "b"},
                     "finalizers": [names.FINALIZER]},
        "spec": {"schedulingGates": [{"name": "other"}, {"name": names.SCHEDULING_GATE}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "direct"},
                                    {"name": "tpl", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "tpl", "resourceClaimName": "p-tpl-1"}]},
    }
    pod.update(overrides)
    return pod


def test_accessors_read_metadata_fields() -> None:
    pod = _pod()
    assert objects.name(pod) == "p"
    assert objects.namespace(pod) == "ns"
    assert objects.namespace_name(pod) == ("ns", "p")
    assert objects.uid(pod) == "u1"
    assert objects.resource_version(pod) == "7"
    assert objects.labels(pod) == {"app": "x"}
    assert objects.annotations(pod) == {"a": "b"}
    assert objects.finalizers(pod) == [names.FINALIZER]
    assert objects.has_finalizer(pod)
    assert not objects.is_deleting(pod)


@pytest.mark.parametrize("metadata", [None, "not an object", [], {}],
                         ids=["missing", "string", "list", "empty"])
def test_accessors_answer_empty_values_for_missing_or_malformed_metadata(metadata: Any) -> None:
    obj: dict[str, Any] = {} if metadata is None else {"metadata": metadata}
    assert objects.meta(obj) == {}
    assert objects.name(obj) == objects.namespace(obj) == objects.uid(obj) == ""
    assert objects.resource_version(obj) == ""
    assert objects.namespace_name(obj) == ("", "")
    assert objects.annotations(obj) == objects.labels(obj) == {}
    assert objects.finalizers(obj) == objects.owner_references(obj) == []
    assert objects.controller_owner_uid(obj) is None
    assert not objects.has_finalizer(obj)


def test_accessors_tolerate_null_fields_as_the_api_sends_them() -> None:
    obj = {"metadata": {"name": None, "annotations": None, "labels": None, "finalizers": None,
                        "ownerReferences": None}, "spec": None, "status": None}
    assert objects.name(obj) == ""
    assert objects.annotations(obj) == objects.labels(obj) == {}
    assert objects.spec(obj) == objects.status(obj) == {}
    assert not objects.is_gated(obj)
    assert not objects.is_allocated(obj)


def test_a_pod_is_gated_by_the_gateway_gate_wherever_it_sits_in_the_list() -> None:
    assert objects.is_gated(_pod())
    assert not objects.is_gated(_pod(spec={"schedulingGates": [{"name": "other"}]}))


def test_claim_names_of_a_pod_come_from_spec_and_claim_statuses() -> None:
    assert objects.claim_names_of(_pod()) == {"direct", "p-tpl-1"}


@pytest.mark.parametrize(("entry", "source"), [
    ({"name": "a", "resourceClaimTemplateName": "t"}, ("template", "t")),
    ({"name": "a", "resourceClaimName": "c"}, ("claim", "c")),
    ({"name": "a", "resourceClaimTemplateName": "t", "resourceClaimName": "c"}, ("template", "t")),
    ({"name": "a", "resourceClaimTemplateName": None, "resourceClaimName": "c"}, ("claim", "c")),
    ({"name": "a"}, None),
    ("a", None),
])
def test_a_pod_claim_is_made_from_its_template_first_then_its_claim(
        entry: Any, source: objects.ClaimSource | None) -> None:
    assert objects.claim_source(entry) == source


def test_a_pod_is_finished_once_it_succeeded_or_failed() -> None:
    assert objects.is_finished(_pod(status={"phase": "Succeeded"}))
    assert objects.is_finished(_pod(status={"phase": "Failed"}))
    assert not objects.is_finished(_pod(status={"phase": "Running"}))


def _claim(*, owner: dict[str, Any] | None = None, reserved: list[dict[str, Any]] | None = None,
           requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "c", "namespace": "ns", "uid": "cu"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta,
            "spec": {"devices": {"requests": requests or []}},
            "status": {"reservedFor": reserved or []}}


POD_OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pu", "controller": True}


def test_the_controller_owner_is_a_pod_that_controls_the_object() -> None:
    assert objects.controller_owner_uid(_claim(owner=POD_OWNER)) == "pu"
    assert objects.controller_owner_uid(_claim(owner={**POD_OWNER, "controller": False})) is None
    assert objects.controller_owner_uid(_claim(owner={**POD_OWNER, "kind": "Job"})) is None


def test_owner_and_reserved_joins_the_owner_with_reserved_pods_only() -> None:
    claim = _claim(owner=POD_OWNER, reserved=[
        {"resource": "pods", "name": "q", "uid": "qu"},
        {"resource": "jobs", "name": "j", "uid": "ju"}])
    assert objects.reserved_pod_uids(claim) == {"qu"}
    assert objects.owner_and_reserved(claim) == {"pu", "qu"}


def test_request_classes_include_first_available_alternatives() -> None:
    claim = _claim(requests=[
        {"name": "a", "exactly": {"deviceClassName": "x.example.com"}},
        {"name": "b", "firstAvailable": [{"name": "big", "deviceClassName": names.MIG_CLASS},
                                         {"name": "small", "deviceClassName": "y"}]}])
    assert objects.request_classes(claim) == {"x.example.com", names.MIG_CLASS, "y"}
    assert objects.is_gateway_claim(claim)
    assert not objects.is_gateway_claim(_claim(requests=[
        {"name": "a", "exactly": {"deviceClassName": "x.example.com"}}]))


def test_allocation_node_reads_a_single_node_match_fields_selector() -> None:
    def selector(values: list[str], operator: str = "In") -> dict[str, Any]:
        return {"nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": operator, "values": values}]}]}}

    assert objects.allocation_node(selector(["n1"])) == "n1"
    assert objects.allocation_node(selector(["n1", "n2"])) is None
    assert objects.allocation_node(selector(["n1"], "NotIn")) is None
    assert objects.allocation_node({}) is None


def test_allocation_state_comes_from_status() -> None:
    assert objects.is_allocated({"status": {"allocation": {"devices": {}, "nodeSelector": {}}}})
    assert not objects.is_allocated({"status": {"allocation": None}})
