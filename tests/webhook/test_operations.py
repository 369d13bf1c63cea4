from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import eventually

from dra_gateway.certs.generate import make_bundle, write_bundle
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.logs import JsonFormatter
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, hami_pod, plain_pod, review

Client = TestClient[web.Request, web.Application]


async def test_healthz_answers_ok(client: Client) -> None:
    resp = await client.get("/healthz")
    assert (resp.status, await resp.text()) == (200, "ok\n")


async def test_readyz_needs_rules_config_maps_device_classes_and_a_certificate(
    aiohttp_client: ClientFactory, cluster: MemoryCluster, tmp_path: Path
) -> None:
    settings = WebhookSettings(tls_dir=tmp_path)
    client = await aiohttp_client(create_app(settings, cluster))
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced and state.device_classes.synced)
    resp = await client.get("/readyz")
    assert (resp.status, await resp.text()) == (
        503, "not ready: no serving certificate in place\n")
    state.config_maps_synced = False  # as before the first list of rule ConfigMaps
    state.device_classes.synced = False  # and of DeviceClasses
    resp = await client.get("/readyz")
    assert (resp.status, await resp.text()) == (
        503, "not ready: rule ConfigMaps not read yet; DeviceClasses not read yet; no serving "
             "certificate in place\n")
    state.config_maps_synced = True
    state.device_classes.synced = True
    write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    resp = await client.get("/readyz")
    assert (resp.status, await resp.text()) == (200, "ok\n")


async def test_metrics_count_latency_translations_refusals_and_reloads(client: Client) -> None:
    await client.post("/mutate", data=orjson.dumps(review(hami_pod())))
    await client.post("/mutate", data=orjson.dumps(review(plain_pod())))
    await client.post("/validate", data=orjson.dumps(review(hami_pod())))
    await client.post("/mutate", data=b"nonsense")
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    text = await resp.text()
    for line in (
        'dra_gateway_webhook_request_duration_seconds_count{webhook_endpoint="mutate"} 2.0',
        'dra_gateway_webhook_request_duration_seconds_count{webhook_endpoint="validate"} '
        '1.0',
        'dra_gateway_webhook_translations_total{rule="hami"} 1.0',
        'dra_gateway_webhook_refusals_total{reason="UntranslatedGpuRequest",'
        'webhook_endpoint="validate"} 1.0',
        'dra_gateway_webhook_reviews_total{outcome="patched",webhook_endpoint="mutate"} 1.0',
        'dra_gateway_webhook_reviews_total{outcome="allowed",webhook_endpoint="mutate"} 1.0',
        'dra_gateway_webhook_bad_requests_total{webhook_endpoint="mutate"} 1.0',
        'dra_gateway_webhook_rule_reloads_total{source="file"} 1.0',
    ):
        assert line in text, line
    assert "dra_gateway_webhook_rule_reload_failures_total" in text


async def test_two_apps_in_one_process_keep_their_own_metrics(
    aiohttp_client: ClientFactory,
) -> None:
    settings = WebhookSettings(watch_config_maps=False)
    first = await aiohttp_client(create_app(settings, MemoryCluster()))
    second = await aiohttp_client(create_app(settings, MemoryCluster()))
    await first.post("/mutate", data=orjson.dumps(review(hami_pod())))
    text = await (await second.get("/metrics")).text()
    assert 'dra_gateway_webhook_translations_total{rule="hami"}' not in text


async def test_refusals_are_logged_as_json_with_the_request_uid(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dra_gateway.webhook"):
        await client.post("/validate", data=orjson.dumps(review(hami_pod(), uid="log-1")))
    (record,) = [r for r in caplog.records if r.getMessage() == "pod refused"]
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["level"] == "info"
    assert entry["logger"] == "dra_gateway.webhook.app"
    assert entry["uid"] == "log-1"
    assert entry["endpoint"] == "validate"
    assert entry["namespace"] == "inference"
    assert entry["reason"] == "UntranslatedGpuRequest"
    assert entry["time"].endswith("Z")


def test_a_logged_exception_carries_its_stack_in_one_json_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.getLogger("dra_gateway.webhook.app").makeRecord(
            "dra_gateway.webhook.app", logging.ERROR, __file__, 1, "admission review failed", (),
            exc_info=__import__("sys").exc_info(), extra={"uid": "u-9"})
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = orjson.loads(line)
    assert entry["uid"] == "u-9"
    assert "RuntimeError: boom" in entry["stack"]
