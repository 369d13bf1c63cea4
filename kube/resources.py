"""The Kubernetes resource types the project reads and writes, as plain data.

Every caller of the cluster port names a type from here, so the in-memory cluster, its HTTP
front and the kubernetes-asyncio adapter agree on paths, kinds and scopes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False  # served with a /status subresource

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def path(self, *, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The REST path of a collection or an object, as the API server serves it."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


PODS = ResourceType("", "v1", "pods", "Pod", namespaced=True, has_status=True)
NODES = ResourceType("", "v1", "nodes", "Node", namespaced=False, has_status=True)
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True)
CONFIG_MAPS = ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True)
POD_DISRUPTION_BUDGETS = ResourceType("policy", "v1", "poddisruptionbudgets",
                                      "PodDisruptionBudget", namespaced=True, has_status=True)
SECRETS = ResourceType("", "v1", "secrets", "Secret", namespaced=True)
# Read by `migrate` and `preflight` (legacy device plugins, the node plugin's DaemonSet); not
# among what the simulator serves (ALL).
DAEMON_SETS = ResourceType("apps", "v1", "daemonsets", "DaemonSet", namespaced=True,
                           has_status=True)
EVENTS = ResourceType("", "v1", "events", "Event", namespaced=True)
RESOURCE_CLAIMS = ResourceType(
    "resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True, has_status=True
)
RESOURCE_CLAIM_TEMPLATES = ResourceType(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
RESOURCE_SLICES = ResourceType(
    "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
)
DEVICE_CLASSES = ResourceType(
    "resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False
)
# Served (v1) and on by default from Kubernetes 1.37.
DEVICE_TAINT_RULES = ResourceType(
    "resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule", namespaced=False,
    has_status=True
)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
MUTATING_WEBHOOK_CONFIGURATIONS = ResourceType(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration", namespaced=False,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = ResourceType(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration", namespaced=False,
)
# The gateway's policy CRDs (helm/dra-gateway/crds/), served by the embedded API as the API
# server serves them once the chart installed them.
GPU_QUOTAS = ResourceType("dra-gateway.io", "v1alpha1", "gpuquotas", "GPUQuota",
                          namespaced=True, has_status=True)
GPU_SHARING_POLICIES = ResourceType("dra-gateway.io", "v1alpha1", "gpusharingpolicies",
                                    "GPUSharingPolicy", namespaced=False, has_status=True)

# Other schedulers' pod groups, read for their minimum members (gpu/groups.py): Volcano's and
# the coscheduling plugin's (scheduler-plugins). Served only where those are installed.
VOLCANO_POD_GROUPS = ResourceType("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup",
                                  namespaced=True, has_status=True)
COSCHEDULING_POD_GROUPS = ResourceType("scheduling.x-k8s.io", "v1alpha1", "podgroups",
                                       "PodGroup", namespaced=True, has_status=True)
# Upstream's Workload API (GenericWorkload): 1.35's Workloads, whose pods name one of their pod
# groups (spec.workloadRef); from 1.36, standalone PodGroups the pods name
# (spec.schedulingGroup.podGroupName), alpha in 1.36 and beta (off by default) in 1.37.
WORKLOADS_V1ALPHA1 = ResourceType("scheduling.k8s.io", "v1alpha1", "workloads", "Workload",
                                  namespaced=True)
POD_GROUPS_V1ALPHA2 = ResourceType("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup",
                                   namespaced=True, has_status=True)
POD_GROUPS_V1BETA1 = ResourceType("scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup",
                                  namespaced=True, has_status=True)
# Job controllers whose objects size their pods' groups: JobSet (every replicated job's
# replicas times its parallelism) and Kubeflow's training jobs (every replica spec's replicas).
JOBSETS = ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", namespaced=True,
                       has_status=True)
KUBEFLOW_JOBS: dict[str, tuple[ResourceType, str]] = {  # kind -> (type, its replica specs)
    kind: (ResourceType("kubeflow.org", version, plural, kind, namespaced=True,
                        has_status=True), field)
    for kind, version, plural, field in (
        ("PyTorchJob", "v1", "pytorchjobs", "pytorchReplicaSpecs"),
        ("TFJob", "v1", "tfjobs", "tfReplicaSpecs"),
        ("XGBoostJob", "v1", "xgboostjobs", "xgbReplicaSpecs"),
        ("PaddleJob", "v1", "paddlejobs", "paddleReplicaSpecs"),
        ("JAXJob", "v1", "jaxjobs", "jaxReplicaSpecs"),
        ("MPIJob", "v2beta1", "mpijobs", "mpiReplicaSpecs"))}

ALL: tuple[ResourceType, ...] = (
    PODS, NODES, NAMESPACES, CONFIG_MAPS, SECRETS, EVENTS,
    RESOURCE_CLAIMS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_SLICES, DEVICE_CLASSES,
    LEASES, MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS,
    GPU_QUOTAS, GPU_SHARING_POLICIES, POD_DISRUPTION_BUDGETS,
    VOLCANO_POD_GROUPS, COSCHEDULING_POD_GROUPS,
    WORKLOADS_V1ALPHA1, POD_GROUPS_V1ALPHA2, POD_GROUPS_V1BETA1,
    JOBSETS, *(rt for rt, _ in KUBEFLOW_JOBS.values()),
)


def by_kind(api_version: str, kind: str) -> ResourceType:
    """The type of an object from its apiVersion and kind; KeyError names both when unknown."""
    for rt in ALL:
        if rt.api_version == api_version and rt.kind == kind:
            return rt
    raise KeyError(f"{api_version} {kind} is not a resource type the project serves")
