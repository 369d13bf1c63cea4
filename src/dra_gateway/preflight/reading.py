"""What `dra-gateway preflight` reads from a cluster, as plain data (`Facts`).

Only reads: lists and gets through the cluster port, and the dry-run probe slices of
`kube/cluster/features.py` (the components' own detection, which stores nothing). What cannot
be read (a type the API does not serve, a read the credentials may not make) is recorded as
unknown with the reason, never raised: a preflight says what it could not see. It must not
judge what it read (`checks.py` does).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.features import (
    detect_consumable_capacity,
    detect_device_taints,
    detect_partitionable_devices,
)
from dra_gateway.kube.cluster.port import ApiError, Cluster, Discovery, NotFound, Object
from dra_gateway.kube.resources import DAEMON_SETS, NODES, PODS, SECRETS, ResourceType

CRDS: Final = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions",
                           "CustomResourceDefinition", namespaced=False)
CHART_NAME: Final = "dra-gateway"
NODE_PLUGIN_SELECTOR: Final = (f"app.kubernetes.io/name={CHART_NAME},"
                               "app.kubernetes.io/component=node-plugin")
# The CRDs the chart's optional objects need: kind -> CRD name.
MONITORING_CRDS: Final = {"PodMonitor": "podmonitors.monitoring.coreos.com",
                          "PrometheusRule": "prometheusrules.monitoring.coreos.com"}
CERT_MANAGER_CRDS: Final = {"Certificate": "certificates.cert-manager.io",
                            "Issuer": "issuers.cert-manager.io"}
FEATURES: Final = ("DRAConsumableCapacity", "DRADeviceTaints", "DRAPartitionableDevices")


@dataclass
class Facts:
    """Everything the checks judge; None where it could not be read, with why in `unread`."""

    namespace: str
    version: Mapping[str, Any] | None = None
    served: Mapping[str, list[str]] | None = None
    features: dict[str, bool | None] = field(default_factory=dict)
    nodes: list[Object] = field(default_factory=list)
    node_plugin: Object | None = None  # the chart's DaemonSet, where installed
    release: Mapping[str, Any] | None = None  # the installed release's name and merged values
    crds: dict[str, bool | None] = field(default_factory=dict)
    daemon_sets: list[Object] | None = None  # every namespace's, for legacy plugins
    pods: list[Object] | None = None
    unread: dict[str, str] = field(default_factory=dict)  # what -> why it was not read

    @property
    def chart_installed(self) -> bool:
        return self.node_plugin is not None or self.release is not None


def _why(exc: ApiError) -> str:
    return f"{exc.reason}: {exc.message}"


async def read_facts(cluster: Cluster, *, namespace: str) -> Facts:
    """Read what the checks need. The nodes must be readable (an ApiError otherwise, the
    command's to report); anything else missing is recorded in `unread`."""
    facts = Facts(namespace=namespace)
    if isinstance(cluster, Discovery):
        try:
            facts.version = await cluster.server_version()
            facts.served = await cluster.served_versions()
        except ApiError as exc:
            facts.unread["discovery"] = _why(exc)
    else:
        facts.unread["discovery"] = "this cluster connection does not serve discovery"
    facts.nodes = (await cluster.list(NODES)).items
    if facts.served is None or "v1" in facts.served.get("resource.k8s.io", ()):
        facts.features = await _features(cluster, facts)
    facts.node_plugin = await _first(cluster, DAEMON_SETS, facts, "node plugin DaemonSet",
                                     namespace=namespace, label_selector=NODE_PLUGIN_SELECTOR)
    facts.release = await _release(cluster, facts)
    for crd in (*MONITORING_CRDS.values(), *CERT_MANAGER_CRDS.values()):
        facts.crds[crd] = await _exists(cluster, CRDS, crd, facts)
    facts.daemon_sets = await _items(cluster, DAEMON_SETS, facts, "DaemonSets")
    facts.pods = await _items(cluster, PODS, facts, "pods")
    return facts


async def _features(cluster: Cluster, facts: Facts) -> dict[str, bool | None]:
    found: dict[str, bool | None] = dict.fromkeys(FEATURES)
    try:
        found["DRAConsumableCapacity"], _ = await detect_consumable_capacity(cluster)
    except ApiError as exc:
        facts.unread["DRAConsumableCapacity"] = _why(exc)
    try:
        found["DRADeviceTaints"] = await detect_device_taints(cluster)
        found["DRAPartitionableDevices"] = await detect_partitionable_devices(cluster)
    except ApiError as exc:  # the probes catch refusals; this is the API gone
        facts.unread["feature probes"] = _why(exc)
    return found


async def _items(cluster: Cluster, rt: ResourceType, facts: Facts, what: str, *,
                 namespace: str | None = None,
                 label_selector: str | None = None) -> list[Object] | None:
    try:
        return (await cluster.list(rt, namespace=namespace, label_selector=label_selector)).items
    except ApiError as exc:
        facts.unread[what] = _why(exc)
        return None


async def _first(cluster: Cluster, rt: ResourceType, facts: Facts, what: str, *,
                 namespace: str, label_selector: str) -> Object | None:
    found = await _items(cluster, rt, facts, what, namespace=namespace,
                         label_selector=label_selector)
    return sorted(found, key=objects.name)[0] if found else None


async def _exists(cluster: Cluster, rt: ResourceType, name: str, facts: Facts) -> bool | None:
    try:
        await cluster.get(rt, name)
    except NotFound:
        return False
    except ApiError as exc:
        facts.unread[name] = _why(exc)
        return None
    return True


async def _release(cluster: Cluster, facts: Facts) -> Mapping[str, Any] | None:
    """The deployed release of the chart in the namespace: its name and values (the chart's
    defaults under what was set), from the Secret helm keeps it in."""
    secrets = await _items(cluster, SECRETS, facts, "helm release", namespace=facts.namespace,
                           label_selector="owner=helm,status=deployed")
    for secret in sorted(secrets or (), key=objects.name, reverse=True):
        release = decode_release(str((secret.get("data") or {}).get("release") or ""))
        chart = (release or {}).get("chart") or {}
        if release is None or (chart.get("metadata") or {}).get("name") != CHART_NAME:
            continue
        values = merge_values(chart.get("values") or {}, release.get("config") or {})
        return {"name": str(release.get("name") or ""), "values": values}
    return None


def decode_release(data: str) -> dict[str, Any] | None:
    """A helm release from its Secret's `data.release` (base64 of helm's base64 of gzipped
    JSON); None when it is not one."""
    try:
        raw = base64.b64decode(base64.b64decode(data))
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        release = json.loads(raw)
    except (binascii.Error, ValueError, OSError):
        return None
    return release if isinstance(release, dict) else None


def encode_release(release: Mapping[str, Any]) -> str:
    """The inverse of `decode_release`: what a Secret's `data.release` holds."""
    inner = base64.b64encode(gzip.compress(json.dumps(release).encode()))
    return base64.b64encode(inner).decode()


def merge_values(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Values as helm merges them: maps merged key by key, anything else replaced."""
    merged = dict(defaults)
    for key, value in given.items():
        base = merged.get(key)
        merged[key] = (merge_values(base, value)
                       if isinstance(base, Mapping) and isinstance(value, Mapping) else value)
    return merged
