from __future__ import annotations

import datetime as dt
import ipaddress
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from dra_gateway.certs.generate import make_bundle, write_bundle
from dra_gateway.cli import main


def test_generate_writes_a_ca_and_a_serving_certificate_with_the_sans(tmp_path: Path) -> None:
    code = main(["certs", "generate", "--out", str(tmp_path / "tls"),
                 "--dns", "dra-gateway.dra-gateway.svc", "--dns", "localhost",
                 "--ip", "127.0.0.1", "--ip", "::1"])
    assert code == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "tls" / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["dra-gateway.dra-gateway.svc", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    now = dt.datetime.now(dt.UTC)
    assert cert.not_valid_before_utc < now
    assert dt.timedelta(days=89) < cert.not_valid_after_utc - now <= dt.timedelta(days=90)


def test_the_private_key_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    paths = write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    assert stat.S_IMODE(paths.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(paths.cert.stat().st_mode) == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_rewriting_a_bundle_replaces_the_files_in_place(tmp_path: Path) -> None:
    first = write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    before = first.cert.read_bytes()
    second = write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    assert second.cert.read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_generate_without_names_says_what_to_add(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "generate", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: give at least one --dns NAME or --ip ADDR for the certificate's subject "
        "alternative names, e.g. --dns dra-gateway.dra-gateway.svc\n")
    assert list(tmp_path.iterdir()) == []


def test_generate_with_a_bad_address_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "generate", "--out", str(tmp_path), "--ip", "10.0.0.300"]) == 2
    assert capsys.readouterr().err == (
        "error: --ip '10.0.0.300' is not an IP address: give an IPv4 or IPv6 address, "
        "or pass host names with --dns\n")


def test_generate_with_a_bad_dns_name_names_it_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "generate", "--out", str(tmp_path), "--dns", "svc.ns.svc",
                 "--dns", "bad name!"]) == 2
    assert capsys.readouterr().err == (
        "error: --dns 'bad name!' is not a DNS name: use letters, digits and '-' in "
        "labels separated by dots, e.g. dra-gateway.dra-gateway.svc; pass addresses with --ip\n")
    assert list(tmp_path.iterdir()) == []


def test_generate_accepts_a_wildcard_dns_name(tmp_path: Path) -> None:
    assert main(["certs", "generate", "--out", str(tmp_path), "--dns", "*.dra-gateway.svc"]) == 0


def test_the_ca_verifies_the_serving_certificate_with_openssl(tmp_path: Path) -> None:
    paths = write_bundle(make_bundle(dns_names=["localhost"]), tmp_path)
    try:
        result = subprocess.run(
            ["openssl", "verify", "-CAfile", str(paths.ca_cert), "-purpose", "sslserver",
             str(paths.cert)], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        pytest.skip("openssl command not installed")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("address", ["10.0.0.5", "::1"])
def test_generate_refuses_an_address_given_as_a_dns_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str
) -> None:
    # Go's crypto/x509 (the API server) matches an IP host against IP SANs only: a certificate
    # with the address as a DNS SAN would fail every handshake.
    assert main(["certs", "generate", "--out", str(tmp_path), "--dns", address]) == 2
    assert capsys.readouterr().err == (
        f"error: --dns '{address}' is an IP address, which clients only match against "
        f"IP SANs: pass it with --ip {address}\n")
    assert list(tmp_path.iterdir()) == []


def test_generate_refuses_a_validity_past_the_last_x509_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was an OverflowError traceback from the date arithmetic.
    assert main(["certs", "generate", "--out", str(tmp_path), "--dns", "svc.ns.svc",
                 "--ca-days", "99999999"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --ca-days 99999999 would end after 9999-12-31, the "
                          "last date a certificate can hold; give at most ")
    longest = int(err.rsplit(" ", 1)[1])
    assert list(tmp_path.iterdir()) == []
    assert main(["certs", "generate", "--out", str(tmp_path), "--dns", "svc.ns.svc",
                 "--days", str(longest), "--ca-days", str(longest)]) == 0


def test_generate_writes_nothing_when_a_file_it_must_replace_is_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ca.crt used to be replaced before tls.key failed: a new CA beside the old pair.
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--out", str(out), "--dns", "svc.ns.svc"]) == 0
    old_ca = (out / "ca.crt").read_bytes()
    (out / "tls.key").unlink()
    (out / "tls.key").mkdir()
    capsys.readouterr()

    assert main(["certs", "generate", "--out", str(out), "--dns", "svc.ns.svc",
                 "--force"]) == 1

    assert capsys.readouterr().err == (
        f"error: cannot write {out / 'tls.key'}: it exists and is not a file; remove "
        "it or choose another --out directory\n")
    assert (out / "ca.crt").read_bytes() == old_ca


def test_an_existing_ca_is_not_replaced_without_force(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    args = ["certs", "generate", "--out", str(tmp_path), "--dns", "w.ns.svc"]
    assert main(args) == 0
    first = (tmp_path / "ca.crt").read_bytes()
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'ca.crt'} exists; a new CA would not be "
                          "trusted by what trusts that one")
    assert "pass --force" in err
    assert (tmp_path / "ca.crt").read_bytes() == first
    assert main([*args, "--force"]) == 0
    assert (tmp_path / "ca.crt").read_bytes() != first
