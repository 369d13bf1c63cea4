"""Requests that cannot be honoured are refused with messages naming container, resource, rule."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import translate

from .translator_support import ctr, pod

REFUSALS: list[tuple[str, dict[str, Any], str, str, str]] = [
    # Koordinator's four validation rules.
    ("koordinator: vendor resource mixed with the share protocol",
     {"nvidia.com/gpu": 1, "koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory-ratio": 50},
     'container "train": koordinator.sh/gpu-core (rule koordinator) and nvidia.com/gpu (rule '
     "nvidia-gpu) cannot be combined in one container; ask for one protocol per container",
     "koordinator.sh/gpu-core, nvidia.com/gpu", "koordinator"),
    ("koordinator: both memory forms",
     {"koordinator.sh/gpu-memory": "8Gi", "koordinator.sh/gpu-memory-ratio": 50},
     'container "train": set koordinator.sh/gpu-memory or koordinator.sh/gpu-memory-ratio, not '
     "both (rule koordinator)",
     "koordinator.sh/gpu-memory, koordinator.sh/gpu-memory-ratio", "koordinator"),
    ("koordinator: core without memory", {"koordinator.sh/gpu-core": 50},
     'container "train": koordinator.sh/gpu-core needs koordinator.sh/gpu-memory or '
     "koordinator.sh/gpu-memory-ratio (rule koordinator)", "koordinator.sh/gpu-core",
     "koordinator"),
    ("koordinator: memory over several cards without gpu.shared",
     {"koordinator.sh/gpu-core": 200, "koordinator.sh/gpu-memory": "8Gi"},
     'container "train": koordinator.sh/gpu-memory over more than one card needs '
     "koordinator.sh/gpu.shared to say how many cards share it (rule koordinator)",
     "koordinator.sh/gpu-core, koordinator.sh/gpu-memory", "koordinator"),
    ("fractional whole-gpu count", {"nvidia.com/gpu": "0.5"},
     'container "train": nvidia.com/gpu is 0.5, not a whole number; ask for whole units (rule '
     "nvidia-gpu)", "nvidia.com/gpu", "nvidia-gpu"),
    ("negative count", {"nvidia.com/gpu": "-1"},
     'container "train": nvidia.com/gpu is -1, a negative amount (rule nvidia-gpu)',
     "nvidia.com/gpu", "nvidia-gpu"),
    ("non-numeric value", {"nvidia.com/gpu": "lots"},
     'container "train": nvidia.com/gpu: invalid quantity "lots": a quantity starts with a '
     'number, e.g. "40Gi" or "500m" (rule nvidia-gpu)', "nvidia.com/gpu", "nvidia-gpu"),
    ("hami: both memory forms", {"nvidia.com/gpumem": 100, "nvidia.com/gpumem-percentage": 10},
     'container "train": set nvidia.com/gpumem or nvidia.com/gpumem-percentage, not both (rule '
     "hami)", "nvidia.com/gpumem, nvidia.com/gpumem-percentage", "hami"),
    ("qgpu: over 100 and not whole cards", {"tke.cloud.tencent.com/qgpu-core": 150},
     'container "train": above 100, tke.cloud.tencent.com/qgpu-core must be a multiple of 100 '
     "(whole cards) (rule qgpu)", "tke.cloud.tencent.com/qgpu-core", "qgpu"),
    ("qgpu: steps of 5", {"tke.cloud.tencent.com/qgpu-core": 7},
     'container "train": tke.cloud.tencent.com/qgpu-core goes in steps of 5 (rule qgpu)',
     "tke.cloud.tencent.com/qgpu-core", "qgpu"),
    ("two mig profiles in one container",
     {"nvidia.com/mig-1g.5gb": 1, "nvidia.com/mig-2g.10gb": 1},
     'container "train": nvidia.com/mig-1g.5gb and nvidia.com/mig-2g.10gb cannot be combined in '
     "one container; one container asks for one kind (rule nvidia-mig)",
     "nvidia.com/mig-1g.5gb, nvidia.com/mig-2g.10gb", "nvidia-mig"),
    ("more devices than a claim holds", {"nvidia.com/gpu": 33},
     'container "train": nvidia.com/gpu gives a device count of 33; a DRA claim holds at most '
     "32 devices, so it could never be allocated; split the work over several pods (rule "
     "nvidia-gpu)", "nvidia.com/gpu", "nvidia-gpu"),
    ("an amount past 64 bits", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "1e400"},
     'container "train": nvidia.com/gpumem is 1e400, more than any device offers (rule hami)',
     "nvidia.com/gpumem", "hami"),
    # A suffix on a resource counted in a unit of its own is a unit mistaken, not a size.
    ("hami: memory with a binary suffix", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "8Gi"},
     'container "train": nvidia.com/gpumem counts MiB: 8Gi would mean 8Pi; write 8192 (rule '
     "hami)", "nvidia.com/gpumem", "hami"),
    ("hami: memory in decimal megas", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "8000M"},
     'container "train": nvidia.com/gpumem counts MiB: 8000M would mean 7812500Gi; write 7629 '
     "(rule hami)", "nvidia.com/gpumem", "hami"),
    ("hami: compute with a suffix",
     {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": "1Ki"},
     'container "train": nvidia.com/gpucores counts plain numbers (whole units, or percent): '
     "1Ki would mean 1024; write a plain number (a rule that reads bytes under this name says "
     'so: suffixes: true) (rule hami)', "nvidia.com/gpucores", "hami"),
    ("gpushare: memory in GiB with a suffix", {"aliyun.com/gpu-mem": "8Gi"},
     'container "train": aliyun.com/gpu-mem counts GiB: 8Gi would mean 8Ei; write 8 '
     "(rule gpushare)", "aliyun.com/gpu-mem", "gpushare"),
    ("two vendors in one container", {"nvidia.com/gpu": 1, "amd.com/gpu": 1},
     'container "train": amd.com/gpu (rule amd-gpu) and nvidia.com/gpu (rule nvidia-gpu) cannot '
     "be combined in one container; ask for one protocol per container",
     "amd.com/gpu, nvidia.com/gpu", "amd-gpu"),
]


@pytest.mark.parametrize(("limits", "message", "resource", "rule"),
                         [c[1:] for c in REFUSALS], ids=[c[0] for c in REFUSALS])
def test_refusal_names_container_resource_and_rule(
        builtin_rules: RuleSet, limits: dict[str, Any], message: str, resource: str,
        rule: str) -> None:
    plan = translate(pod(ctr("train", limits=limits)), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == message
    assert (plan.refusal.container, plan.refusal.resource, plan.refusal.rule) == (
        "train", resource, rule)
    assert plan.patch == []
    assert plan.templates == []


def test_limit_and_request_that_differ_are_refused(builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("train", limits={"nvidia.com/gpu": 2},
                             requests={"nvidia.com/gpu": 1})), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container "train": nvidia.com/gpu has limit 2 but request 1; extended resources need '
        "equal values (or set only the limit) (rule nvidia-gpu)")


def test_a_refused_container_refuses_the_whole_pod(builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("ok", limits={"nvidia.com/gpu": 1}),
                         ctr("bad", limits={"nvidia.com/gpu": "1.5"})), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.container == "bad"
    assert plan.patch == []


def test_an_existing_claim_named_like_the_gateways_is_refused(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                   resourceClaims=[{"name": "dra-gateway", "resourceClaimName": "mine"}])
    plan = translate(original, builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'the pod already has a resource claim named "dra-gateway" but no '
        "dra-gateway.io/translated annotation; rename that claim")


def test_containers_that_ask_for_more_devices_than_a_claim_holds_are_refused(
        builtin_rules: RuleSet) -> None:
    # 20 + 20 cards in one claim: allocation results hold at most 32 devices.
    plan = translate(pod(ctr("a", limits={"nvidia.com/gpu": 20}),
                         ctr("b", limits={"nvidia.com/gpu": 20})), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container "a": the pod\'s containers ask for 40 devices in all (a: 20, b: 20); a DRA '
        "claim holds at most 32 devices, so it could never be allocated; split the work over "
        "several pods")
    assert (plan.refusal.container, plan.refusal.resource) == ("a", "nvidia.com/gpu")
    assert plan.patch == []


def test_an_init_container_sharing_the_main_containers_cards_counts_once(
        builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": 32}),
                         init=(ctr("warmup", limits={"nvidia.com/gpu": 32}),)), builtin_rules)
    assert plan.refusal is None
    (template,) = plan.templates
    assert [r["exactly"]["count"] for r in template["spec"]["spec"]["devices"]["requests"]] == [32]


def test_a_share_a_rule_computes_that_the_gateway_cannot_carry_is_a_refusal() -> None:
    # A site rule that reads both memory forms and lacks the built-in rules' refusal for
    # asking both: the pod is refused, where GpuShareConfig's ValidationError escaped
    # translate and the webhook answered an internal error (found by the rules fuzz target).
    rules = load_rules({"site.yaml": """\
apiVersion: dra-gateway.io/v1alpha1
kind: TranslationRules
rules:
  - name: site-share
    resources: {example.com/mem: {unit: Mi}, example.com/mem-percent: {}}
    device:
      className: gpu.dra-gateway.io
      memory: r["example.com/mem"]
      memoryPercent: r["example.com/mem-percent"]
"""}, builtin=False)
    plan = translate(pod(ctr("train", {"example.com/mem": 1024, "example.com/mem-percent": 50})),
                     rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container "train": the share computed from these amounts is not valid: set memory or '
        "memoryPercent, not both (rule site-share)")


def test_two_containers_of_one_name_are_refused(builtin_rules: RuleSet) -> None:
    # Mutating admission comes before the API server's validation; the patch finds containers
    # by name and did not apply to such a pod (found by the /mutate fuzz target).
    plan = translate(pod(ctr("train", {"nvidia.com/gpu": 1}), ctr("train", {"nvidia.com/gpu": 2})),
                     builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container name "train" is used by more than one container; names must be unique '
        "across containers and initContainers")
    assert plan.patch == []


@pytest.mark.parametrize(("limits", "memory"), [
    # The API server writes a plain 8000 as 8k: it stands as written.
    ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "8k"}, "8000Mi"),
    # Koordinator counts bytes: a suffix is what it means.
    ({"koordinator.sh/gpu-core": 50, "koordinator.sh/gpu-memory": "8Gi"}, "8Gi"),
])
def test_a_suffix_that_means_what_it_says_is_taken(limits: dict[str, Any], memory: str) -> None:
    plan = translate(pod(ctr("train", limits)), load_rules())
    assert plan.refusal is None
    (template,) = plan.templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"]["memory"] == memory


def test_a_unit_that_is_no_power_of_1024_is_named_in_the_refusal() -> None:
    from dra_gateway.kube.quantity import mistaken_unit_message

    assert mistaken_unit_message("example.com/vmem", "8Gi", 256 << 20) == (
        "example.com/vmem counts units of 256Mi: 8Gi would mean 2Ei; write 32")
    assert mistaken_unit_message("example.com/cores", "1Ki", 1).endswith(
        "write a plain number (a rule that reads bytes under this name says so: "
        "suffixes: true)")
