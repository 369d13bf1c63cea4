"""A certificate authority and a serving certificate for the webhook, written to a directory.

The API server calls the webhook over TLS and checks its certificate against the `caBundle` of
the webhook configuration, so a deployment needs a CA and a serving certificate whose SANs name
the Service (`NAME.NS.svc`). This module makes both with `cryptography` (ECDSA P-256: small,
fast handshakes, accepted by every Go TLS stack the API server uses) and writes `ca.crt`,
`tls.crt` and `tls.key` atomically, the key readable by its owner only.

It must not talk to the cluster: injecting the CA into webhook configurations is the webhook's
job, through the cluster port.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dra_gateway.kube.files import atomic_write

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"

DEFAULT_CA_DAYS = 3650
DEFAULT_SERVING_DAYS = 90  # cert-manager's default lifetime; the CA lives longer
# Clocks across a cluster drift; a certificate valid from "now" is refused by a peer a few
# seconds behind.
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Bundle:
    """PEM bytes of a CA certificate, a serving certificate and its private key."""

    ca_cert: bytes
    cert: bytes
    key: bytes


@dataclass(frozen=True, slots=True)
class BundlePaths:
    ca_cert: Path
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _parse_ips(ips: Iterable[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    parsed = []
    for value in ips:
        try:
            parsed.append(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(
                f"--ip {value!r} is not an IP address: give an IPv4 or IPv6 address, "
                f"or pass host names with --dns"
            ) from None
    return parsed


_DNS_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?$")


def _check_dns_names(dns_names: Iterable[str]) -> None:
    # A name the TLS clients can never match would only show up as a handshake failure of the
    # API server, far from its cause.
    for value in dns_names:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            pass
        else:
            # TLS clients match an address only against IP SANs: a DNS SAN of 10.0.0.5 never
            # verifies a connection to https://10.0.0.5.
            raise ValueError(f"--dns {value!r} is an IP address, which clients only match "
                             f"against IP SANs: pass it with --ip {value}")
        labels = value.split(".")
        if labels[0] == "*" and len(labels) > 1:
            labels = labels[1:]  # a wildcard for one label, as in *.dra-gateway.svc
        if len(value) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
            raise ValueError(
                f"--dns {value!r} is not a DNS name: use letters, digits and '-' in labels "
                f"separated by dots, e.g. dra-gateway.dra-gateway.svc; pass addresses with --ip"
            )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """What an EC key may do: sign; a CA's also signs certificates and revocation lists."""
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )


def make_ca(common_name: str = "dra-gateway-ca", *, days: int = DEFAULT_CA_DAYS,
            now: dt.datetime | None = None) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA allowed to sign serving certificates only (path length 0)."""
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def make_serving_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    days: int = DEFAULT_SERVING_DAYS,
    now: dt.datetime | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate signed by the CA whose SANs are the given names and addresses."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one --dns name or --ip address")
    _check_dns_names(dns_names)
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in _parse_ips(ip_addresses)]
    common_name = dns_names[0] if dns_names else str(ip_addresses[0])
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_bundle(*, dns_names: Sequence[str], ip_addresses: Sequence[str] = (),
                days: int = DEFAULT_SERVING_DAYS, ca_days: int = DEFAULT_CA_DAYS) -> Bundle:
    """A fresh CA and a serving certificate it signed, as PEM."""
    ca_key, ca_cert = make_ca(days=ca_days)
    key, cert = make_serving_cert(ca_key, ca_cert, dns_names=dns_names,
                                  ip_addresses=ip_addresses, days=days)
    return Bundle(
        ca_cert=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_key_pem(key),
    )


def write_bundle(bundle: Bundle, out_dir: Path) -> BundlePaths:
    """Write `ca.crt`, `tls.crt` and `tls.key` (0600) into `out_dir`, creating it if needed.

    The key is written before the certificate: a reloader that sees the new certificate then
    finds its key already in place.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = BundlePaths(out_dir / CA_FILE, out_dir / CERT_FILE, out_dir / KEY_FILE)
    atomic_write(paths.ca_cert, bundle.ca_cert)
    atomic_write(paths.key, bundle.key, mode=0o600)
    atomic_write(paths.cert, bundle.cert)
    return paths
