"""TLS server contexts for the webhook and a reloader that swaps in a renewed certificate.

The API server keeps connections to a webhook open for a long time; a restart to pick up a
renewed certificate would drop them and fail admissions. `CertificateReloader` polls the
certificate and key files (mtime, inode, size: a Secret volume swaps a symlink, which changes the
inode) and loads the new pair into a *fresh* SSLContext; the context the server listens with has
an SNI callback that hands each new handshake the latest one (OpenSSL calls it for every
ClientHello, with or without a server name). Open connections keep the certificate they got.
inotify was rejected: it misses the symlink swap of Secret volumes on some kernels and adds a
dependency for a check that costs microseconds a second.

The pair is never loaded into the listening context itself: OpenSSL keeps one certificate per
key type in a context, so loading an RSA pair over an ECDSA one (or back) would add it beside
the old one, and handshakes would go on getting the old certificate until it expired.

A new pair that does not load (a key that does not match, a half-finished rotation on disk)
leaves the previous context serving; the state is not recorded, so it is retried at the next
poll. The certificate and key are read once, as one snapshot, for the check and the load.

This module must not talk to the cluster or know about webhooks.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from dra_gateway.certs.generate import CERT_FILE, KEY_FILE

log = logging.getLogger(__name__)


class TlsFilesError(ValueError):
    """The certificate, key or client CA files cannot be used; the message names them."""


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, ssl.SSLError):
        return exc.strerror
    return str(exc) or type(exc).__name__


def server_context(cert_file: Path, key_file: Path, *,
                   client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, the given pair, client certificates required when a
    client CA is given (the API server then presents the certificate named in its
    admission-control kubeconfig). Raises TlsFilesError naming the file that failed."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ValueError) as exc:
        raise TlsFilesError(
            f"cannot load the serving certificate {cert_file} with its key {key_file}: "
            f"{_reason(exc)}; write a matching PEM pair, e.g. with `dra-gateway certs "
            f"generate`") from None
    if client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=str(client_ca))
        except (OSError, ValueError) as exc:
            raise TlsFilesError(
                f"cannot load the client CA {client_ca}: {_reason(exc)}; pass a PEM file with "
                f"the CA of the API server's client certificate") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@dataclass(frozen=True, slots=True)
class _FileState:
    mtime_ns: int
    inode: int
    size: int


def _state(path: Path) -> _FileState | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _FileState(st.st_mtime_ns, st.st_ino, st.st_size)


def _fingerprint(cert_pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return hashlib.sha256(cert.tbs_certificate_bytes).hexdigest()[:16]


class CertificateReloader:
    """Keeps `context` serving the pair found in `cert_file` / `key_file`.

    `check()` reloads when the files changed and returns True when a new pair went live;
    `run()` polls forever (cancel it to stop). `loaded` says whether a pair is in place.
    """

    def __init__(self, context: ssl.SSLContext, cert_file: Path, key_file: Path, *,
                 client_ca: Path | None = None, interval: float = 2.0) -> None:
        self.context = context  # the one the server listens with; it never changes
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca = client_ca
        self.interval = interval
        self.loaded = False
        self.fingerprint: str | None = None
        self.reloads = 0
        self.failures = 0
        self._seen: tuple[_FileState | None, _FileState | None] | None = None
        self._current = context
        context.sni_callback = self._select

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None,
                context: ssl.SSLContext) -> None:
        # During the ClientHello: the handshake goes on with the latest pair. The protocol
        # bounds and the verify mode stay those of the listening context; the client CA store
        # is the new context's, which loaded the same client CA.
        current = self._current
        if current is not context:
            ssl_object.context = current

    @classmethod
    def from_dir(cls, tls_dir: Path, *, client_ca: Path | None = None,
                 interval: float = 2.0) -> CertificateReloader:
        """A context loaded from `tls.crt` / `tls.key` in `tls_dir`, with its reloader."""
        cert, key = tls_dir / CERT_FILE, tls_dir / KEY_FILE
        ctx = server_context(cert, key, client_ca=client_ca)
        reloader = cls(ctx, cert, key, client_ca=client_ca, interval=interval)
        reloader.loaded = True
        reloader._seen = (_state(cert), _state(key))
        reloader.fingerprint = _fingerprint(cert.read_bytes())
        return reloader

    def check(self) -> bool:
        seen = (_state(self.cert_file), _state(self.key_file))
        if seen == self._seen or None in seen:
            return False
        try:
            cert_pem = self.cert_file.read_bytes()
            key_pem = self.key_file.read_bytes()
            self._load_snapshot(cert_pem, key_pem)
        except (OSError, ssl.SSLError, ValueError) as exc:
            # Typically a rotation caught between writing the key and the certificate: keep
            # serving the old pair and look again at the next poll (the state is not recorded).
            self.failures += 1
            log.warning("certificate reload failed, still serving the previous one",
                        extra={"cert_file": str(self.cert_file), "error": str(exc)})
            return False
        self._seen = seen
        self.loaded = True
        self.reloads += 1
        self.fingerprint = _fingerprint(cert_pem)
        log.info("serving certificate reloaded",
                 extra={"cert_file": str(self.cert_file), "fingerprint": self.fingerprint})
        return True

    def _load_snapshot(self, cert_pem: bytes, key_pem: bytes) -> None:
        # load_cert_chain only reads paths: the snapshot goes to private temporary files so that
        # what is loaded is exactly what was read.
        with tempfile.TemporaryDirectory(prefix="dra-gateway-tls-") as tmp:
            cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            fresh = server_context(cert_path, key_path, client_ca=self.client_ca)
        self._current = fresh

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            # File reads and a PEM parse take well under a millisecond: no executor needed.
            self.check()
