"""One way for every component to obtain its `Cluster`: a real API or a fresh in-memory one.

Components call `connect` from their command-line handlers; libraries take a `Cluster` as an
argument instead, so tests hand them a `MemoryCluster`. This module must stay light to import:
the client library is imported only when a real API is asked for.
"""

from __future__ import annotations

import os
from typing import Literal

from dra_gateway.kube.cluster.port import Cluster


class ClusterConfigError(Exception):
    """The cluster to connect to could not be configured (no kubeconfig, bad file...)."""


def _is_file(path: str) -> bool:
    return os.path.isfile(path)


async def connect(kind: Literal["kube", "memory"], kubeconfig: str | None = None) -> Cluster:
    """A `Cluster` of `kind`.

    "memory": a new, empty in-memory cluster (the embedded default's backing store).
    "kube": the API named by `kubeconfig`; without one, the pod's service account when running
    in a cluster, else $KUBECONFIG or ~/.kube/config.
    """
    if kind == "memory":
        from dra_gateway.kube.cluster.memory import MemoryCluster

        return MemoryCluster()
    if kind != "kube":
        raise ClusterConfigError(f'unknown cluster kind "{kind}": use "kube" or "memory"')
    from kubernetes_asyncio.config import ConfigException

    from dra_gateway.kube.cluster.kubernetes import KubernetesCluster

    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return KubernetesCluster.in_cluster()
        if kubeconfig is not None and not _is_file(kubeconfig):
            raise ClusterConfigError(
                f"kubeconfig {kubeconfig} does not exist: pass the file written by "
                "`dra-gateway cluster serve --kubeconfig FILE` or a real cluster's kubeconfig")
        return await KubernetesCluster.from_kubeconfig(kubeconfig)
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ClusterConfigError(f"cannot load the kubeconfig {where}: {exc}; pass "
                                 "--kubeconfig with a valid file") from None
