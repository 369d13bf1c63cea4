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
import threading
from collections.abc import Callable

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

# service, namespace -> the Service's cluster IP; None when there is no such Service (or it has
# no cluster IP).
Lookup = Callable[[str, str], "str | None"]

TTL_S = 5


def answer(wire: bytes, lookup: Lookup, domain: str = "cluster.local") -> bytes:
    """The reply to one DNS query (its wire format), read and written with dnspython."""
    try:
        query = dns.message.from_wire(wire)
    except dns.exception.DNSException:
        # Not a query dnspython can read: FORMERR, with the header's id where there is one.
        ident = int.from_bytes(wire[:2], "big") if len(wire) >= 2 else 0
        refused = dns.message.Message(id=ident)
        refused.flags |= dns.flags.QR
        refused.set_rcode(dns.rcode.FORMERR)
        return refused.to_wire()
    reply = dns.message.make_response(query)
    reply.flags |= dns.flags.AA | dns.flags.RA
    if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
        reply.set_rcode(dns.rcode.NOTIMP)
        return reply.to_wire()
    [question] = query.question
    zone = dns.name.from_text(f"svc.{domain}")
    rcode = dns.rcode.NXDOMAIN
    name = question.name
    relative = name.relativize(zone).labels if name.is_subdomain(zone) else ()
    if len(relative) == 2:
        service, namespace = (label.decode("ascii", "replace").lower() for label in relative)
        found = lookup(service, namespace)
        if found is not None:
            rcode = dns.rcode.NOERROR  # the name exists, whatever its records
            with contextlib.suppress(ValueError):
                if (ipaddress.ip_address(found).version == 4
                        and question.rdtype == dns.rdatatype.A
                        and question.rdclass == dns.rdataclass.IN):
                    reply.answer.append(dns.rrset.from_text(name, TTL_S, "IN", "A", found))
    reply.set_rcode(rcode)
    return reply.to_wire()


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
