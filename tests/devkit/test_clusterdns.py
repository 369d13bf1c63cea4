"""The real node's cluster DNS (dra_gateway.devkit.clusterdns), queried over UDP as a pod's
resolver queries it."""

from __future__ import annotations

import socket

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from dra_gateway.devkit.clusterdns import ClusterDNS

SERVICES = {("dra-gateway-webhook", "dra-gateway"): "10.0.0.17",
            ("headless", "dra-gateway"): "None"}


def _ask(port: int, name: str, qtype: int = dns.rdatatype.A) -> tuple[int, list[str]]:
    """The reply's rcode and the addresses of its A records, asked as a resolver asks."""
    reply = dns.query.udp(dns.message.make_query(name, qtype), "127.0.0.1", port=port,
                          timeout=5)
    assert reply.flags & dns.flags.AA
    return reply.rcode(), [r.address for rrset in reply.answer for r in rrset]


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
        # What is not a DNS query gets FORMERR, and the server goes on answering.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.sendto(b"\x12\x34not a query", ("127.0.0.1", port))
            refused = dns.message.from_wire(sock.recv(4096))
        assert (refused.id, refused.rcode()) == (0x1234, dns.rcode.FORMERR)
        assert _ask(port, "dra-gateway-webhook.dra-gateway.svc.cluster.local") == (
            0, ["10.0.0.17"])
