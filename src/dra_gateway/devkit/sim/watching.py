"""What a watch of the in-memory cluster is made of: the events the store records, the
sentinels that end a watch, and the filter that decides what one watcher sees.

A watcher with a selector sees an object that moves into its selection as ADDED and one that
moves out as DELETED, as the API server's watch cache reports them. The store owns the history
and the queues; this module must not keep state of its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from dra_gateway.devkit.sim.selectors import FieldSelector, LabelSelector
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import EventType, Object
from dra_gateway.kube.resources import ResourceType


@dataclass(frozen=True, slots=True)
class Event:
    """One write, as the store records it in a resource type's history."""

    rv: int
    type: EventType
    obj: Object  # stored state: never mutated, copied before it leaves
    old: Object | None  # the previous state, for selector transitions on MODIFIED


class Expire:
    """Sentinel put in a watch queue by `expire_watches`."""


class Close:
    """Sentinel put in a watch queue by `close`: the watch ends normally."""


@dataclass(eq=False)
class Watch:
    """One open watch: its resource type and the queue the store feeds."""

    rt: ResourceType
    queue: asyncio.Queue[Event | Expire | Close] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True, slots=True)
class Filter:
    """A watcher's selection: namespace, labels and fields."""

    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, obj: Object | None) -> bool:
        if obj is None:
            return False
        meta = objects.meta(obj)
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)

    def translate(self, event: Event) -> tuple[EventType, Object] | None:
        """The event this watcher sees: objects moving in or out of the selection become
        ADDED or DELETED, as the API server's watch cache reports them."""
        now = self.matches(event.obj)
        if event.type == "MODIFIED":
            before = self.matches(event.old)
            if now and before:
                return "MODIFIED", event.obj
            if now:
                return "ADDED", event.obj
            if before:
                return "DELETED", event.obj
            return None
        return (event.type, event.obj) if now else None
