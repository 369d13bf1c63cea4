"""The cluster port: the only code in the project that talks to Kubernetes.

`port` defines the protocol and its errors; `memory` is an in-memory cluster with Kubernetes
semantics; `server` serves that cluster over loopback HTTP; `kubernetes` adapts
kubernetes-asyncio to the protocol.
"""

from dra_gateway.kube.cluster.port import (
    AlreadyExists,
    ApiError,
    Cluster,
    Conflict,
    Expired,
    Invalid,
    NotFound,
    ObjectList,
    WatchEvent,
)

__all__ = [
    "AlreadyExists",
    "ApiError",
    "Cluster",
    "Conflict",
    "Expired",
    "Invalid",
    "NotFound",
    "ObjectList",
    "WatchEvent",
]
