"""Which pod group a pod belongs to, read from what users and their job controllers already
write on the pod: the group's name, the members it needs to run, and where that was read.

A group's minimum members are allocated all together or not at all (allocator/groups.py). The
sources, first found wins:

1. the gateway's own annotations, for anything else: `dra-gateway.io/group` (a name) and
   `dra-gateway.io/group-size` (the members it needs);
2. Kueue's pod groups: the label `kueue.x-k8s.io/pod-group-name` and the annotation
   `kueue.x-k8s.io/pod-group-total-count`;
3. LeaderWorkerSet: the labels `leaderworkerset.sigs.k8s.io/name` and
   `leaderworkerset.sigs.k8s.io/group-index` (one group per replica: a leader and its workers)
   and the annotation `leaderworkerset.sigs.k8s.io/size`.

A group is one namespace's: its key is the namespace, the source and the name. A pod that names
a group but not a usable size gets a `GroupError` saying which field to fix.

Every member's cards are of one GPU model, unless the pod's annotation
`dra-gateway.io/group-models` says `Any` (`Same`, the default, says so explicitly). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from dra_gateway.kube import names, objects
from dra_gateway.kube.objects import RawObject

GROUP_ANNOTATION: Final = f"{names.DOMAIN}/group"
GROUP_SIZE_ANNOTATION: Final = f"{names.DOMAIN}/group-size"
KUEUE_GROUP_LABEL: Final = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION: Final = "kueue.x-k8s.io/pod-group-total-count"
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
LWS_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/size"
MODELS_ANNOTATION: Final = f"{names.DOMAIN}/group-models"
SAME_MODEL: Final = "Same"
ANY_MODEL: Final = "Any"

# More members than this is a typo, not a job (the largest jobs the gateway serves are far
# smaller; the scheduler would never see them whole either).
MAX_GROUP_SIZE: Final = 10_000


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A pod's group: `size` members must all be allocated together."""

    namespace: str
    name: str
    size: int
    source: str  # which convention said so: "dra-gateway", "kueue", "leaderworkerset"
    why: str  # the fields it was read from, for `translate --explain` and conditions
    same_model: bool = True  # every member's cards of one GPU model

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


def _size(text: str | None, field: str, group: str) -> int | GroupError:
    if text is None:
        return GroupError(f"{field} is missing: pod group {group} needs the number of its "
                          f"members (set {field}: \"N\")")
    try:
        size = int(text.strip())
    except ValueError:
        return GroupError(f"{field} is {text!r}, not a number of members (set {field}: \"N\")")
    if not 1 <= size <= MAX_GROUP_SIZE:
        return GroupError(f"{field} is {size}: a group has 1 to {MAX_GROUP_SIZE} members")
    return size


def _same_model(text: str | None) -> bool | GroupError:
    if text is None or text == SAME_MODEL:
        return True
    if text == ANY_MODEL:
        return False
    return GroupError(f"{MODELS_ANNOTATION} is {text!r}: set {SAME_MODEL!r} (every member on "
                      f"one GPU model, the default) or {ANY_MODEL!r} (members on any models)")


def group_of(pod: RawObject) -> PodGroup | GroupError | None:
    """The pod's group (see the module), None when it belongs to none."""
    group = _named_group(pod)
    if not isinstance(group, PodGroup):
        return group
    same = _same_model(objects.annotations(pod).get(MODELS_ANNOTATION))
    if isinstance(same, GroupError):
        return same
    return group if same else replace(group, same_model=False,
                                      why=f"{group.why}; {MODELS_ANNOTATION}={ANY_MODEL}")


def _named_group(pod: RawObject) -> PodGroup | GroupError | None:
    notes, marks = objects.annotations(pod), objects.labels(pod)
    ns = objects.namespace(pod)
    own = notes.get(GROUP_ANNOTATION)
    if own:
        size = _size(notes.get(GROUP_SIZE_ANNOTATION), GROUP_SIZE_ANNOTATION, own)
        if isinstance(size, GroupError):
            return size
        return PodGroup(ns, own, size, "dra-gateway",
                        f"annotations {GROUP_ANNOTATION}={own}, {GROUP_SIZE_ANNOTATION}={size}")
    kueue = marks.get(KUEUE_GROUP_LABEL)
    if kueue:
        size = _size(notes.get(KUEUE_COUNT_ANNOTATION), KUEUE_COUNT_ANNOTATION, kueue)
        if isinstance(size, GroupError):
            return size
        return PodGroup(ns, kueue, size, "kueue",
                        f"label {KUEUE_GROUP_LABEL}={kueue}, annotation "
                        f"{KUEUE_COUNT_ANNOTATION}={size}")
    lws = marks.get(LWS_NAME_LABEL)
    if lws and LWS_INDEX_LABEL in marks:
        index = marks[LWS_INDEX_LABEL]
        name = f"{lws}-{index}"
        size = _size(notes.get(LWS_SIZE_ANNOTATION), LWS_SIZE_ANNOTATION, name)
        if isinstance(size, GroupError):
            return size
        return PodGroup(ns, name, size, "leaderworkerset",
                        f"labels {LWS_NAME_LABEL}={lws}, {LWS_INDEX_LABEL}={index}, "
                        f"annotation {LWS_SIZE_ANNOTATION}={size}")
    return None


__all__ = [
    "GROUP_ANNOTATION", "GROUP_SIZE_ANNOTATION", "KUEUE_COUNT_ANNOTATION", "KUEUE_GROUP_LABEL",
    "LWS_INDEX_LABEL", "LWS_NAME_LABEL", "LWS_SIZE_ANNOTATION", "MODELS_ANNOTATION", "GroupError",
    "PodGroup",
    "group_of",
]
