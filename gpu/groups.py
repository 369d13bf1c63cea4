"""Which pod group a pod belongs to, read from what users and their job controllers already
write on the pod: the group's name, the members it needs to run, and where that was read.

A group's minimum members are allocated all together or not at all (allocator/groups.py). The
sources, first found wins:

1. the gateway's own annotations, for anything else: `dra-gateway.io/group` (a name) and
   `dra-gateway.io/group-size` (the members it needs);
2. upstream's Workload API (GenericWorkload): from 1.36, `spec.schedulingGroup.podGroupName`
   names a PodGroup (`scheduling.k8s.io` v1beta1, or 1.36's v1alpha2) whose
   `spec.schedulingPolicy.gang.minCount` is the size (a `basic` policy: no gang, one member);
   in 1.35, `spec.workloadRef` names a Workload (`scheduling.k8s.io/v1alpha1`) and one of its
   `spec.podGroups` (`policy.gang.minCount`), one group per `podGroupReplicaKey`;
3. Kueue's pod groups: the label `kueue.x-k8s.io/pod-group-name` and the annotation
   `kueue.x-k8s.io/pod-group-total-count`;
4. LeaderWorkerSet: the labels `leaderworkerset.sigs.k8s.io/name` and
   `leaderworkerset.sigs.k8s.io/group-index` (one group per replica: a leader and its workers)
   and the annotation `leaderworkerset.sigs.k8s.io/size`;
5. Volcano: the annotation `scheduling.k8s.io/group-name` names a PodGroup
   (`scheduling.volcano.sh/v1beta1`) of the pod's namespace, whose `spec.minMember` is the size;
6. the coscheduling plugin (scheduler-plugins): the label `scheduling.x-k8s.io/pod-group` names
   a PodGroup (`scheduling.x-k8s.io/v1alpha1`), whose `spec.minMember` is the size;
7. JobSet: the label `jobset.sigs.k8s.io/jobset-name` (and `restart-attempt`: a restarted
   JobSet is a new group) names a JobSet (`jobset.x-k8s.io/v1alpha2`), sized by the sum over
   its replicated jobs of `replicas` times the job's `parallelism`;
8. Kubeflow's training jobs (PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob): the
   label `training.kubeflow.org/job-name` and the pod's controller, sized by the sum of its
   replica specs' `replicas` (where Kubeflow creates a Volcano or coscheduling PodGroup for
   gang scheduling, that PodGroup names the group first).

A group is one namespace's: its key (`group_key`) is the namespace, the source and the name,
read from the pod alone. Its size may need the PodGroup object (`group_of`'s `podgroups`
lookup). A pod that names a group but not a usable size (a missing or odd count, a PodGroup
that does not exist) gets a `GroupError` saying which field or object to fix.

Every member's cards are of one GPU model, unless the pod's annotation
`dra-gateway.io/group-models` says `Any` (`Same`, the default, says so explicitly). The
annotation `dra-gateway.io/group-domain` names a node label every member's node must share
(one rack, one zone): the group waits rather than spread. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from dra_gateway.kube import names, objects
from dra_gateway.kube.objects import RawObject
from dra_gateway.kube.resources import (
    COSCHEDULING_POD_GROUPS,
    JOBSETS,
    KUBEFLOW_JOBS,
    POD_GROUPS_V1ALPHA2,
    POD_GROUPS_V1BETA1,
    VOLCANO_POD_GROUPS,
    WORKLOADS_V1ALPHA1,
    ResourceType,
)

GROUP_ANNOTATION: Final = f"{names.DOMAIN}/group"
GROUP_SIZE_ANNOTATION: Final = f"{names.DOMAIN}/group-size"
KUEUE_GROUP_LABEL: Final = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION: Final = "kueue.x-k8s.io/pod-group-total-count"
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/size"
VOLCANO_GROUP_ANNOTATION: Final = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_ATTEMPT_LABEL: Final = "jobset.sigs.k8s.io/restart-attempt"
KUBEFLOW_JOB_LABEL: Final = "training.kubeflow.org/job-name"
MODELS_ANNOTATION: Final = f"{names.DOMAIN}/group-models"
DOMAIN_ANNOTATION: Final = f"{names.DOMAIN}/group-domain"
SAME_MODEL: Final = "Same"
ANY_MODEL: Final = "Any"

# The sources whose size an object holds, and that object's types (the versions served, the
# preferred first): PodGroups' minMember or gang minCount, a Workload's pod groups.
PODGROUP_TYPES: Final[dict[str, tuple[ResourceType, ...]]] = {
    "podgroup": (POD_GROUPS_V1BETA1, POD_GROUPS_V1ALPHA2),
    "workload": (WORKLOADS_V1ALPHA1,),
    "volcano": (VOLCANO_POD_GROUPS,),
    "coscheduling": (COSCHEDULING_POD_GROUPS,),
    "jobset": (JOBSETS,),
    **{kind.lower(): (rt,) for kind, (rt, _) in KUBEFLOW_JOBS.items()}}

# More members than this is a typo, not a job (the largest jobs the gateway serves are far
# smaller; the scheduler would never see them whole either).
MAX_GROUP_SIZE: Final = 10_000

# (source, namespace, name) -> the PodGroup object, None when there is none.
PodGroupLookup = Callable[[str, str, str], RawObject | None]


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A pod's group: `size` members must all be allocated together."""

    namespace: str
    name: str
    size: int
    source: str  # "dra-gateway", "podgroup", "workload", "kueue", "leaderworkerset", ...
    why: str  # the fields it was read from, for `translate --explain` and conditions
    same_model: bool = True  # every member's cards of one GPU model
    domain: str | None = None  # a node label whose value every member's node must share

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.source, self.name)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GroupError:
    """A pod that names a group the gateway cannot use: what to fix."""

    message: str


@dataclass(frozen=True, slots=True)
class _Named:
    """A group as the pod names it, before its size is read."""

    source: str
    name: str
    why: str  # the pod's fields that name it
    size_field: str | None = None  # the pod's annotation holding the size; None: an object's
    size_why: str = "annotation "  # how `why` goes on to name the size's annotation
    holder: str = ""  # the object holding the size, when not `name` (a Workload)
    member: str = ""  # the Workload's pod group the pod belongs to


def _named(pod: RawObject) -> _Named | None:
    notes, marks = objects.annotations(pod), objects.labels(pod)
    if own := notes.get(GROUP_ANNOTATION):
        return _Named("dra-gateway", own, f"annotations {GROUP_ANNOTATION}={own}",
                      GROUP_SIZE_ANNOTATION, size_why="")
    spec = objects.spec(pod)
    scheduling = spec.get("schedulingGroup")
    if isinstance(scheduling, Mapping) and isinstance(scheduling.get("podGroupName"), str):
        name = scheduling["podGroupName"]
        return _Named("podgroup", name, f"spec.schedulingGroup.podGroupName={name}")
    ref = spec.get("workloadRef")
    if isinstance(ref, Mapping) and isinstance(ref.get("name"), str) and \
            isinstance(ref.get("podGroup"), str):
        replica = ref.get("podGroupReplicaKey") or ""
        name = "/".join(p for p in (ref["name"], ref["podGroup"], replica) if p)
        why = f"spec.workloadRef (workload {ref['name']}, podGroup {ref['podGroup']}" + (
            f", podGroupReplicaKey {replica})" if replica else ")")
        return _Named("workload", name, why, holder=ref["name"], member=ref["podGroup"])
    if kueue := marks.get(KUEUE_GROUP_LABEL):
        return _Named("kueue", kueue, f"label {KUEUE_GROUP_LABEL}={kueue}",
                      KUEUE_COUNT_ANNOTATION)
    lws = marks.get(LWS_NAME_LABEL)
    if lws and LWS_INDEX_LABEL in marks:
        index = marks[LWS_INDEX_LABEL]
        return _Named("leaderworkerset", f"{lws}-{index}",
                      f"labels {LWS_NAME_LABEL}={lws}, {LWS_INDEX_LABEL}={index}",
                      LWS_SIZE_ANNOTATION)
    if volcano := notes.get(VOLCANO_GROUP_ANNOTATION):
        return _Named("volcano", volcano, f"annotation {VOLCANO_GROUP_ANNOTATION}={volcano}")
    if cosched := marks.get(COSCHEDULING_GROUP_LABEL):
        return _Named("coscheduling", cosched, f"label {COSCHEDULING_GROUP_LABEL}={cosched}")
    if jobset := marks.get(JOBSET_NAME_LABEL):
        attempt = marks.get(JOBSET_ATTEMPT_LABEL) or "0"
        why = f"label {JOBSET_NAME_LABEL}={jobset}" + (
            f", {JOBSET_ATTEMPT_LABEL}={attempt}" if attempt != "0" else "")
        name = jobset if attempt == "0" else f"{jobset}/attempt-{attempt}"
        return _Named("jobset", name, why, holder=jobset)
    if job := marks.get(KUBEFLOW_JOB_LABEL):
        owner = _controller(pod)
        if owner is not None and owner[0] in KUBEFLOW_JOBS and owner[1] == job:
            return _Named(owner[0].lower(), job, f"label {KUBEFLOW_JOB_LABEL}={job} "
                          f"({owner[0]})")
    return None


def _controller(pod: RawObject) -> tuple[str, str] | None:
    """The kind and name of the pod's controller (its controlling ownerReference)."""
    for ref in objects.meta(pod).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def group_key(pod: RawObject) -> tuple[str, str, str] | None:
    """The key of the group the pod names (namespace, source, name), read from the pod alone;
    None when it names none."""
    named = _named(pod)
    return None if named is None else (objects.namespace(pod), named.source, named.name)


def holder_key(pod: RawObject) -> tuple[str, str, str] | None:
    """The key of the object sizing the pod's group (namespace, source, object name), for the
    groups whose size an object holds (a PodGroup, a Workload); None for the others."""
    named = _named(pod)
    if named is None or named.size_field is not None:
        return None
    return (objects.namespace(pod), named.source, named.holder or named.name)


def _count(value: object, field: str, group: str) -> int | GroupError:
    if value is None:
        return GroupError(f"{field} is missing: pod group {group} needs the number of its "
                          f"members (set {field}: \"N\")")
    size: object = value
    if isinstance(value, str):
        try:
            size = int(value.strip())
        except ValueError:
            size = None
    if not isinstance(size, int) or isinstance(size, bool):
        return GroupError(f"{field} is {value!r}, not a number of members (set {field}: \"N\")")
    if not 1 <= size <= MAX_GROUP_SIZE:
        return GroupError(f"{field} is {size}: a group has 1 to {MAX_GROUP_SIZE} members")
    return size


def _podgroup_size(named: _Named, namespace: str,
                   podgroups: PodGroupLookup | None) -> tuple[int, str] | GroupError:
    types = PODGROUP_TYPES[named.source]
    rt = types[0]
    holder = named.holder or named.name
    what = f"{rt.kind} {namespace}/{holder} ({rt.api_version if len(types) == 1 else rt.group})"
    found = podgroups(named.source, namespace, holder) if podgroups is not None else None
    if found is None:
        if named.source == "jobset" or named.source in _KUBEFLOW_FIELDS:
            return GroupError(f"the pod's {named.why} names {what}, which does not exist (or "
                              f"is not served): its pods wait for it to size their group")
        sized_by = "spec.minMember" if named.source in ("volcano", "coscheduling") else \
            "its gang policy's minCount"
        naming = named.why.split("=", 1)[0].split(" (", 1)[0]
        return GroupError(f"the pod's {named.why} names {what}, which does not exist: "
                          f"create it (with {sized_by}), or remove the pod's {naming}")
    spec = found.get("spec") or {}
    if named.source == "podgroup":
        return _gang_size(spec.get("schedulingPolicy"), f"{what} spec.schedulingPolicy",
                          named.name)
    if named.source == "workload":
        groups = spec.get("podGroups") or ()
        entry = next((g for g in groups if isinstance(g, Mapping)
                      and g.get("name") == named.member), None)
        if entry is None:
            return GroupError(f"the pod's {named.why} names pod group {named.member}, which "
                              f"{what} does not have: add it to spec.podGroups, or fix the "
                              f"pod's spec.workloadRef.podGroup")
        return _gang_size(entry.get("policy"), f"{what} spec.podGroups[{named.member}].policy",
                          named.name)
    if named.source == "jobset":
        return _jobset_size(spec, what, named.name)
    if named.source in _KUBEFLOW_FIELDS:
        return _replicas_size(spec, _KUBEFLOW_FIELDS[named.source], what, named.name)
    member = spec.get("minMember")
    if member is None or member == 0:
        return 1, f"{what} spec.minMember={member or 'unset'} (one member)"  # as both read it
    size = _count(member, f"{what} spec.minMember", named.name)
    return size if isinstance(size, GroupError) else (size, f"{what} spec.minMember={size}")


_KUBEFLOW_FIELDS: Final = {kind.lower(): field for kind, (_, field) in KUBEFLOW_JOBS.items()}


def _jobset_size(spec: Mapping[str, object], what: str, group: str) -> tuple[int, str] | GroupError:
    """A JobSet's pods: every replicated job's replicas times its Job's parallelism."""
    jobs = spec.get("replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        return GroupError(f"{what} has no spec.replicatedJobs: no pods to group")
    total = 0
    for index, job in enumerate(jobs):
        job = job if isinstance(job, Mapping) else {}
        replicas = _count(job.get("replicas", 1), f"{what} spec.replicatedJobs[{index}].replicas",
                          group)
        template = (job.get("template") or {}).get("spec") or {}
        parallelism = _count(template.get("parallelism", 1),
                             f"{what} spec.replicatedJobs[{index}].template.spec.parallelism",
                             group)
        for value in (replicas, parallelism):
            if isinstance(value, GroupError):
                return value
        total += replicas * parallelism  # type: ignore[operator]
    size = _count(total, f"{what} pods in all", group)
    return size if isinstance(size, GroupError) else (
        size, f"{what} spec.replicatedJobs: {size} pod(s) in all")


def _replicas_size(spec: Mapping[str, object], field: str, what: str,
                   group: str) -> tuple[int, str] | GroupError:
    """A Kubeflow training job's pods: every replica spec's replicas (one when unset)."""
    replicas = spec.get(field) or {}
    if not isinstance(replicas, Mapping) or not replicas:
        return GroupError(f"{what} has no spec.{field}: no replicas to group")
    total = 0
    for role, replica in sorted(replicas.items()):
        count = _count((replica or {}).get("replicas", 1),
                       f"{what} spec.{field}.{role}.replicas", group)
        if isinstance(count, GroupError):
            return count
        total += count
    size = _count(total, f"{what} replicas in all", group)
    return size if isinstance(size, GroupError) else (
        size, f"{what} spec.{field}: {size} replica(s) in all")


def _gang_size(policy: object, where: str, group: str) -> tuple[int, str] | GroupError:
    """The size of an upstream pod group policy: a gang's minCount; basic: one member."""
    gang = policy.get("gang") if isinstance(policy, Mapping) else None
    if not isinstance(gang, Mapping):
        return 1, f"{where} basic (one member)"
    size = _count(gang.get("minCount"), f"{where}.gang.minCount", group)
    return size if isinstance(size, GroupError) else (size, f"{where}.gang.minCount={size}")


def group_of(pod: RawObject,
             podgroups: PodGroupLookup | None = None) -> PodGroup | GroupError | None:
    """The pod's group (see the module), None when it belongs to none. `podgroups` finds the
    PodGroup objects Volcano's and the coscheduling plugin's pods name."""
    named = _named(pod)
    if named is None:
        return None
    namespace = objects.namespace(pod)
    notes = objects.annotations(pod)
    if named.size_field is not None:
        size = _count(notes.get(named.size_field), named.size_field, named.name)
        if isinstance(size, GroupError):
            return size
        why = f"{named.why}, {named.size_why}{named.size_field}={size}"
    else:
        sized = _podgroup_size(named, namespace, podgroups)
        if isinstance(sized, GroupError):
            return sized
        size, read = sized
        why = f"{named.why}, {read}"
    same = _same_model(notes.get(MODELS_ANNOTATION))
    if isinstance(same, GroupError):
        return same
    group = PodGroup(namespace, named.name, size, named.source, why)
    if not same:
        group = replace(group, same_model=False,
                        why=f"{group.why}; {MODELS_ANNOTATION}={ANY_MODEL}")
    domain = notes.get(DOMAIN_ANNOTATION)
    if domain is not None:
        if not objects.is_label_key(domain):
            return GroupError(f"{DOMAIN_ANNOTATION} is {domain!r}, not a node label key: name "
                              f"the label every member's node must share, as "
                              f"topology.kubernetes.io/zone")
        group = replace(group, domain=domain, why=f"{group.why}; {DOMAIN_ANNOTATION}={domain}")
    return group


def describe(pod: RawObject, podgroups: PodGroupLookup | None = None) -> str | None:
    """In words, which group the pod belongs to and why (`translate --explain`, `migrate
    plan`); None when it belongs to none. Without `podgroups` (no cluster to read), a group
    sized by an object says which object holds its size."""
    named = _named(pod)
    if named is None:
        return None
    found = group_of(pod, podgroups)
    if isinstance(found, PodGroup):
        parts = [f"pod group {found.label} ({found.source}): {found.size} member(s) allocated "
                 f"together, all or nothing, from {found.why}"]
        if found.same_model:
            parts.append("every member on one GPU model")
        if found.domain:
            parts.append(f"on nodes of one {found.domain}")
        return "; ".join(parts)
    label = f"{objects.namespace(pod)}/{named.name}"
    if podgroups is None and named.size_field is None:
        rt = PODGROUP_TYPES[named.source][0]
        return (f"pod group {label} ({named.source}), from {named.why}: its size is "
                f"{rt.kind} {named.holder or named.name}'s, read in the cluster")
    return f"pod group {label} cannot be used: {found.message}" if found else None


def _same_model(text: str | None) -> bool | GroupError:
    if text is None or text == SAME_MODEL:
        return True
    if text == ANY_MODEL:
        return False
    return GroupError(f"{MODELS_ANNOTATION} is {text!r}: set {SAME_MODEL!r} (every member on "
                      f"one GPU model, the default) or {ANY_MODEL!r} (members on any models)")


__all__ = [
    "COSCHEDULING_GROUP_LABEL",
    "DOMAIN_ANNOTATION",
    "GROUP_ANNOTATION",
    "GROUP_SIZE_ANNOTATION",
    "JOBSET_ATTEMPT_LABEL",
    "JOBSET_NAME_LABEL",
    "KUBEFLOW_JOB_LABEL",
    "KUEUE_COUNT_ANNOTATION",
    "KUEUE_GROUP_LABEL",
    "LWS_INDEX_LABEL",
    "LWS_NAME_LABEL",
    "LWS_SIZE_ANNOTATION",
    "MODELS_ANNOTATION",
    "PODGROUP_TYPES",
    "VOLCANO_GROUP_ANNOTATION",
    "GroupError",
    "PodGroup",
    "PodGroupLookup",
    "describe",
    "group_key",
    "group_of",
    "holder_key",
]
