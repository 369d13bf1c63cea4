"""Shares served by MIG instances (issue 47): where a namespace's GPUSharingPolicy says
`shares.servedBy: MIG`, the share a rule of the GPU class computes becomes the smallest MIG
instances that hold it, whatever protocol asked for it; whole cards stay whole cards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gateway.devkit.migcards import MODELS
from dra_gateway.kube import names
from dra_gateway.translator import migshares
from dra_gateway.translator.explaining import MIG_SHARES_WHY, explain
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import TranslationPlan, translate

from .translator_support import checked, ctr, only_request, parameters_of, pod, run_cli

ATTRS = 'device.attributes["gpu.dra-gateway.io"]'
CAPACITY = 'device.capacity["gpu.dra-gateway.io"]'


def profile_selector(profile: str) -> str:
    return f'"profile" in {ATTRS} && {ATTRS}.profile == "{profile}"'


def memory_selector(amount: int) -> str:
    return f'"memory" in {CAPACITY} && {CAPACITY}.memory.compareTo(quantity("{amount}")) >= 0'


def cores_selector(amount: int) -> str:
    return f'"cores" in {CAPACITY} && {CAPACITY}.cores.compareTo(quantity("{amount}")) >= 0'


def translated(rules: RuleSet, limits: dict[str, Any], *, mig: bool = True,
               annotations: dict[str, str] | None = None) -> TranslationPlan:
    original = pod(ctr("main", limits=limits), annotations=annotations)
    plan = translate(original, rules, mig_shares=mig)
    assert plan.refusal is None, plan.refusal
    checked(plan, original)  # strict 1.34 schemas
    return plan


def offered(plan: TranslationPlan) -> list[str]:
    return [s["name"] for s in only_request(plan)["firstAvailable"]]


MIB = 1 << 20


# --- Every share protocol, one way ---------------------------------------------------------------

@pytest.mark.parametrize(("rule", "limits", "memory"), [
    ("hami", {"nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}, 20000 * MIB),
    ("volcano-vgpu", {"volcano.sh/vgpu-memory": 20000, "volcano.sh/vgpu-cores": 30},
     20000 * MIB),
    ("koordinator", {"koordinator.sh/gpu-memory": "20000Mi", "koordinator.sh/gpu-core": 30},
     20000 * MIB),
    ("qgpu", {"tke.cloud.tencent.com/qgpu-memory": 20, "tke.cloud.tencent.com/qgpu-core": 30},
     20 << 30),
    ("gpushare", {"aliyun.com/gpu-mem": 20, "aliyun.com/gpu-core.percentage": 30}, 20 << 30),
])
def test_every_protocols_share_becomes_the_smallest_instances_that_hold_it(
        builtin_rules: RuleSet, rule: str, limits: dict[str, Any], memory: int) -> None:
    """20000 MiB (or 20 GiB) and 30% of the compute: at least 3 of 7 slices, smallest memory
    first; then any instance of another model with the memory and the compute."""
    plan = translated(builtin_rules, limits)
    assert plan.rules_applied == [rule]
    subs = only_request(plan)["firstAvailable"]
    assert [s["name"] for s in subs] == ["3g-20gb", "4g-20gb", "3g-40gb", "4g-40gb", "7g-40gb",
                                         "3g-71gb", "4g-71gb", "any"]
    for sub in subs[:-1]:
        assert (sub["deviceClassName"], sub["count"]) == (names.MIG_CLASS, 1)
        profile = sub["name"].replace("-", ".")
        assert [s["cel"]["expression"] for s in sub["selectors"]] == [
            profile_selector(profile), memory_selector(memory)]
    assert [s["cel"]["expression"] for s in subs[-1]["selectors"]] == [
        memory_selector(memory), cores_selector(30)]
    # The instance is the share: nothing to enforce in software, no HAMi-core selector.
    assert parameters_of(plan, "main") == {"apiVersion": "dra-gateway.io/v1alpha1",
                                           "kind": "GpuShareConfig", "enforcement": "none"}


def test_without_the_policy_the_same_share_stays_a_share_of_a_card(
        builtin_rules: RuleSet) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30},
                      mig=False)
    exactly = only_request(plan)["exactly"]
    assert exactly["deviceClassName"] == names.GPU_CLASS
    assert exactly["capacity"]["requests"] == {"memory": "20000Mi", "cores": "30"}
    assert parameters_of(plan, "main")["enforcement"] == "hami-core"  # type: ignore[index]


def test_the_hami_share_offers_what_hamis_own_mig_mode_offers(builtin_rules: RuleSet) -> None:
    """The policy and HAMi's annotation nvidia.com/vgpu-mode: mig ask for the same instances."""
    limits = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}
    by_policy = only_request(translated(builtin_rules, limits))
    by_annotation = only_request(translated(builtin_rules, limits, mig=False,
                                            annotations={"nvidia.com/vgpu-mode": "mig"}))
    assert by_policy == by_annotation
    assert {s["count"] for s in by_policy["firstAvailable"]} == {2}


@pytest.mark.parametrize("limits", [
    {"nvidia.com/gpu": 2},
    {"nvidia.com/mig-1g.10gb": 1},
    {"nvidia.com/gpumem-percentage": 100},  # all of a card's memory and compute: a card
])
def test_whole_cards_and_instances_are_what_they_were(builtin_rules: RuleSet,
                                                      limits: dict[str, Any]) -> None:
    assert only_request(translated(builtin_rules, limits)) == only_request(
        translated(builtin_rules, limits, mig=False))


# --- Sizing --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("percent", "first"), [
    (12, "1g.5gb"),  # one memory slice of eight is 12.5%
    (13, "2g.10gb"),  # two slices; A100 40GB's 1g.10gb holds two, H100's one: not offered
    (40, "3g.20gb"),
    (51, "7g.40gb"),
])
def test_a_percent_of_memory_is_read_against_memory_slices_with_no_unknown_model(
        builtin_rules: RuleSet, percent: int, first: str) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpumem-percentage": percent})
    names_ = offered(plan)
    assert names_[0] == first.replace(".", "-")
    assert "any" not in names_  # another model's instance cannot be checked against a percent
    for sub in only_request(plan)["firstAvailable"]:
        (selector,) = sub["selectors"]
        profile = selector["cel"]["expression"].rsplit('"', 2)[1]
        known = {p.name: p for p in migshares.KNOWN_PROFILES}[profile]
        assert known.memory_slices * 100 >= percent * 8


def test_a_compute_share_alone_asks_for_enough_slices(builtin_rules: RuleSet) -> None:
    """A time-sliced replica (nvidia.com/gpu.shared: 5 of 10 a card): half the compute, so at
    least 4 of 7 slices; any other instance needs its published cores."""
    plan = translated(builtin_rules, {"nvidia.com/gpu.shared": 5})
    assert offered(plan) == ["4g-20gb", "4g-40gb", "7g-40gb", "4g-71gb", "7g-80gb",
                             "7g-141gb", "any"]
    subs = only_request(plan)["firstAvailable"]
    assert [s["cel"]["expression"] for s in subs[0]["selectors"]] == [
        profile_selector("4g.20gb")]
    assert [s["cel"]["expression"] for s in subs[-1]["selectors"]] == [cores_selector(50)]


def test_at_most_seven_profiles_then_any() -> None:
    assert migshares.alternatives(migshares.Share(memory=1)) == [
        "1g.5gb", "1g.10gb", "2g.10gb", "1g.18gb", "1g.20gb", "2g.20gb", "3g.20gb", ""]
    assert migshares.alternatives(migshares.Share(memory=200 << 30)) == [""]


def test_the_rules_selectors_name_the_instances_card(builtin_rules: RuleSet) -> None:
    """HAMi's card UUIDs and models: an instance's own uuid is not its card's."""
    plan = translated(builtin_rules, {"nvidia.com/gpumem": 10000},
                      annotations={"nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
                                   "nvidia.com/use-gputype": "H100"})
    for sub in only_request(plan)["firstAvailable"]:
        expressions = [s["cel"]["expression"] for s in sub["selectors"]]
        assert f'{ATTRS}.parentUUID in ["GPU-a", "GPU-b"]' in expressions[1]
        assert "productName" in expressions[0]
        assert not any(f"{ATTRS}.uuid" in e for e in expressions)


def test_the_selectors_choose_real_instances_of_each_model() -> None:
    """Each offered profile's selectors, evaluated with real CEL on the placements the node
    plugin publishes for the stand-in's cards: an instance of the profile and enough memory
    matches, nothing smaller does."""
    from dra_gateway.gpu.mig import Placement
    from dra_gateway.kube.cel import compile_selector, device_view
    from dra_gateway.node_plugin.devices import DeviceOptions, mig_placement_device
    from dra_gateway.node_plugin.facts import GpuFacts

    share = migshares.Share(memory=20000 * MIB, cores=30)
    request = migshares.request("main", count=1, share=share, selectors=(),
                                driver=names.DRIVER)
    chosen: dict[str, set[str]] = {}
    for model in MODELS.values():
        geometry = model.geometry()
        gpu = GpuFacts(index=0, uuid="GPU-0", product_name=model.name,
                       memory=model.memory_mib * MIB, mig_enabled=True, mig_geometry=geometry)
        for profile in geometry.profiles:
            device = device_view(names.DRIVER, mig_placement_device(
                gpu, geometry, Placement(profile, profile.starts[0]), DeviceOptions()))
            for sub in request["firstAvailable"]:
                if all(compile_selector(s["cel"]["expression"]).matches(device)
                       for s in sub["selectors"]):
                    chosen.setdefault(model.name, set()).add(profile.name)
                    holds = profile.memory_mib >= 20000 and profile.compute_slices >= 3
                    assert holds, (model.name, profile.name, sub["name"])
    # Every model has an instance that holds the share.
    assert set(chosen) == set(MODELS)


# --- Tables kept alike ---------------------------------------------------------------------------

def test_the_profile_table_is_the_mig_modes_table() -> None:
    builtin = Path(__file__).resolve().parents[2] / "translator" / "builtin"
    (spec,) = [r for r in yaml.safe_load((builtin / "nvidia.yaml").read_text())["rules"]
               if r["name"] == "hami-mig"]
    (table,) = [v["expression"] for v in spec["variables"] if v["name"] == "knownProfiles"]
    assert yaml.safe_load(table) == [p.name for p in migshares.KNOWN_PROFILES]


def test_memory_slices_are_the_fewest_any_model_gives_the_name() -> None:
    fewest: dict[str, int] = {}
    for model in MODELS.values():
        geometry = model.geometry()
        assert geometry.memory_slices == migshares.MEMORY_SLICES
        assert geometry.compute_slices == migshares.COMPUTE_SLICES
        for profile in geometry.profiles:
            if profile.name.endswith("+me"):
                continue
            fewest[profile.name] = min(fewest.get(profile.name, 99), profile.size)
            assert profile.compute_slices == int(profile.name.split("g.")[0])
    assert {p.name: p.memory_slices for p in migshares.KNOWN_PROFILES} == fewest


# --- Saying so -----------------------------------------------------------------------------------

def test_the_explanation_says_the_policy_made_it_an_instance(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpumem": 20000}))
    plan = translate(original, builtin_rules, mig_shares=True)
    (container,) = explain(original, builtin_rules, plan=plan).containers
    assert MIG_SHARES_WHY in container.why
    (memory,) = [k for k in container.keys if k.key == "nvidia.com/gpumem"]
    assert memory.became == ("the MIG profiles offered",)


def test_the_cli_translates_as_a_mig_namespace_would(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod(ctr("main", limits={"nvidia.com/gpumem": 20000}))))
    code, out, err = run_cli(capsys, "translate", "-f", str(manifest), "--mig-shares")
    assert (code, err) == (0, "")
    template = list(yaml.safe_load_all(out))[-1]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert {s["deviceClassName"] for s in request["firstAvailable"]} == {names.MIG_CLASS}
    code, out, _ = run_cli(capsys, "translate", "-f", str(manifest))
    (request,) = list(yaml.safe_load_all(out))[-1]["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == names.GPU_CLASS
