"""A cluster DNS for the real node (`RealNode(cluster_dns=...)`): what CoreDNS does in a cluster,
reduced to what the chart's pods need.

The kubelet points each pod's resolv.conf at it (`clusterDNS`, with the search path of
`clusterDomain`); it answers `SERVICE.NAMESPACE.svc.CLUSTER_DOMAIN` with the Service's cluster IP,
read from the API server at each query (`lookup`), so a pod reaches a Service by name, e.g. the
chart's `helm test` pod the webhook's `dra-gateway-webhook.dra-gateway.svc`. Any other name is
NXDOMAIN (the node has no way out); an existing Service without an address of that family (AAAA,
or a headless Service) is an empty answer. UDP only: the answers are small.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Callable

# service, namespace -> the Service's cluster IP; None when there is no such Service (or it has
# no cluster IP).
Lookup = Callable[[str, str], "str | None"]

TYPE_A = 1
CLASS_IN = 1
NOERROR, FORMERR, NXDOMAIN, NOTIMP = 0, 1, 3, 4
TTL_S = 5


def _question(message: bytes) -> tuple[str, int, int, int]:
    """The first question's name (lower case, no trailing dot), type, class and where it ends."""
    labels: list[str] = []
    at = 12
    while True:
        length = message[at]
        if length & 0xC0:
            raise ValueError("a compressed name in a question")
        at += 1
        if length == 0:
            break
        labels.append(message[at:at + length].decode("ascii").lower())
        at += length
    qtype, qclass = struct.unpack_from("!HH", message, at)
    return ".".join(labels), qtype, qclass, at + 4


def answer(message: bytes, lookup: Lookup, domain: str = "cluster.local") -> bytes:
    """The reply to one DNS query `message`."""
    ident, flags, qdcount = struct.unpack_from("!HHH", message)
    opcode = (flags >> 11) & 0xF
    reply = 0x8000 | 0x0400 | (flags & 0x0100) | 0x0080 | (opcode << 11)  # QR AA RD RA
    if opcode != 0 or qdcount != 1:
        return struct.pack("!HHHHHH", ident, reply | NOTIMP, 0, 0, 0, 0)
    try:
        name, qtype, qclass, end = _question(message)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        return struct.pack("!HHHHHH", ident, reply | FORMERR, 0, 0, 0, 0)
    question = message[12:end]
    parts = name.split(".")
    suffix = ["svc", *domain.split(".")]
    address = None
    rcode = NXDOMAIN
    if len(parts) == 2 + len(suffix) and parts[2:] == suffix:
        found = lookup(parts[0], parts[1])
        if found is not None:
            rcode = NOERROR
            with contextlib.suppress(ValueError):
                ip = ipaddress.ip_address(found)
                if ip.version == 4 and qtype == TYPE_A and qclass == CLASS_IN:
                    address = ip.packed
    records = b""
    if address is not None:
        # The name: a pointer to the question's (offset 12).
        records = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL_S, 4) + address
    return struct.pack("!HHHHHH", ident, reply | rcode, 1, 1 if records else 0, 0, 0) \
        + question + records


class ClusterDNS:
    """A DNS server on `host`:`port` (UDP) answering for the cluster's Services."""

    def __init__(self, host: str, lookup: Lookup, port: int = 53,
                 domain: str = "cluster.local") -> None:
        self.host, self.port, self.domain = host, port, domain
        self._lookup = lookup
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((self.host, self.port))
        sock.settimeout(0.2)
        self._socket = sock
        self._thread = threading.Thread(target=self._serve, name="cluster-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sock = self._socket
        while sock is not None and self._socket is sock:
            try:
                message, peer = sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(message) < 12:
                continue
            try:
                reply = answer(message, self._answerable_lookup, self.domain)
            except Exception:  # a bad query never stops the server
                continue
            with contextlib.suppress(OSError):
                sock.sendto(reply, peer)

    def _answerable_lookup(self, service: str, namespace: str) -> str | None:
        try:
            return self._lookup(service, namespace)
        except Exception:
            return None

    def stop(self) -> None:
        sock, self._socket = self._socket, None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if sock is not None:
            sock.close()

    def __enter__(self) -> ClusterDNS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
