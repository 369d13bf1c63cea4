"""What a pod left on legacy GPU names costs its namespace's GPUQuotas (policy.legacyusage)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.policy.amounts import RequestShape
from dra_gateway.policy.legacyusage import (
    LEGACY_DRIVER,
    counted_cards,
    keeps_legacy_gpus,
    legacy_charges,
    legacy_names,
    pod_charges,
    still_counted,
)
from dra_gateway.policy.quotas import Quota
from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import translated_claim_specs

GIB = 1 << 30


def _pod(limits: dict[str, str], *, init: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    if init is not None:
        spec["initContainers"] = [{"name": "prep", "resources": {"limits": init}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "a", "uid": "u-1",
                         "annotations": annotations or {}}, "spec": spec}


def _quota(**hard: int) -> Quota:
    return Quota("a", "q", tuple(hard.items()), frozenset(names.GATEWAY_CLASSES), None, False)


def _shape(count: int, *, memory: int | None = None, percent: int | None = None,
           cores: int | None = None, whole: bool = False) -> RequestShape:
    return RequestShape("main", names.GPU_CLASS, count, whole, memory, percent, cores, "none")


def test_each_card_a_request_asks_for_is_a_card_touched_of_its_own() -> None:
    charges = legacy_charges("u-1", [[_shape(2, memory=8 * GIB, cores=30)]])
    assert [c.key for c in charges] == [(LEGACY_DRIVER, "u-1", "0/main/0"),
                                        (LEGACY_DRIVER, "u-1", "0/main/1")]
    amounts = _quota(devices=4).amounts(charges)
    assert (amounts.devices, amounts.memory, amounts.cores, amounts.claims) == (
        2, 16 * GIB, 60, 1)


@pytest.mark.parametrize(("shape", "memory", "cores"), [
    (_shape(1, whole=True), 80 * GIB, 100),  # a whole card: the smallest card's memory
    (_shape(1, percent=25, cores=50), 20 * GIB, 50),  # a percent of the smallest card
    (_shape(1, cores=20), 0, 20),  # a share stating no memory holds none for sure
])
def test_what_a_request_does_not_state_is_read_on_the_smallest_card(
        shape: RequestShape, memory: int, cores: int) -> None:
    (charge,) = legacy_charges("u-1", [[shape]], card_memory=80 * GIB)
    assert (charge.memory, charge.cores, charge.device) == (memory, cores, None)


def test_a_pod_is_charged_what_the_rules_translate_it_into() -> None:
    pod = _pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "25"})
    charges = pod_charges(pod, translated_claim_specs(pod, load_rules()))
    amounts = _quota(devices=8).amounts(charges)
    assert (amounts.devices, amounts.memory, amounts.cores) == (2, 8 * GIB, 50)


def test_a_pod_the_rules_refuse_still_counts_its_cards() -> None:
    # Refused by the HAMi rule (both memory forms), yet a legacy plugin may serve it.
    pod = _pod({"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1024",
                "nvidia.com/gpumem-percentage": "50"})
    assert translated_claim_specs(pod, load_rules()) is None
    assert _quota(devices=8).amounts(pod_charges(pod, None)).devices == 3


@pytest.mark.parametrize(("limits", "init", "cards"), [
    ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"}, 2),
    ({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "4"}, 4),  # the larger of the two
    ({"volcano.sh/vgpu-number": "2", "nvidia.com/gpu": "1"}, None, 3),
    ({"nvidia.com/gpumem": "4096"}, None, 0),  # memory is no count of cards
])
def test_counted_cards_are_what_the_scheduler_counts(
        limits: dict[str, str], init: dict[str, str] | None, cards: int) -> None:
    assert counted_cards(_pod(limits, init=init)) == cards


@pytest.mark.parametrize(("limits", "annotations", "skip", "keeps"), [
    ({"nvidia.com/gpu": "1"}, {}, (), True),
    ({"nvidia.com/gpu": "0"}, {}, (), False),  # charts carry zero as a default
    ({"nvidia.com/priority": "1"}, {}, (), False),  # a hint, not an amount
    ({"amd.com/gpu": "1"}, {}, (), False),  # another driver's cards
    # An annotation the tenant may write proves nothing: the legacy name is still there.
    ({"nvidia.com/gpu": "1"}, {names.ANNOTATION_TRANSLATED: "{}"}, (), True),
    ({"nvidia.com/gpu": "1"}, {}, ("nvidia.com/gpu",), False),  # a DeviceClass serves it
])
def test_which_pods_a_legacy_stack_serves(limits: dict[str, str], annotations: dict[str, str],
                                          skip: tuple[str, ...], keeps: bool) -> None:
    assert keeps_legacy_gpus(_pod(limits, annotations=annotations), skip=skip) is keeps


@pytest.mark.parametrize(("meta", "phase", "counted"), [
    ({}, "Running", True),
    ({}, "Succeeded", False),
    # Being deleted: its containers still hold the card until the grace period is over.
    ({"deletionTimestamp": "2026-12-04T10:00:30Z", "deletionGracePeriodSeconds": 30},
     "Running", True),
    ({"deletionTimestamp": "2026-12-04T09:59:00Z", "deletionGracePeriodSeconds": 30},
     "Running", False),
])
def test_a_pod_counts_as_a_resource_quota_counts_it(meta: dict[str, Any], phase: str,
                                                     counted: bool) -> None:
    pod = {"metadata": {"name": "p", **meta}, "status": {"phase": phase}}
    assert still_counted(pod, datetime(2026, 12, 4, 10, 0, 0, tzinfo=UTC)) is counted


def test_what_kube_scheduler_serves_is_not_charged_as_legacy() -> None:
    """A DeviceClass declaring nvidia.com/gpu as its extended resource: kube-scheduler serves a
    HAMi container whole (gpumem with it), so none of it is a legacy plugin's."""
    from dra_gateway.translator.extended import ExtendedResources, deferred_resources

    rules = load_rules()
    extended = ExtendedResources({"nvidia.com/gpu": ("gpu.example.com",)})
    pod = _pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"})
    skip = deferred_resources(legacy_names(pod), rules, extended)
    assert skip == {"nvidia.com/gpu", "nvidia.com/gpumem"}
    assert not keeps_legacy_gpus(pod, skip=skip)
    specs = translated_claim_specs(pod, rules, extended=extended)
    assert pod_charges(pod, specs, skip=skip) == ()
