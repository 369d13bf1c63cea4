"""The cluster port: the only code in the project that talks to Kubernetes.

`port` defines the protocol and its errors; `kubernetes` adapts kubernetes-asyncio to the
protocol; `connect` picks a backend; `features` learns the API server's feature gates through
the port. The in-memory cluster and the embedded API server built on it are the simulator,
`dra_gateway.kube.sim`; production code never imports it (an import-linter contract), except
`connect`, whose `--cluster memory` choice hands out a fresh in-memory cluster.
"""

from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
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
    "NotFound",
    "ObjectList",
    "WatchEvent",
    "connect",
]
