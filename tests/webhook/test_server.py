from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from dra_gateway.certs.generate import make_bundle, write_bundle
from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES, ResourceType
from dra_gateway.webhook.server import ServeOptions, serve
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import decoded_patch, hami_pod, review


class _SlowTemplates(MemoryCluster):
    """Takes its time creating templates, as a busy API server does."""

    delay = 0.0

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        if rt is RESOURCE_CLAIM_TEMPLATES:
            await asyncio.sleep(self.delay)
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


@dataclass
class Running:
    url: str
    ssl: ssl.SSLContext
    stop: asyncio.Event
    task: asyncio.Task[None]
    cluster: _SlowTemplates
    tls_dir: Path


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]), tmp_path)
    settings = WebhookSettings(tls_dir=tmp_path, template_timeout=5)
    cluster = _SlowTemplates()
    stop = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(
        settings, ServeOptions(host="127.0.0.1", port=0, shutdown_timeout=5,
                               certificate_poll_interval=0.05), cluster=cluster,
        stop=stop, started=port.set_result))
    await asyncio.wait_for(asyncio.shield(port), 10)
    ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    yield Running(f"https://localhost:{port.result()}", ctx, stop, task, cluster, tmp_path)
    stop.set()
    await task


async def test_the_server_answers_reviews_over_tls_with_keep_alive(running: Running) -> None:
    connector = aiohttp.TCPConnector(ssl=running.ssl, limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(running.url + path) as resp:
                assert (resp.status, await resp.text()) == (200, "ok\n")
        peers = set()
        for i in range(3):
            async with session.post(running.url + "/mutate",
                                    data=orjson.dumps(review(hami_pod(), uid=f"k-{i}"))) as resp:
                answer = await resp.json()
                assert answer["response"]["uid"] == f"k-{i}"
                assert decoded_patch(answer)
                peers.add(id(resp.connection.transport) if resp.connection else None)
        assert len(peers) == 1  # one keep-alive connection served all three
        async with session.get(running.url + "/metrics") as resp:
            text = await resp.text()
    assert ('dra_gateway_webhook_request_duration_seconds_count{webhook_endpoint="mutate"} '
            '3.0') in text
    assert 'dra_gateway_webhook_translations_total{rule="hami"} 3.0' in text


async def test_a_renewed_certificate_is_served_while_open_connections_keep_working(
    running: Running,
) -> None:
    host, port = "127.0.0.1", int(running.url.rsplit(":", 1)[1])
    old_ca = (running.tls_dir / "ca.crt").read_bytes()
    keep = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=running.ssl, limit=1))
    async with keep:
        async with keep.post(running.url + "/mutate",
                             data=orjson.dumps(review(hami_pod(), uid="before"))) as resp:
            assert resp.status == 200
        write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]),
                     running.tls_dir)
        new_ca = (running.tls_dir / "ca.crt").read_bytes()
        both = ssl.create_default_context(cadata=(old_ca + new_ca).decode())
        for _ in range(200):
            _, writer = await asyncio.open_connection(host, port, ssl=both,
                                                      server_hostname="localhost")
            served = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            writer.close()
            await writer.wait_closed()
            if served == _der(running.tls_dir / "tls.crt"):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the renewed certificate was never served")
        # The keep-alive connection opened before the renewal still answers (a new connection
        # would fail: this session trusts the old CA only).
        async with keep.post(running.url + "/mutate",
                             data=orjson.dumps(review(hami_pod(), uid="after"))) as resp:
            assert (await resp.json())["response"]["uid"] == "after"


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


async def test_shutdown_finishes_in_flight_reviews(running: Running) -> None:
    running.cluster.delay = 0.5
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=running.ssl)) as session:
        async def slow() -> Any:
            async with session.post(running.url + "/mutate",
                                    data=orjson.dumps(review(hami_pod(), uid="slow"))) as resp:
                return resp.status, await resp.json()

        pending = asyncio.create_task(slow())
        await asyncio.sleep(0.2)  # the review is waiting on its template
        running.stop.set()
        status, answer = await pending
    assert status == 200
    assert answer["response"]["allowed"] is True
    assert decoded_patch(answer)
    await running.task  # the server is gone...
    with pytest.raises(aiohttp.ClientConnectorError):  # ...and accepts nothing new
        async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=running.ssl)) as session:
            await session.get(running.url + "/healthz")


def test_webhook_config_prints_both_configurations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = write_bundle(make_bundle(dns_names=["dra-gateway-webhook.dra-gateway.svc"]), tmp_path)
    assert main(["webhook-config", "--service", "dra-gateway/dra-gateway-webhook",
                 "--ca-file", str(paths.ca_cert)]) == 0
    out = capsys.readouterr().out
    # Every repeated part written in full, as kubectl users read and diff it: no anchors.
    assert "&id" not in out
    assert "*id" not in out
    mutating, validating = yaml.safe_load_all(out)
    assert mutating["kind"] == "MutatingWebhookConfiguration"
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    import base64
    assert base64.b64decode(mutating["webhooks"][0]["clientConfig"]["caBundle"]) == \
        paths.ca_cert.read_bytes()


@pytest.mark.parametrize(("argv", "error"), [
    (["webhook-config", "--service", "dra-gateway", "--ca-file", "x"],
     "argument --service: 'dra-gateway' is not NAMESPACE/NAME of the webhook's Service (two DNS "
     "labels), e.g. dra-gateway/dra-gateway-webhook"),
    (["webhook-config", "--service", "Bad NS/web", "--ca-file", "x"],
     "argument --service: 'Bad NS/web' is not NAMESPACE/NAME of the webhook's Service (two DNS "
     "labels), e.g. dra-gateway/dra-gateway-webhook"),
    (["webhook-config", "--service", "ns/web", "--ca-file", "x", "--port", "99999"],
     "argument --port: '99999' is not a port number from 1 to 65535"),
    (["webhook-config", "--service", "ns/web", "--ca-file", "x", "--namespace", "BAD NS"],
     "argument --namespace: 'BAD NS' is not a namespace name (a DNS label: lowercase letters, "
     "digits, '-')"),
    (["webhook", "--listen", "8443", "--tls-dir", "x"],
     "argument --listen: '8443' is not HOST:PORT, e.g. 0.0.0.0:8443 or [::]:8443"),
])
def test_bad_arguments_say_what_is_expected(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(error)


def test_webhook_without_certificates_says_how_to_make_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["webhook", "--listen", "127.0.0.1:0", "--tls-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: tls.crt and tls.key not found in --tls-dir {tmp_path}; create them with "
        f"`dra-gateway certs generate --out {tmp_path} --dns NAME`\n")


def _client_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A client CA (as the API server's admission kubeconfig would use) and a client pair."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from dra_gateway.certs.generate import make_ca

    ca_key, ca_cert = make_ca("api-server-client-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (tmp_path / "client-ca.crt", tmp_path / "client.crt", tmp_path / "client.key")
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


async def test_client_certificates_guard_admission_while_probes_answer_on_their_own_port(
    tmp_path: Path,
) -> None:
    import socket

    tls_dir = tmp_path / "tls"
    write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]), tls_dir)
    client_ca, client_cert, client_key = _client_pair(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        probe_port = probe.getsockname()[1]
    stop = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(
        WebhookSettings(tls_dir=tls_dir), ServeOptions(
            host="127.0.0.1", port=0, client_ca=client_ca, probe_host="127.0.0.1",
            probe_port=probe_port, shutdown_timeout=1), cluster=MemoryCluster(), stop=stop,
        started=port.set_result))
    try:
        url = f"https://localhost:{await asyncio.wait_for(asyncio.shield(port), 10)}"
        anonymous = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        with_cert = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
        with_cert.load_cert_chain(str(client_cert), str(client_key))
        async with aiohttp.ClientSession() as session:
            # Without a client certificate the handshake fails (or the first read, on TLS 1.3).
            with pytest.raises(aiohttp.ClientError):
                async with session.post(url + "/mutate", ssl=anonymous,
                                        data=orjson.dumps(review(hami_pod()))) as resp:
                    await resp.read()
            async with session.post(url + "/mutate", ssl=with_cert,
                                    data=orjson.dumps(review(hami_pod(), uid="c-1"))) as resp:
                assert (await resp.json())["response"]["uid"] == "c-1"
            for path, expected in (("/healthz", "ok\n"), ("/readyz", "ok\n")):
                async with session.get(f"http://127.0.0.1:{probe_port}{path}") as resp:
                    assert (resp.status, await resp.text()) == (200, expected)
            async with session.get(f"http://127.0.0.1:{probe_port}/metrics") as resp:
                assert ('dra_gateway_webhook_request_duration_seconds_count'
                        '{webhook_endpoint="mutate"} 1.0') in await resp.text()
            async with session.post(f"http://127.0.0.1:{probe_port}/mutate") as resp:
                assert resp.status in (404, 405)  # admission is never served in plain HTTP
    finally:
        stop.set()
        await task


def test_the_probe_listen_flag_parses() -> None:
    from dra_gateway.cli import build_parser

    args = build_parser().parse_args(["webhook", "--tls-dir", "/tls", "--probe-listen",
                                      "0.0.0.0:8080", "--client-ca", "/client-ca/ca.crt"])
    assert args.probe_listen == ("0.0.0.0", 8080)
