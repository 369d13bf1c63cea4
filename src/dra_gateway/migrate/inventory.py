"""What `dra-gateway migrate` knows of a cluster: its objects, sorted by kind, wherever they came
from (manifest files or a live API).

`ClusterObjects` is plain data: the readers (`dumps.py`, `live.py`) fill it and the plan, quota and
node logic read it. It must not read files or talk to a cluster itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dra_gateway.kube import names, objects

Object = dict[str, Any]

# Workloads whose pod template becomes the pods of their controller.
WORKLOAD_KINDS: Final = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job",
                         "CronJob")


@dataclass
class ClusterObjects:
    """The objects migrate reads, each list in the order found."""

    namespaces: list[Object] = field(default_factory=list)
    pods: list[Object] = field(default_factory=list)
    workloads: list[Object] = field(default_factory=list)
    nodes: list[Object] = field(default_factory=list)
    resource_quotas: list[Object] = field(default_factory=list)
    gpu_quotas: list[Object] = field(default_factory=list)
    sharing_policies: list[Object] = field(default_factory=list)
    rule_config_maps: list[Object] = field(default_factory=list)
    # What was left out and why (kinds not read, types the API does not serve), for the notes.
    notes: list[str] = field(default_factory=list)

    def add(self, obj: Object) -> bool:
        """File `obj` by its kind; False when migrate does not read that kind."""
        kind = obj.get("kind")
        if kind == "Namespace":
            self.namespaces.append(obj)
        elif kind == "Pod":
            self.pods.append(obj)
        elif kind in WORKLOAD_KINDS:
            self.workloads.append(obj)
        elif kind == "Node":
            self.nodes.append(obj)
        elif kind == "ResourceQuota":
            self.resource_quotas.append(obj)
        elif kind == "GPUQuota":
            self.gpu_quotas.append(obj)
        elif kind == "GPUSharingPolicy":
            self.sharing_policies.append(obj)
        elif kind == "ConfigMap":
            if objects.labels(obj).get(names.RULES_LABEL) == names.RULES_LABEL_VALUE:
                self.rule_config_maps.append(obj)
        else:
            return False
        return True

    def namespace_names(self) -> list[str]:
        """Every namespace named by an object, listed or not, sorted."""
        found = {objects.name(ns) for ns in self.namespaces}
        for group in (self.pods, self.workloads, self.resource_quotas, self.gpu_quotas):
            found.update(namespace_of(obj) for obj in group)
        return sorted(found)


def namespace_of(obj: Mapping[str, Any]) -> str:
    """The object's namespace; `default` when a manifest leaves it out, as kubectl does."""
    return objects.namespace(obj) or "default"
