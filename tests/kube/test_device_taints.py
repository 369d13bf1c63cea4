"""DeviceTaintRules applied to slices' devices as kube-scheduler applies them."""

from __future__ import annotations

from typing import Any

from dra_gateway.kube.device_taints import TaintRules

TAINT = {"key": "maintenance", "value": "disk", "effect": "NoSchedule"}


def _slice(pool: str = "node-a", driver: str = "gpu.dra-gateway.io") -> dict[str, Any]:
    return {"metadata": {"name": f"{pool}-slice"},
            "spec": {"driver": driver, "pool": {"name": pool, "generation": 1},
                     "devices": [{"name": "gpu-0"},
                                 {"name": "gpu-1", "taints": [{"key": "own",
                                                               "effect": "NoExecute"}]}]}}


def _rule(name: str, selector: dict[str, str] | None, taint: dict[str, str] = TAINT
          ) -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": taint}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def _taints(resource_slice: Any) -> list[list[str]]:
    return [[t["key"] for t in d.get("taints") or ()] for d in resource_slice["spec"]["devices"]]


def test_a_rule_selects_by_driver_pool_and_device_each_optional() -> None:
    rules = TaintRules([_rule("one", {"driver": "gpu.dra-gateway.io", "pool": "node-a",
                                      "device": "gpu-1"})])
    assert _taints(rules.apply(_slice())) == [[], ["own", "maintenance"]]
    assert _taints(rules.apply(_slice("node-b"))) == [[], ["own"]]
    assert _taints(rules.apply(_slice(driver="gpu.nvidia.com"))) == [[], ["own"]]
    pool = TaintRules([_rule("pool", {"pool": "node-a"})])
    assert _taints(pool.apply(_slice())) == [["maintenance"], ["own", "maintenance"]]


def test_an_empty_selector_selects_every_device_and_a_missing_one_none() -> None:
    assert _taints(TaintRules([_rule("all", {})]).apply(_slice("x"))) == [
        ["maintenance"], ["own", "maintenance"]]
    untouched = _slice()
    assert TaintRules([_rule("none", None)]).apply(untouched) is untouched


def test_applying_leaves_the_mirrors_slice_as_it_was() -> None:
    original = _slice()
    tainted = TaintRules([_rule("all", {})]).apply(original)
    assert tainted is not original
    assert _taints(original) == [[], ["own"]]


def test_changes_say_whether_what_is_tainted_changed() -> None:
    rules = TaintRules()
    assert rules.set(_rule("r", {"device": "gpu-0"})) is True
    assert rules.set(_rule("r", {"device": "gpu-0"})) is False
    assert rules.set(_rule("r", {"device": "gpu-1"})) is True
    assert rules.taints_of("d", "p", "gpu-1") == [TAINT]
    assert rules.remove("r") is True
    assert rules.remove("r") is False
    assert len(rules) == 0
