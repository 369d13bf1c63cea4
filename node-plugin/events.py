"""Events about the node plugin's Node: a device that turned unhealthy (what hit it, what that
does to it) and one that is healthy again (and why), where `kubectl describe node` and event
exporters show them. Node Events live in the `default` namespace and name the Node as the
kubelet's own do. Events are advice: a failed write is logged, never raised.

The plugin writes Events in `default` only, and only about its own Node: `record` writes
nothing else (a caller that asks for another namespace or object is a bug, and is refused), so
the chart can grant `events: create` in `default` alone and an admission policy can hold the
plugin to its Node.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import EVENTS

log = logging.getLogger(__name__)

COMPONENT = "dra-gateway-node-plugin"
NAMESPACE = "default"  # where Events about cluster-scoped objects such as Nodes go
_MAX_MESSAGE = 1024


def node_event(node: str, *, type_: str, reason: str, message: str, instance: str,
               stamp: str | None = None) -> Object:
    """A core/v1 Event about Node `node` (count 1)."""
    stamp = stamp or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{node}.{time.time_ns():x}", "namespace": NAMESPACE},
        # The kubelet names its Node by name as the uid, so `kubectl describe node` finds both.
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
        "reason": reason, "message": message[:_MAX_MESSAGE], "type": type_,
        "source": {"component": COMPONENT, "host": node}, "reportingComponent": COMPONENT,
        "reportingInstance": instance, "firstTimestamp": stamp, "lastTimestamp": stamp,
        "count": 1,
    }


async def record(cluster: Cluster, event: Object, *, node: str) -> None:
    """Write the Event about Node `node` (the plugin's own); a refusal is logged (the chart
    grants `events: create` in `default`). An Event in another namespace, or about another
    object, is refused with ValueError before anything is sent."""
    metadata = event.get("metadata") or {}
    involved = event.get("involvedObject") or {}
    if metadata.get("namespace") != NAMESPACE or involved.get("kind") != "Node" or (
            involved.get("name") != node) or involved.get("namespace"):
        raise ValueError(f"the node plugin records Events about its Node {node} in namespace "
                         f"{NAMESPACE} only, not about {involved.get('kind')} "
                         f"{involved.get('name')} in namespace {metadata.get('namespace')}")
    try:
        await cluster.create(EVENTS, event, namespace=NAMESPACE)
    except ApiError as exc:
        log.warning("could not record Event %s on Node %s: %s (%s)", event["reason"],
                    event["involvedObject"]["name"], exc.message, exc.reason)
