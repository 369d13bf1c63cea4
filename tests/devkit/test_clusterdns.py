"""The real node's cluster DNS (dra_gateway.devkit.clusterdns), queried over UDP as a pod's
resolver queries it."""

from __future__ import annotations

import socket
import struct

from dra_gateway.devkit.clusterdns import ClusterDNS

SERVICES = {("dra-gateway-webhook", "dra-gateway"): "10.0.0.17",
            ("headless", "dra-gateway"): "None"}


def _query(name: str, qtype: int = 1) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + labels + b"\0" \
        + struct.pack("!HH", qtype, 1)


def _ask(port: int, name: str, qtype: int = 1) -> tuple[int, list[str]]:
    """The reply's rcode and the addresses of its A records."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(_query(name, qtype), ("127.0.0.1", port))
        reply = sock.recv(4096)
    ident, flags, qdcount, ancount = struct.unpack_from("!HHHH", reply)
    assert (ident, qdcount, flags & 0x8000) == (0x1234, 1, 0x8000)
    at = len(_query(name, qtype))
    addresses = []
    for _ in range(ancount):
        _, rtype, _, _, length = struct.unpack_from("!HHHIH", reply, at)
        at += 12
        assert rtype == 1
        addresses.append(socket.inet_ntoa(reply[at:at + length]))
        at += length
    return flags & 0xF, addresses


def test_a_service_resolves_to_its_cluster_ip_and_other_names_do_not() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with ClusterDNS("127.0.0.1", lambda s, n: SERVICES.get((s, n)), port=port):
        assert _ask(port, "dra-gateway-webhook.dra-gateway.svc.cluster.local") == (
            0, ["10.0.0.17"])
        assert _ask(port, "DRA-Gateway-Webhook.dra-gateway.svc.cluster.local") == (
            0, ["10.0.0.17"])
        # AAAA of an existing Service, or a headless one: no record, but the name exists.
        assert _ask(port, "dra-gateway-webhook.dra-gateway.svc.cluster.local", 28) == (0, [])
        assert _ask(port, "headless.dra-gateway.svc.cluster.local") == (0, [])
        # A search-path try, an unknown Service, a name outside the cluster.
        assert _ask(port, "dra-gateway-webhook.dra-gateway.svc.dra-gateway.svc.cluster.local"
                    ) == (3, [])
        assert _ask(port, "other.dra-gateway.svc.cluster.local") == (3, [])
        assert _ask(port, "example.com") == (3, [])
