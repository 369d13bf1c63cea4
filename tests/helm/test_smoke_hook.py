"""`dra-gateway smoke`, the check the chart's `helm test` hook runs, against the real webhook.

The webhook application is served over TLS on loopback with a fresh CA, as the chart's Service
serves it; the smoke command is run as the hook runs it (`--ca-env`, the caBundle the chart
renders, or `--ca-file`, the Secret's ca.crt).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from dra_gateway.certs.generate import make_bundle, write_bundle
from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.smoke import legacy_pod, problems
from dra_gateway.webhook.app import create_app
from dra_gateway.webhook.settings import WebhookSettings


async def _serve(tmp_path: Path) -> tuple[TestServer, Path]:
    paths = write_bundle(make_bundle(dns_names=["localhost"]), tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(paths.cert, paths.key)
    app = create_app(WebhookSettings(namespace="dra-gateway", rules_poll_interval=0.05,
                                     watch_retry_delay=0.05), MemoryCluster())
    server = TestServer(app, scheme="https", host="localhost")
    await server.start_server(ssl=context)
    return server, paths.ca_cert


async def _smoke(*args: str) -> int:
    return await asyncio.to_thread(main, ["smoke", *args])


async def _until_ready(url: str, ca: Path) -> None:
    """The webhook refuses reviews (not ready) until its rules are loaded."""
    for _ in range(100):
        if await _smoke("--webhook-url", url, "--ca-file", str(ca), "--timeout", "5") == 0:
            return
        await asyncio.sleep(0.05)


async def test_smoke_passes_when_the_webhook_translates_the_legacy_pod(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    server, ca = await _serve(tmp_path)
    try:
        url = f"https://localhost:{server.port}"
        await _until_ready(url, ca)
        capsys.readouterr()
        assert await _smoke("--webhook-url", url + "/", "--ca-file", str(ca)) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"smoke: ok: the webhook at {url}/mutate translated a pod asking "
                              "for nvidia.com/gpu: 1 into resource claims ["), out
        assert "legacy limits removed" in out
        # As the chart passes it: the caBundle (base64 PEM) in an environment variable.
        monkeypatch.setenv("SMOKE_CA", base64.b64encode(ca.read_bytes()).decode())
        assert await _smoke("--webhook-url", url, "--ca-env", "SMOKE_CA") == 0
    finally:
        await server.close()


async def test_smoke_fails_with_the_reason_when_the_certificate_is_not_trusted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = await _serve(tmp_path)
    other = write_bundle(make_bundle(dns_names=["localhost"]), tmp_path / "other").ca_cert
    try:
        url = f"https://localhost:{server.port}"
        assert await _smoke("--webhook-url", url, "--ca-file", str(other)) == 1
        err = capsys.readouterr().err
        assert f"error: no answer from the webhook at {url}/mutate: " in err
        assert "CERTIFICATE_VERIFY_FAILED" in err
    finally:
        await server.close()


def test_an_untranslated_answer_names_what_is_missing() -> None:
    pod = legacy_pod("default")
    unchanged = {"response": {"uid": "1", "allowed": True,
                              "warnings": ["would become a claim"]}}
    found, _ = problems(pod, unchanged)
    assert found == ["the pod was admitted unchanged (warnings: would become a claim): no "
                     "translation rule took nvidia.com/gpu"]
    refused = {"response": {"uid": "1", "allowed": False,
                            "status": {"code": 503, "reason": "ServiceUnavailable",
                                       "message": "rules not loaded yet"}}}
    assert problems(pod, refused)[0] == [
        "the pod was refused (503 ServiceUnavailable): rules not loaded yet"]
    # A patch that only adds an annotation leaves the legacy limit and gives no claims.
    patch = base64.b64encode(
        b'[{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]').decode()
    found, _ = problems(pod, {"response": {"uid": "1", "allowed": True, "patch": patch}})
    assert found == ["the translated pod has no spec.resourceClaims",
                     "spec.containers[0].resources.limits still asks for nvidia.com/gpu",
                     "spec.containers[0].resources.claims is empty"]
