"""The node's ResourceSlices: built as pure data, reconciled through the cluster port.

`build_slices` turns a device list into slices (sorted, split at the API's device limit,
deterministic names, a controller owner reference to the Node), so an unchanged node always
produces the same objects. `Publisher` keeps the cluster equal to them: it writes only when
something differs, bumps the pool generation on every change (consumers trust only the highest
generation), and watches its own slices with the runtime's informer so that a deletion (the
kubelet deletes a node's slices when it starts and when a plugin deregisters) is repaired at
once; an expired watch relists. Nothing here discovers hardware or talks to the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import (
    AlreadyExists,
    ApiError,
    Cluster,
    Conflict,
    NotFound,
    Object,
)
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.kube.runtime.informer import Change, Informer
from dra_gateway.node_plugin.metrics import Metrics

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128
# From Kubernetes 1.35 a slice whose devices carry taints holds at most 64 devices; a plugin
# that may taint uses the smaller size always, so a taint never reshuffles the slices.
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
# Partitionable devices: on 1.34 at most 32 counters in all the counter sets of one slice;
# from 1.35 counter sets sit in slices of their own, at most 8 a slice.
MAX_COUNTERS_PER_SLICE_1_34 = 32
MAX_COUNTER_SETS_PER_SLICE = 8
_MAX_NAME = 253


def slice_name(node_name: str, driver: str, index: int) -> str:
    """`<node>-<driver>-<i>`, shortened with a hash when the node name is very long."""
    name = f"{node_name}-{driver}-{index}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = _MAX_NAME - len(f"-{digest}-{driver}-{index}")
    return f"{node_name[:keep].rstrip('-.')}-{digest}-{driver}-{index}"


def build_slices(*, node_name: str, driver: str, devices: Sequence[dict[str, Any]],
                 generation: int, node_uid: str | None,
                 max_devices: int = MAX_DEVICES_PER_SLICE,
                 counter_sets: Sequence[dict[str, Any]] = (),
                 counters_apart: bool = False) -> list[Object]:
    """The node's pool as ResourceSlices; a node without devices still gets one empty slice
    so that consumers see the pool (and its generation) rather than nothing.

    `counter_sets` (partitionable devices: a MIG card on demand) go where the release wants
    them: beside the devices that draw on them on 1.34 (a device's set must sit in its slice,
    at most 32 counters a slice, so a card's devices are never split), in slices of their own
    from 1.35 (`counters_apart`: a slice holds devices or counter sets, at most 8 sets)."""
    if max_devices < 1:
        raise ValueError("max_devices must be at least 1")
    chunks: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]
    if counters_apart or not counter_sets:
        chunks = [(list(devices[i:i + max_devices]), [])
                  for i in range(0, len(devices), max_devices)]
        chunks += [([], list(counter_sets[i:i + MAX_COUNTER_SETS_PER_SLICE]))
                   for i in range(0, len(counter_sets), MAX_COUNTER_SETS_PER_SLICE)]
    else:
        chunks = _beside(devices, counter_sets, max_devices)
    chunks = chunks or [([], [])]
    out: list[Object] = []
    for index, (chunk, sets) in enumerate(chunks):
        metadata: dict[str, Any] = {
            "name": slice_name(node_name, driver, index),
            "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY},
        }
        if node_uid:
            metadata["ownerReferences"] = [{
                "apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                "controller": True,
            }]
        spec: dict[str, Any] = {
            "driver": driver,
            "pool": {"name": node_name, "generation": generation,
                     "resourceSliceCount": len(chunks)},
            "nodeName": node_name,
        }
        if chunk or not sets:
            spec["devices"] = copy.deepcopy(chunk)
        if sets:
            spec["sharedCounters"] = copy.deepcopy(sets)
        out.append({"apiVersion": RESOURCE_SLICES.api_version, "kind": RESOURCE_SLICES.kind,
                    "metadata": metadata, "spec": spec})
    return out


def _beside(devices: Sequence[dict[str, Any]], counter_sets: Sequence[dict[str, Any]],
            max_devices: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """1.34's layout: devices in order, each card's devices (those naming one counter set)
    kept together with their set, a slice closed where the next card would pass a limit."""
    by_name = {s["name"]: s for s in counter_sets}
    groups: list[tuple[list[dict[str, Any]], dict[str, Any] | None]] = []
    for device in devices:
        set_name = ((device.get("attributes") or {}).get(names.ATTR_COUNTER_SET)
                    or {}).get("string")
        if set_name in by_name and groups and groups[-1][1] is by_name[set_name]:
            groups[-1][0].append(device)
        else:
            groups.append(([device], by_name.get(set_name) if set_name else None))
    chunks: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
    counters = 0
    for group, counter_set in groups:
        size = len(counter_set["counters"]) if counter_set else 0
        if len(group) > max_devices or size > MAX_COUNTERS_PER_SLICE_1_34:
            raise ValueError(f"card of counter set {counter_set and counter_set['name']}: "
                             f"{len(group)} devices and {size} counters do not fit one slice")
        if not chunks or len(chunks[-1][0]) + len(group) > max_devices \
                or counters + size > MAX_COUNTERS_PER_SLICE_1_34:
            chunks.append(([], []))
            counters = 0
        chunks[-1][0].extend(group)
        if counter_set is not None and counter_set not in chunks[-1][1]:
            chunks[-1][1].append(counter_set)
            counters += size
    return chunks


def _comparable(obj: Object) -> tuple[Any, ...]:
    """What must match for an existing slice to count as published (generation aside)."""
    spec = copy.deepcopy(obj.get("spec", {}))
    spec.get("pool", {}).pop("generation", None)
    labels = {k: v for k, v in objects.labels(obj).items() if k == names.LABEL_MANAGED_BY}
    return (objects.name(obj), labels, objects.owner_references(obj), spec)


class Publisher:
    """Keeps this node's ResourceSlices equal to its devices. `run()` until cancelled."""

    def __init__(self, cluster: Cluster, *, node_name: str, driver: str = names.DRIVER,
                 devices: Sequence[dict[str, Any]] = (), max_devices: int = MAX_DEVICES_PER_SLICE,
                 metrics: Metrics | None = None, retry_seconds: float = 1.0,
                 max_retry_seconds: float = 30.0) -> None:
        self._cluster = cluster
        self.node_name = node_name
        self.driver = driver
        self._devices = [copy.deepcopy(d) for d in devices]
        self._counter_sets: list[dict[str, Any]] = []
        self._max_devices = max_devices
        self._counters_apart = False
        self._metrics = metrics or Metrics()
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._generation = 0
        self._node_uid: str | None = None
        self._warned_no_node = False
        self._warned_dropped = False
        # Slice name to (what we sent, what the API server stored), both as `_comparable`
        # (generation aside): a server that drops fields of a disabled feature gate must not
        # make every pass look like drift.
        self._stored_as: dict[str, tuple[Any, Any]] = {}
        self._dirty = asyncio.Event()
        self._written: set[str] = set()  # resourceVersions of our own writes
        self.synced = asyncio.Event()  # set after each successful reconcile, cleared on change
        self.published_once = False  # since the first successful reconcile
        self._selector = f"spec.nodeName={node_name},spec.driver={driver}"

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def max_devices(self) -> int:
        return self._max_devices

    def set_devices(self, devices: Sequence[dict[str, Any]],
                    counter_sets: Sequence[dict[str, Any]] = ()) -> None:
        """New device list (after health changes) and the counter sets its devices draw on;
        published by the running loop."""
        fresh = [copy.deepcopy(d) for d in devices]
        sets = [copy.deepcopy(c) for c in counter_sets]
        if fresh != self._devices or sets != self._counter_sets:
            self._devices = fresh
            self._counter_sets = sets
            self.synced.clear()
            self._dirty.set()

    def set_layout(self, *, max_devices: int, counters_apart: bool) -> None:
        """How slices are cut (`build_slices`): the release decides (1.35 and later keep
        counter sets apart and, where devices draw on counters, at most 64 devices a slice)."""
        if (max_devices, counters_apart) != (self._max_devices, self._counters_apart):
            self._max_devices = max_devices
            self._counters_apart = counters_apart
            self.synced.clear()
            self._dirty.set()

    def desired(self, generation: int) -> list[Object]:
        return build_slices(node_name=self.node_name, driver=self.driver, devices=self._devices,
                            generation=generation, node_uid=self._node_uid,
                            max_devices=self._max_devices, counter_sets=self._counter_sets,
                            counters_apart=self._counters_apart)

    def _ours(self, obj: Object) -> bool:
        spec = obj.get("spec") or {}
        return spec.get("driver") == self.driver and spec.get("nodeName") == self.node_name

    async def _lookup_node_uid(self) -> None:
        if self._node_uid is not None:
            return
        try:
            node = await self._cluster.get(NODES, self.node_name)
        except NotFound:
            # Without the Node there is no owner to point at; the slices are still published,
            # and the owner reference is added by the first reconcile after the Node appears.
            if not self._warned_no_node:
                self._warned_no_node = True
                log.warning("Node %s not found: publishing ResourceSlices without an owner "
                            "reference (check --node-name)", self.node_name)
            return
        self._node_uid = str(node["metadata"]["uid"])

    async def reconcile(self) -> bool:
        """One pass: make the cluster's slices equal the desired ones. True if it wrote."""
        await self._lookup_node_uid()
        listed = await self._cluster.list(RESOURCE_SLICES, field_selector=self._selector)
        ours = sorted((s for s in listed.items if self._ours(s)),
                      key=lambda s: str(s["metadata"]["name"]))
        generations = {int(s["spec"]["pool"].get("generation", 0)) for s in ours}
        current = max(generations, default=-1)
        if len(generations) == 1 and self._in_sync(ours, self.desired(current)):
            self._generation = current
            self._metrics.published_devices.set(len(self._devices))
            return False
        generation = max(current, self._generation) + 1
        desired = self.desired(generation)
        existing = {str(s["metadata"]["name"]): s for s in ours}
        for obj in desired:
            name = obj["metadata"]["name"]
            sent = _comparable(obj)  # before the write: a client may not hand it back intact
            if name in existing:
                obj["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                written = await self._cluster.update(RESOURCE_SLICES, obj)
                self._metrics.slice_writes.labels("update").inc()
            else:
                written = await self._cluster.create(RESOURCE_SLICES, obj)
                self._metrics.slice_writes.labels("create").inc()
            if len(self._written) > 1024:  # events of old writes were missed (a relist)
                self._written.clear()
            self._written.add(str(written["metadata"].get("resourceVersion")))
            self._note_stored(name, sent, written)
        wanted = {o["metadata"]["name"] for o in desired}
        for name, obj in existing.items():
            if name not in wanted:
                with contextlib.suppress(NotFound):
                    await self._cluster.delete(RESOURCE_SLICES, name,
                                               resource_version=obj["metadata"]["resourceVersion"])
                self._metrics.slice_writes.labels("delete").inc()
        self._generation = generation
        self._metrics.published_devices.set(len(self._devices))
        log.info("published %d device(s) of node %s in %d ResourceSlice(s), generation %d",
                 len(self._devices), self.node_name, len(desired), generation)
        return True

    def _in_sync(self, ours: list[Object], desired: list[Object]) -> bool:
        if len(ours) != len(desired):
            return False
        for have, want in zip(ours, desired, strict=True):
            stored, wanted = _comparable(have), _comparable(want)
            if stored != wanted and self._stored_as.get(str(want["metadata"]["name"])) != (
                    wanted, stored):
                return False
        return True

    def _note_stored(self, name: str, sent_form: Any, stored: Object) -> None:
        stored_form = _comparable(stored)
        self._stored_as[name] = (sent_form, stored_form)
        if sent_form != stored_form and not self._warned_dropped:
            self._warned_dropped = True
            log.warning("the API server changed ResourceSlice %s as it stored it (fields of a "
                        "disabled feature gate are dropped; expected while the consumable-"
                        "capacity mode is not yet detected): where the cluster lacks "
                        "DRADeviceTaints run the plugin with --no-device-taints, and where it "
                        "lacks DRAConsumableCapacity do not force --consumable-capacity", name)

    async def run(self) -> None:
        """Reconcile now and whenever the slices or the devices change; never returns."""
        # No store: each pass lists the slices itself, the watch only says when to look again.
        informer = Informer(self._cluster, RESOURCE_SLICES, self._on_slice,
                            replaced=self._relisted, field_selector=self._selector,
                            min_backoff=self._retry, max_backoff=self._max_retry,
                            what="ResourceSlice", keep=False)
        watcher = asyncio.create_task(informer.run(), name=f"slice-watch-{self.node_name}")
        self._dirty.set()
        delay = self._retry
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                try:
                    await self.reconcile()
                except (Conflict, AlreadyExists, NotFound) as exc:
                    # Someone else changed a slice between list and write: look again.
                    log.info("ResourceSlice changed while publishing (%s): retrying", exc.reason)
                    self._dirty.set()
                    await asyncio.sleep(min(delay, 0.2))
                    continue
                except ApiError as exc:
                    self._metrics.publish_errors.inc()
                    log.warning("publishing ResourceSlices of node %s failed: %s (%s); retrying "
                                "in %.0fs", self.node_name, exc.message, exc.reason, delay)
                    self._dirty.set()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._max_retry)
                    continue
                delay = self._retry
                if not self._dirty.is_set():
                    self.synced.set()
                    self.published_once = True
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    def _relisted(self, items: list[Object]) -> None:
        # Anything may have happened while the watch was down.
        self._dirty.set()

    def _on_slice(self, change: Change, obj: Object, old: Object | None) -> None:
        if not self._ours(obj):
            return
        rv = objects.resource_version(obj)
        if change != "deleted" and rv in self._written:
            self._written.discard(rv)
            return
        if change == "deleted":
            log.info("ResourceSlice %s was deleted: republishing", objects.name(obj))
        self.synced.clear()
        self._dirty.set()
