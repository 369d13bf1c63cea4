from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
import warnings
from collections.abc import AsyncIterator
from ipaddress import ip_address
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dra_gateway.certs.generate import make_bundle, make_ca, write_bundle
from dra_gateway.certs.tls import CertificateReloader, TlsFilesError, server_context


async def _hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


@contextlib.asynccontextmanager
async def _serving(ctx: ssl.SSLContext) -> AsyncIterator[int]:
    """An HTTPS server answering "hello" on loopback with `ctx`; yields its port."""
    app = web.Application()
    app.router.add_get("/", _hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[CertificateReloader, int]]:
    write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]), tmp_path)
    reloader = CertificateReloader.from_dir(tmp_path, interval=0.05)
    async with _serving(reloader.context) as port:
        yield reloader, port


def _client_pair(ca_file: Path, out: Path) -> tuple[Path, Path]:
    """A clientAuth certificate signed by a fresh CA written over `ca_file`."""
    ca_key, ca_cert = make_ca("client-ca")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path, key_path = out / "client.crt", out / "client.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _client_context(*ca_files: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    for ca in ca_files:
        ctx.load_verify_locations(cafile=str(ca))
    return ctx


async def _connect(port: int, ctx: ssl.SSLContext
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                   server_hostname="localhost")
    peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return reader, writer, peer


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return head.split(b"\r\n")[0] + b" " + await reader.readexactly(length)


async def _connect_and_get(port: int, ctx: ssl.SSLContext) -> bytes:
    reader, writer, _ = await _connect(port, ctx)
    try:
        return await _get(reader, writer)
    finally:
        writer.close()


async def test_a_certificate_swapped_on_disk_is_served_without_a_restart(
    served: tuple[CertificateReloader, int], tmp_path: Path
) -> None:
    reloader, port = served
    old_ca = tmp_path / "old-ca.crt"
    old_ca.write_bytes((tmp_path / "ca.crt").read_bytes())
    old_cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes()).public_bytes(
        serialization.Encoding.DER)

    reader, writer, peer = await _connect(port, _client_context(old_ca))
    assert peer == old_cert
    assert await _get(reader, writer) == b"HTTP/1.1 200 OK hello"

    write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]), tmp_path)
    task = asyncio.create_task(reloader.run())
    try:
        for _ in range(100):
            if reloader.reloads:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert reloader.reloads == 1

    new_reader, new_writer, new_peer = await _connect(
        port, _client_context(old_ca, tmp_path / "ca.crt"))
    assert new_peer != old_cert
    assert new_peer == x509.load_pem_x509_certificate(
        (tmp_path / "tls.crt").read_bytes()).public_bytes(
            serialization.Encoding.DER)
    assert await _get(new_reader, new_writer) == b"HTTP/1.1 200 OK hello"
    # The connection opened before the swap is still alive and answering.
    assert await _get(reader, writer) == b"HTTP/1.1 200 OK hello"
    for w in (writer, new_writer):
        w.close()
        await w.wait_closed()


async def test_a_half_written_rotation_keeps_the_old_certificate(
    served: tuple[CertificateReloader, int], tmp_path: Path
) -> None:
    reloader, port = served
    before = reloader.fingerprint
    other = make_bundle(dns_names=["localhost"])
    # The key of a new pair lands first; the certificate still belongs to the old key.
    (tmp_path / "tls.key").write_bytes(other.key)
    assert reloader.check() is False
    assert reloader.failures == 1
    assert reloader.fingerprint == before
    reader, writer, _ = await _connect(port, _client_context(tmp_path / "ca.crt"))
    assert await _get(reader, writer) == b"HTTP/1.1 200 OK hello"
    writer.close()
    await writer.wait_closed()
    # Once the certificate follows, the pair goes live.
    (tmp_path / "tls.crt").write_bytes(other.cert)
    assert reloader.check() is True
    assert reloader.fingerprint != before


def test_unchanged_files_are_not_reloaded(tmp_path: Path) -> None:
    write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    reloader = CertificateReloader.from_dir(tmp_path)
    assert reloader.check() is False
    assert (reloader.reloads, reloader.failures) == (0, 0)


async def test_tls_older_than_1_2_is_refused(
    served: tuple[CertificateReloader, int], tmp_path: Path
) -> None:
    _, port = served
    ctx = _client_context(tmp_path / "ca.crt")
    with warnings.catch_warnings():
        # Setting a TLS 1.1 bound is deprecated, which is the point of the test.
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    except ssl.SSLError:
        pytest.skip("this OpenSSL cannot even offer TLS 1.1")
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await _connect(port, ctx)


async def test_a_client_certificate_is_required_when_a_client_ca_is_given(
    tmp_path: Path,
) -> None:
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    server = write_bundle(make_bundle(dns_names=["localhost"]), server_dir)
    client = write_bundle(make_bundle(dns_names=["unused"]), client_dir)
    client_cert, client_key = _client_pair(client.ca_cert, client_dir)
    ctx = server_context(server.cert, server.key, client_ca=client.ca_cert)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    async with _serving(ctx) as port:
        anonymous = _client_context(server.ca_cert)
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
            await _connect_and_get(port, anonymous)
        # A client without a certificate gets no answer; one with a certificate from the client
        # CA is served.
        with_cert = _client_context(server.ca_cert)
        with_cert.load_cert_chain(client_cert, client_key)
        reader, writer, _ = await _connect(port, with_cert)
        assert await _get(reader, writer) == b"HTTP/1.1 200 OK hello"
        writer.close()
        await writer.wait_closed()


def test_a_broken_certificate_names_its_files_and_the_fix(tmp_path: Path) -> None:
    write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    (tmp_path / "tls.crt").write_text("not a certificate\n")
    with pytest.raises(TlsFilesError) as raised:
        CertificateReloader.from_dir(tmp_path)
    assert str(raised.value).startswith(
        f"cannot load the serving certificate {tmp_path / 'tls.crt'} with its key "
        f"{tmp_path / 'tls.key'}: ")
    assert str(raised.value).endswith(
        "; write a matching PEM pair, e.g. with `dra-gateway certs generate`")


def test_a_missing_client_ca_names_the_file(tmp_path: Path) -> None:
    write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    with pytest.raises(TlsFilesError) as raised:
        CertificateReloader.from_dir(tmp_path, client_ca=tmp_path / "gone.crt")
    assert str(raised.value) == (
        f"cannot load the client CA {tmp_path / 'gone.crt'}: No such file or directory; pass a "
        "PEM file with the CA of the API server's client certificate")


def _write_rsa_pair(out: Path) -> bytes:
    """Write an RSA serving pair for localhost (as Helm's genSignedCert or a corporate CA
    issues) over tls.crt / tls.key, its CA into ca.crt; the certificate's DER."""
    ca_key, ca_cert = make_ca("rsa-ca")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (out / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (out / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                    serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    (out / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert.public_bytes(serialization.Encoding.DER)


async def _peer_without_sni(port: int, ca_file: Path) -> bytes:
    ctx = _client_context(ca_file)
    ctx.check_hostname = False  # an IP address and no server name: no SNI extension is sent
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    peer: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return peer


@pytest.mark.parametrize("first", ["ecdsa", "rsa"])
async def test_a_certificate_of_another_key_type_replaces_the_old_one(
    tmp_path: Path, first: str
) -> None:
    # OpenSSL keeps one certificate per key type in a context: loading an RSA pair into the
    # context that served an ECDSA one (or back) used to leave the old certificate served.
    if first == "ecdsa":
        write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]), tmp_path)
    else:
        _write_rsa_pair(tmp_path)
    reloader = CertificateReloader.from_dir(tmp_path)
    async with _serving(reloader.context) as port:
        if first == "ecdsa":
            new_cert = _write_rsa_pair(tmp_path)
        else:
            paths = write_bundle(make_bundle(dns_names=["localhost"],
                                             ip_addresses=["127.0.0.1"]), tmp_path)
            new_cert = x509.load_pem_x509_certificate(paths.cert.read_bytes()).public_bytes(
                serialization.Encoding.DER)
        assert reloader.check() is True
        reader, writer, peer = await _connect(port, _client_context(tmp_path / "ca.crt"))
        assert peer == new_cert
        assert await _get(reader, writer) == b"HTTP/1.1 200 OK hello"
        writer.close()
        await writer.wait_closed()
        assert await _peer_without_sni(port, tmp_path / "ca.crt") == new_cert


async def test_client_certificates_are_still_required_after_a_reload(tmp_path: Path) -> None:
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    write_bundle(make_bundle(dns_names=["localhost"]), server_dir)
    client_dir.mkdir()
    client_ca = client_dir / "client-ca.crt"
    client_cert, client_key = _client_pair(client_ca, client_dir)
    reloader = CertificateReloader.from_dir(server_dir, client_ca=client_ca)
    async with _serving(reloader.context) as port:
        renewed = write_bundle(make_bundle(dns_names=["localhost"]), server_dir)
        assert reloader.check() is True
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
            await _connect_and_get(port, _client_context(renewed.ca_cert))
        with_cert = _client_context(renewed.ca_cert)
        with_cert.load_cert_chain(client_cert, client_key)
        assert await _connect_and_get(port, with_cert) == b"HTTP/1.1 200 OK hello"
        # A certificate from another CA is refused by the renewed context too.
        other_ca = client_dir / "other-ca.crt"
        other_cert, other_key = _client_pair(other_ca, client_dir)
        with_other = _client_context(renewed.ca_cert)
        with_other.load_cert_chain(other_cert, other_key)
        with pytest.raises((ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError)):
            await _connect_and_get(port, with_other)
