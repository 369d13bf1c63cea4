"""The cluster port: the only code in the project that talks to Kubernetes.

`port` defines the protocol and its errors; `kubernetes` adapts kubernetes-asyncio to the
protocol; `connect` picks a backend; `features` learns the API server's feature gates through
the port; `clock` reads the API server's time, for commands run off the cluster. The in-memory
cluster and the embedded API server built on it are the simulator, `dra_gateway.devkit.sim`,
which production code never imports (an import-linter contract): the `dra-gateway` command hands
`connect` its factory for `--cluster memory` (`offer_memory`).
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
