"""The allocator's own writes applied to its mirrors, before (or unless) the watch brings them.

A write the API answered is as good as the watch event it will cause: the allocation, the gate's
removal and a release show in the informers' stores at once, so the syncs they queue read the
new object. A store that holds anything but the version a write was based on has moved on (the
watch brought the write, or something later) and is left as it is. Both the pod allocator and
the claim releaser apply their writes here; nothing else is decided.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_gateway.allocator.work import Write
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.runtime.informer import Informer


def observe_write(mirror: Informer, base_rv: str, written: Object) -> None:
    """Apply our own write to `mirror` if it still holds the version the write was based on
    (the watch has not brought it, or anything later, yet)."""
    stored = mirror.get(*objects.namespace_name(written))
    if (stored is not None and objects.resource_version(stored) == base_rv
            and objects.uid(stored) == objects.uid(written)):
        mirror.observe_write(written)


def observe_writes(mirror: Informer, writes: Sequence[Write]) -> None:
    """Apply each of our own writes to `mirror` unless the watch already brought it (or later)."""
    for base_rv, written in writes:
        observe_write(mirror, base_rv, written)


__all__ = ["observe_write", "observe_writes"]
