from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import EXAMPLES, eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    EVENTS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    RESOURCE_CLAIM_TEMPLATES,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
)
from dra_gateway.translator.rules import load_rules
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.config import configurations
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.rulestore import RuleStore
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, decoded_patch, review

Client = TestClient[web.Request, web.Application]

NPU_RULES = (EXAMPLES / "rules" / "new-vendor.yaml").read_text()
BROKEN_RULES = NPU_RULES.replace("example.com/npu: {}", "example.com/npu: {unit: Gb}")


def npu_pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1",
                                     "resources": {"limits": {"example.com/npu": "2"}}}]}}


def rules_config_map(data: dict[str, str], *, labelled: bool = True) -> dict[str, Any]:
    labels = {names.RULES_LABEL: names.RULES_LABEL_VALUE} if labelled else {}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "site-rules", "namespace": "dra-gateway", "labels": labels},
            "data": data}


async def _mutate(client: Client, pod: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/mutate", data=orjson.dumps(review(pod)))
    assert resp.status == 200
    answer: dict[str, Any] = (await resp.json())["response"]
    return answer


async def _install_configurations(cluster: MemoryCluster) -> None:
    mutating, validating = configurations(
        load_rules(), service_namespace="dra-gateway", service_name="dra-gateway-webhook",
        ca_bundle=b"-----BEGIN CERTIFICATE-----\n")
    await cluster.create(MUTATING_WEBHOOK_CONFIGURATIONS, mutating)
    await cluster.create(VALIDATING_WEBHOOK_CONFIGURATIONS, validating)


async def _expressions(cluster: MemoryCluster) -> list[str]:
    out = []
    for rt in (MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS):
        obj = await cluster.get(rt, "dra-gateway")
        out.append(obj["webhooks"][0]["matchConditions"][0]["expression"])
    return out


async def test_a_config_map_rule_update_takes_effect_and_a_broken_one_is_refused(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    # Before: no rule knows example.com/npu, the pod passes untouched.
    assert "patch" not in await _mutate(client, npu_pod())

    generation = state.store.generation
    await cluster.create(CONFIG_MAPS, rules_config_map({"npu.yaml": NPU_RULES}))
    await eventually(lambda: state.store.generation > generation)
    answer = await _mutate(client, npu_pod())
    patched = jsonpatch.apply_patch(npu_pod(), decoded_patch({"response": answer}))
    template_name = patched["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, template_name, namespace="ml")
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "npu.example.com"
    assert request["exactly"]["count"] == 2

    # A broken update: refused, counted, reported on the ConfigMap; the rules stay in force.
    generation = state.store.generation
    current = await cluster.get(CONFIG_MAPS, "site-rules", namespace="dra-gateway")
    current["data"] = {"npu.yaml": BROKEN_RULES}
    await cluster.update(CONFIG_MAPS, current)
    metric = state.metrics.rule_reload_failures.labels("configmap")
    await eventually(lambda: metric._value.get() == 1)
    assert state.store.generation == generation
    (event,) = (await cluster.list(EVENTS, namespace="dra-gateway")).items
    assert event["involvedObject"]["kind"] == "ConfigMap"
    assert event["involvedObject"]["name"] == "site-rules"
    assert event["involvedObject"]["uid"] == current["metadata"]["uid"]
    assert event["type"] == "Warning"
    assert event["reason"] == "RulesRefused"
    assert event["message"].startswith(
        "rules in ConfigMap dra-gateway/site-rules refused, the previous rules stay in force: "
        "1 rule failed to load: ConfigMap dra-gateway/site-rules key npu.yaml: ")
    assert "Gb" in event["message"]
    kubernetes_validate.validate(
        {k: v for k, v in event.items() if k != "metadata"} | {"metadata": {
            "name": event["metadata"]["name"], "namespace": "dra-gateway"}}, "1.34", strict=True)
    still = await _mutate(client, npu_pod())
    assert "patch" in still
    # Seeing the same broken data again (a relist) reports nothing new.
    assert await state.store.config_map_changed(current) is False
    assert len((await cluster.list(EVENTS, namespace="dra-gateway")).items) == 1


async def test_removing_the_label_takes_the_config_map_rules_out_of_force(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    await cluster.create(CONFIG_MAPS, rules_config_map({"npu.yaml": NPU_RULES}))
    await eventually(lambda: state.store.rules is not None
                     and state.store.rules.is_legacy("example.com/npu"))
    current = await cluster.get(CONFIG_MAPS, "site-rules", namespace="dra-gateway")
    current["metadata"]["labels"] = {}
    await cluster.update(CONFIG_MAPS, current)
    await eventually(lambda: state.store.rules is not None
                     and not state.store.rules.is_legacy("example.com/npu"))


async def test_an_expired_watch_relists_and_misses_nothing(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    cluster.expire_watches()
    await cluster.create(CONFIG_MAPS, rules_config_map({"npu.yaml": NPU_RULES}))
    await eventually(lambda: state.store.rules is not None
                     and state.store.rules.is_legacy("example.com/npu"))


async def test_match_conditions_follow_a_rule_change(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await _install_configurations(cluster)
    await eventually(lambda: state.config_maps_synced)
    before = await _expressions(cluster)
    assert all("example.com/" not in e for e in before)
    await cluster.create(CONFIG_MAPS, rules_config_map({"npu.yaml": NPU_RULES}))
    await eventually(lambda: state.metrics.config_reconciles.labels("updated")._value.get() >= 2)
    after = await _expressions(cluster)
    # The rule's domain, which covers its names and their typos (translator/typos.py).
    assert all('k.startsWith("example.com/")' in e for e in after)
    for rt in (MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS):
        obj = await cluster.get(rt, "dra-gateway")
        kubernetes_validate.validate(obj, "1.34", strict=True)
        # The installer's caBundle and everything else stay as they were.
        assert obj["webhooks"][0]["clientConfig"]["service"]["name"] == "dra-gateway-webhook"


async def test_a_rules_file_change_is_picked_up_and_a_broken_one_is_refused(
    aiohttp_client: ClientFactory, cluster: MemoryCluster, tmp_path: Path
) -> None:
    rules_file = tmp_path / "site.yaml"
    rules_file.write_text("apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n")
    settings = WebhookSettings(rules_paths=(rules_file,), watch_config_maps=False,
                               rules_poll_interval=0.02)
    client = await aiohttp_client(create_app(settings, cluster))
    state = client.app[STATE]
    assert state.store.rules is not None
    assert not state.store.rules.is_legacy("example.com/npu")
    rules_file.write_text(NPU_RULES)
    await eventually(lambda: state.store.rules is not None
                     and state.store.rules.is_legacy("example.com/npu"))
    generation = state.store.generation
    rules_file.write_text(BROKEN_RULES)
    await eventually(lambda: state.metrics.rule_reload_failures.labels("file")._value.get() == 1)
    assert state.store.generation == generation
    assert "patch" in await _mutate(client, npu_pod())


async def test_a_broken_rules_file_at_start_stops_the_app(
    cluster: MemoryCluster, tmp_path: Path
) -> None:
    rules_file = tmp_path / "site.yaml"
    rules_file.write_text(BROKEN_RULES)
    settings = WebhookSettings(rules_paths=(rules_file,), watch_config_maps=False)
    runner = web.AppRunner(create_app(settings, cluster))
    try:
        with pytest.raises(ValueError, match=r"^1 rule failed to load: .*site\.yaml: "):
            await runner.setup()
    finally:
        await runner.cleanup()


async def test_a_missing_ca_file_is_a_counted_reconcile_failure_not_a_dead_task(
    aiohttp_client: ClientFactory, cluster: MemoryCluster, tmp_path: Path
) -> None:
    await _install_configurations(cluster)
    settings = WebhookSettings(watch_config_maps=False, ca_file=tmp_path / "gone.crt")
    client = await aiohttp_client(create_app(settings, cluster))
    state = client.app[STATE]
    await eventually(lambda: state.metrics.config_reconciles.labels("failed")._value.get() >= 1)
    assert all(task.done() for task in state.tasks if task.get_name() ==
               "webhook-configurations")
    assert not [t for t in state.tasks if t.done() and not t.cancelled() and t.exception()]


def test_the_webhook_refuses_a_missing_ca_file_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dra_gateway.certs.generate import make_bundle, write_bundle
    from dra_gateway.cli import main

    write_bundle(make_bundle(dns_names=["svc.ns.svc"]), tmp_path)
    assert main(["webhook", "--listen", "127.0.0.1:0", "--tls-dir", str(tmp_path),
                 "--cluster", "memory", "--ca-file", str(tmp_path / "gone.crt")]) == 2
    assert capsys.readouterr().err == (
        f"error: --ca-file {tmp_path / 'gone.crt'} not found; pass the ca.crt written by "
        "`dra-gateway certs generate`, or leave --ca-file out\n")


def test_the_webhook_names_a_client_ca_it_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dra_gateway.certs.generate import make_bundle, write_bundle
    from dra_gateway.cli import main

    write_bundle(make_bundle(dns_names=["svc.ns.svc"]), tmp_path)
    assert main(["webhook", "--listen", "127.0.0.1:0", "--tls-dir", str(tmp_path),
                 "--cluster", "memory", "--client-ca", str(tmp_path / "gone.crt")]) == 2
    assert capsys.readouterr().err.startswith(
        f"error: cannot load the client CA {tmp_path / 'gone.crt'}: No such file")


async def test_a_refusal_names_the_config_maps_involved(
    client: Client, cluster: MemoryCluster
) -> None:
    # Rule ConfigMaps usually share key names (rules.yaml): the errors say which one they mean.
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    first = rules_config_map({"rules.yaml": NPU_RULES})
    assert await state.store.config_map_changed(first) is True
    second = rules_config_map({"rules.yaml": NPU_RULES.replace(
        "name: example-npu\n    precedence: 10", "name: other-npu")})
    second["metadata"]["name"] = "team-rules"
    assert await state.store.config_map_changed(second) is False
    (event,) = (await cluster.list(EVENTS, namespace="dra-gateway")).items
    assert event["involvedObject"]["name"] == "team-rules"
    assert event["message"] == (
        "rules in ConfigMap dra-gateway/team-rules refused, the previous rules stay in force: "
        "1 rule failed to load: ConfigMap dra-gateway/team-rules key rules.yaml: "
        'rules[0].precedence: rule "other-npu" reads example.com/npu like rule "example-npu", '
        "with no precedence between them; give it a different precedence, reuse the name to "
        "replace a rule, or disable one")
    assert state.store.rules is not None
    assert [r.source for r in state.store.rules.rules if r.name == "example-npu"] == [
        "ConfigMap dra-gateway/site-rules key rules.yaml"]


async def test_a_pending_deletion_taken_out_by_a_file_change_stays_out(
    cluster: MemoryCluster, tmp_path: Path
) -> None:
    # ConfigMap A defines example-npu; B only overrides it, so B fails to load without A and
    # A's deletion is refused (pending). A file change that defines example-npu itself lets
    # the rules load without A: A is gone, and a later change to another ConfigMap must not
    # bring A's rule back.
    rules_file = tmp_path / "site.yaml"
    rules_file.write_text("apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n")
    settings = WebhookSettings(rules_paths=(rules_file,), builtin_rules=False,
                               watch_config_maps=False)
    store = RuleStore(settings, cluster, Metrics())
    store.load_files()

    def named(name: str, data: dict[str, str]) -> dict[str, Any]:
        config_map = rules_config_map(data)
        config_map["metadata"]["name"] = name
        return config_map

    def sources() -> list[str]:
        assert store.rules is not None
        return [r.source for r in store.rules.rules if r.name == "example-npu"]

    override = ("apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
                "overrides:\n  - rule: example-npu\n    enabled: true\n")
    assert await store.config_map_changed(named("a", {"rules.yaml": NPU_RULES})) is True
    assert await store.config_map_changed(named("b", {"rules.yaml": override})) is True
    assert await store.config_map_deleted(named("a", {})) is False
    assert sources() == ["ConfigMap dra-gateway/a key rules.yaml"]
    assert store.problems == [
        "rules ConfigMap dra-gateway/a not in force: deleted, but the rules in force still hold "
        "it: the others fail without it"]

    rules_file.write_text(NPU_RULES.replace("npu.example.com", "npu2.example.com"))
    assert await store.check_files() is True
    assert sources() == [str(rules_file)]
    assert store.problems == []

    other = NPU_RULES.replace("example-npu", "other-npu").replace("example.com/npu",
                                                                  "example.com/tpu")
    assert await store.config_map_changed(named("c", {"rules.yaml": other})) is True
    assert sources() == [str(rules_file)]
    assert store.rules is not None
    assert "other-npu" in store.rules.rule_names
    assert store.problems == []
    # A's deletion is done: a relist without it has nothing left to delete.
    generation = store.generation
    await store.sync([named("b", {"rules.yaml": override}), named("c", {"rules.yaml": other})])
    assert store.generation == generation
    assert sources() == [str(rules_file)]
