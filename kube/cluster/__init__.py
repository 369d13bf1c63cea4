"""The cluster port: the only code in the project that talks to Kubernetes.

`port` defines the protocol and its errors; `memory` is an in-memory cluster with Kubernetes
semantics (`selectors` parses label and field selectors); `server` serves any cluster over
loopback HTTP as the Kubernetes API, calling registered webhooks through `admission`;
`controlplane` stands in for the claim controller and scheduler the embedded default lacks;
`kubernetes` adapts kubernetes-asyncio to the protocol; `connect` picks a backend.
"""

from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
from dra_gateway.kube.cluster.memory import MemoryCluster
from dra_gateway.kube.cluster.port import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Cluster,
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    NotFound,
    ObjectList,
    WatchEvent,
)

__all__ = [
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "Cluster",
    "ClusterConfigError",
    "Conflict",
    "Expired",
    "Forbidden",
    "Invalid",
    "MemoryCluster",
    "NotFound",
    "ObjectList",
    "WatchEvent",
    "connect",
]
