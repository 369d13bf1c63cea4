"""Label and field selectors parse and match as the API server's do."""

from __future__ import annotations

import pytest

from dra_gateway.devkit.sim.selectors import parse_field_selector, parse_label_selector
from dra_gateway.kube.cluster.port import BadRequest
from dra_gateway.kube.resources import CONFIG_MAPS, PODS, RESOURCE_SLICES

LABELS = {"app": "web", "tier": "gold", "gpu-count": "4", "example.com/team": "ml"}


@pytest.mark.parametrize(("selector", "expected"), [
    ("", True),
    ("app=web", True),
    ("app==web", True),
    ("app!=web", False),
    ("missing!=x", True),
    ("tier in (gold,silver)", True),
    ("tier in (silver)", False),
    ("tier notin (silver)", True),
    ("missing notin (x)", True),
    ("missing in (x)", False),
    ("app", True),
    ("!app", False),
    ("!missing", True),
    ("example.com/team=ml", True),
    ("app=web,tier=gold", True),
    ("app=web, tier=silver", False),
    ("gpu-count>3", True),
    ("gpu-count<3", False),
    ("  app = web ,  tier in ( gold )  ", True),
])
def test_label_selectors_match_as_kubernetes_does(selector: str, expected: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is expected


@pytest.mark.parametrize(("selector", "why"), [
    ("app in web", "expected '(' after 'app in'"),
    ("app in (web", "expected ',' or ')'"),
    ("app in ()", "needs at least one value"),
    ("app=web,", "expected a requirement after ','"),
    ("app=web tier=gold", "expected ',' between requirements"),
    ("!", "expected a label key after '!'"),
    ("=web", "expected a label key, found '='"),
    ("app=w@b", "is not a valid label value"),
    ("-app=web", "is not a valid label key"),
    ("app>x", "needs an integer value"),
    ("app ~ web", "unknown operator"),
])
def test_bad_label_selectors_name_the_selector_and_the_problem(selector: str, why: str) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_label_selector(selector)
    assert caught.value.message.startswith(f'invalid label selector "{selector}": ')
    assert why in caught.value.message
    assert caught.value.code == 400


def test_field_selectors_read_the_fields_each_type_supports() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns"},
           "spec": {"nodeName": "node-a"}, "status": {"phase": "Running"}}
    assert parse_field_selector("spec.nodeName=node-a,status.phase!=Pending", PODS).matches(pod)
    assert not parse_field_selector("status.phase==Pending", PODS).matches(pod)
    assert parse_field_selector("metadata.name=p,metadata.namespace=ns", PODS).matches(pod)
    a_slice = {"metadata": {"name": "s"}, "spec": {"driver": "gpu.dra-gateway.io"}}
    assert parse_field_selector("spec.driver=gpu.dra-gateway.io,spec.nodeName=",
                                RESOURCE_SLICES).matches(a_slice)


def test_field_selectors_refuse_fields_the_type_does_not_support() -> None:
    with pytest.raises(BadRequest) as caught:
        parse_field_selector("spec.nodeName=x", CONFIG_MAPS)
    assert caught.value.message == (
        'invalid field selector "spec.nodeName=x": field label not supported: spec.nodeName '
        "(on configmaps: metadata.name, metadata.namespace)")
    with pytest.raises(BadRequest, match="is not of the form field=value"):
        parse_field_selector("metadata.name", PODS)
