"""`migrate quotas`: GPUQuotas to apply under the rules in force; what does not convert said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import CONFIG_MAPS
from dra_gateway.migrate.dumps import read_dumps
from dra_gateway.migrate.live import RESOURCE_QUOTAS, read_cluster
from dra_gateway.migrate.quotas import migrate_quotas, render_yaml
from dra_gateway.migrate.rules import rules_in_force
from dra_gateway.policy.legacyquotas import SOURCE_ANNOTATION

from .conftest import (
    assert_valid_gpu_quota,
    resource_quota,
    rules_config_map,
    write_dump,
)

# A tenant's ConfigMap with the rules label: it would make gpushare memory MiB, not GiB.
TENANT_OVERRIDE = {"apiVersion": names.API_VERSION, "kind": "TranslationRules",
                   "overrides": [{"rule": "gpushare", "units": {"aliyun.com/gpu-mem": "Mi"}}]}


def _gpu_quota(ns: str, name: str, hard: dict[str, object]) -> dict[str, object]:
    return {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": ns}, "spec": {"hard": hard}}


def test_the_yaml_applies_as_valid_gpu_quotas_with_comments_on_what_did_not_convert(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = write_dump(tmp_path / "dump.yaml", [
        resource_quota("gpus", "team-a", {"requests.nvidia.com/gpu": 4,
                                          "limits.nvidia.com/gpumem": 16384,
                                          "limits.nvidia.com/gpumem-percentage": 50}),
        resource_quota("amd", "team-b", {"requests.amd.com/gpu": 2}),
        resource_quota("cpu", "team-c", {"cpu": 10})])

    assert main(["migrate", "quotas", "-f", str(dump)]) == 0

    out, err = capsys.readouterr()
    documents = [d for d in yaml.safe_load_all(out) if d is not None]
    assert len(documents) == 1
    (quota,) = documents
    assert_valid_gpu_quota(quota)
    assert quota["metadata"] == {"name": "gpus", "namespace": "team-a",
                                 "annotations": {SOURCE_ANNOTATION: "gpus"}}
    assert quota["spec"]["hard"] == {"devices": 4, "memory": "16Gi"}
    assert ("# not converted: limits.nvidia.com/gpumem-percentage: 50: a percentage of each "
            "card's memory") in out
    assert "# from ResourceQuota team-b/amd\n" in out
    assert "# no GPUQuota: nothing in it has an equivalent" in out
    assert "team-c" not in out
    assert err.splitlines() == [
        "warning: ResourceQuota team-a/gpus: spec.hard['limits.nvidia.com/gpumem-percentage'] = "
        "50 has no GPUQuota equivalent: a percentage of each card's memory, while a GPUQuota "
        "counts bytes; set spec.hard.memory by hand (percent x the cards' memory)",
        "warning: ResourceQuota team-b/amd: spec.hard['requests.amd.com/gpu'] = 2 has no "
        "GPUQuota equivalent: rule amd-gpu translates it to gpu.amd.com, a class another "
        "driver allocates; a GPUQuota counts only the gateway's classes: keep the "
        "ResourceQuota for it",
    ]


def test_the_json_holds_the_quotas_and_every_unconverted_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = write_dump(tmp_path / "dump.yaml", [
        resource_quota("gpus", "team-a", {"requests.nvidia.com/gpu": 4,
                                          "requests.amd.com/gpu": 1})])
    assert main(["migrate", "quotas", "-f", str(dump), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (quota,) = out["gpuQuotas"]
    assert_valid_gpu_quota(quota)
    (conversion,) = out["conversions"]
    assert [u["key"] for u in conversion["unconverted"]] == ["requests.amd.com/gpu"]
    assert conversion["existing"] is None
    assert len(out["warnings"]) == 1


def test_a_rule_configmap_in_force_sets_the_unit(tmp_path: Path) -> None:
    # The site reads gpushare memory in MiB: the quota must read it so too, or be 1024x off.
    override = {"apiVersion": names.API_VERSION, "kind": "TranslationRules",
                "overrides": [{"rule": "gpushare", "units": {"aliyun.com/gpu-mem": "Mi"}}]}
    dump = write_dump(tmp_path / "dump.yaml", [
        rules_config_map("site", "dra-gateway", override),
        resource_quota("share", "team-a", {"aliyun.com/gpu-mem": 2048})])
    inventory = read_dumps([str(dump)])
    migration = migrate_quotas(inventory, rules_in_force(inventory.rule_config_maps))
    (conversion,) = migration.conversions
    assert conversion.gpu_quota is not None
    assert conversion.gpu_quota["spec"]["hard"] == {"memory": "2Gi"}


def test_an_existing_gpu_quota_that_differs_is_a_warning(tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "dump.yaml", [
        resource_quota("gpus", "team-a", {"requests.nvidia.com/gpu": 4}),
        _gpu_quota("team-a", "gpus", {"devices": 2})])
    inventory = read_dumps([str(dump)])
    migration = migrate_quotas(inventory, rules_in_force(()))
    assert migration.warnings == (
        "GPUQuota team-a/gpus exists with hard {devices: 2}; applying this output replaces it "
        "with {devices: 4}",)


def test_no_legacy_quota_says_so_instead_of_printing_nothing(tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "dump.yaml", [resource_quota("cpu", "a", {"cpu": 1})])
    inventory = read_dumps([str(dump)])
    assert render_yaml(migrate_quotas(inventory, rules_in_force(()))) == (
        "# no ResourceQuota names a legacy GPU resource: no GPUQuota to create\n")


def test_a_broken_rule_configmap_is_named_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = {"apiVersion": names.API_VERSION, "kind": "TranslationRules",
              "rules": [{"name": "x", "resources": {"a.com/x": {"unit": "Gb"}},
                         "device": {"className": "x.example.com", "count": "1"}}]}
    dump = write_dump(tmp_path / "dump.yaml", [rules_config_map("site", "gw", broken)])
    assert main(["migrate", "quotas", "-f", str(dump), "--namespace", "gw"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the rules in force do not load: ")
    assert "ConfigMap gw/site" in err
    assert 'unknown unit "Gb"' in err


async def test_a_tenants_rule_configmap_does_not_change_the_quotas_of_a_live_cluster(
        ) -> None:
    """The webhook reads rule ConfigMaps in its own namespace only: a tenant's labelled
    ConfigMap must not change the GPUQuotas an administrator is told to apply."""
    memory = MemoryCluster()
    await memory.create(CONFIG_MAPS, rules_config_map("mine", "team-a", TENANT_OVERRIDE))
    await memory.create(RESOURCE_QUOTAS,
                        resource_quota("share", "team-a", {"aliyun.com/gpu-mem": 2}))
    inventory = await read_cluster(memory)
    assert inventory.rule_config_maps == []
    (conversion,) = migrate_quotas(inventory, rules_in_force(())).conversions
    assert conversion.gpu_quota is not None
    assert conversion.gpu_quota["spec"]["hard"] == {"memory": "2Gi"}
    # Installed in team-a, the gateway's webhook reads it: so does migrate.
    inventory = await read_cluster(memory, gateway_namespace="team-a")
    (conversion,) = migrate_quotas(inventory, rules_in_force(
        inventory.rule_config_maps, namespace="team-a")).conversions
    assert conversion.gpu_quota is not None
    assert conversion.gpu_quota["spec"]["hard"] == {"memory": "2Mi"}


def test_a_tenants_rule_configmap_in_a_dump_is_left_out_and_said_to_be(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = write_dump(tmp_path / "dump.yaml", [
        rules_config_map("mine", "team-a", TENANT_OVERRIDE),
        resource_quota("share", "team-a", {"aliyun.com/gpu-mem": 2})])
    assert main(["migrate", "quotas", "-f", str(dump), "-o", "json"]) == 0
    out, err = capsys.readouterr()
    (quota,) = json.loads(out)["gpuQuotas"]
    assert quota["spec"]["hard"] == {"memory": "2Gi"}
    assert err.splitlines() == [
        "warning: ConfigMap team-a/mine carries dra-gateway.io/rules=true but is not in the "
        "gateway's namespace dra-gateway: the webhook does not read it, so neither does this "
        "command (a different namespace: --namespace)"]
