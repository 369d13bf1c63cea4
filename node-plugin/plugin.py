"""The running node plugin: discovery, publishing, health, the kubelet's sockets, together.

`NodePlugin.run()` starts the DRA and registration sockets, takes the state directory's fence
(`fence.py`: one instance on a node writes slices, conditions and the checkpoint, the other of
a rolling update waits), repairs the checkpoint, restores the health marks an earlier run left
(`healthstate.py`: the state file, else the Node's condition; and the administrator's keep and
clear, read once), settles the consumable-capacity mode, publishes the node's slices and
watches health until cancelled. It must never crash-loop a node: a failed NVML discovery
publishes an empty pool ("no healthy devices"), logs why, and tries again; a failed API call
is retried by the publisher. Settings come in explicitly, nothing is global.

Consumable capacity is decided as the allocator decides it (`kube.cluster.features`: a dry-run
probe slice read back), unless forced: the two must never disagree, or shares take whole
cards. While the API server cannot tell, shared cards are published with the fields (a server
without the gate drops them, leaving what a plugin without them publishes) and the plugin asks
again, reading back its own slices too, until it knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.features import (
    BY_PUBLISHED_SLICES,
    detect_consumable_capacity,
    detect_device_taints,
    detect_partitionable_devices,
    slices_show_consumable_capacity,
)
from dra_gateway.kube.cluster.port import ApiError, Cluster, Discovery, NotFound
from dra_gateway.kube.device_health import admin_orders
from dra_gateway.kube.node_setup import NodeSetup
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin import cdi, healthstate
from dra_gateway.node_plugin.coexistence import CoexistenceSettings, LegacyCoexistence
from dra_gateway.node_plugin.devices import (
    CONSUMABLE_CAPACITY_FALLBACK,
    DeviceInfo,
    DeviceOptions,
    Made,
    counter_sets_of,
    device_table,
    devices_of,
    hand_made_overlap,
)
from dra_gateway.node_plugin.discovery import DiscoveryError
from dra_gateway.node_plugin.events import node_event, record
from dra_gateway.node_plugin.facts import NodeFacts
from dra_gateway.node_plugin.faultfile import begin_following, watch_fault_file
from dra_gateway.node_plugin.faults import MIG_PLACEMENT_TAKEN, NVML_UNAVAILABLE
from dra_gateway.node_plugin.fence import FENCE_FILE, StateFence
from dra_gateway.node_plugin.health import (
    Health,
    Problem,
    devices_by_card,
    mig_instances,
    report_condition,
    transitions,
    watch_nvml,
)
from dra_gateway.node_plugin.legacy import Card, cards_of
from dra_gateway.node_plugin.metrics import Metrics
from dra_gateway.node_plugin.miginstances import MigInstances
from dra_gateway.node_plugin.nvml import Nvml
from dra_gateway.node_plugin.prepare import Preparer
from dra_gateway.node_plugin.publish import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS,
    Publisher,
)
from dra_gateway.node_plugin.server import (
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    DeviceHealthState,
    HealthFeed,
    PluginServer,
)
from dra_gateway.node_plugin.setupreport import find_setup, report_setup

log = logging.getLogger(__name__)

# The release a cluster that does not tell its version is taken to be (slices' layout).
_NEWEST_MINOR = 38


@dataclass(frozen=True, slots=True)
class PluginSettings:
    node_name: str
    driver: str = names.DRIVER
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    # This plugin pod's name among those of a rolling update (its UID): its sockets carry it, so
    # the kubelet keeps the old pod's until the new one has registered. "": one fixed socket.
    instance: str = ""
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/kubelet/plugins/gpu.dra-gateway.io")
    # How devices are published; its `consumable_capacity` is replaced by the mode below.
    devices: DeviceOptions = field(default_factory=DeviceOptions)
    # Whether the cluster keeps consumable-capacity fields: None detects it as the allocator
    # does (the default); True or False forces it.
    consumable_capacity: bool | None = None
    # Whether the cluster keeps device taints (DRADeviceTaints); else unhealthy devices are
    # withheld and reported through a Node condition. None: ask the API server (a dry-run
    # probe slice); withheld until it answers.
    device_taints: bool | None = False
    enforcement: cdi.EnforcementSettings = field(default_factory=cdi.EnforcementSettings)
    rediscover_seconds: float = 60.0
    # How often the HAMi-core library is looked for (installed or removed after the start).
    hami_check_seconds: float = 30.0
    # How long the health watcher waits before reopening NVML after it failed.
    nvml_retry_seconds: float = 30.0
    # How long a recovered device stays without a fault before its mark lifts (health.py);
    # 0: marks stay until an administrator clears them (they outlive restarts either way).
    recovery_seconds: float = 600.0
    # The first pause before writing the Node's health condition again after a failed write,
    # and before reading the Node again at start (doubling up to `max_retry_seconds`).
    retry_seconds: float = 1.0
    max_retry_seconds: float = 30.0
    # How often an instance waiting for the state directory's fence (fence.py) tries it.
    fence_poll_seconds: float = 0.5
    # While a device is marked, how often the Node's annotations are read for an
    # administrator's clear or keep (kube/device_health.py).
    admin_check_seconds: float = 10.0
    # Health events from a file (faultfile.py), for nodes without NVML.
    fault_file: Path | None = None
    # Consumable-capacity detection: how long one attempt may take, and the first pause
    # before asking again while undecided (doubling up to a minute).
    detect_timeout_seconds: float = 10.0
    detect_retry_seconds: float = 5.0
    # Coexistence with a legacy GPU device plugin (ARCHITECTURE.md, "Moving a live cluster"):
    # cards it offers or its pods hold are never published.
    coexistence: CoexistenceSettings = field(default_factory=CoexistenceSettings)
    # MIG on demand (the plugin is given a `MigInstances`): with a label key, only while this
    # node's Node carries it with the value "true" (read at the start); "": on every node.
    mig_on_demand_label: str = ""


class NodePlugin:
    def __init__(self, settings: PluginSettings, cluster: Cluster, *,
                 discover: Callable[[], NodeFacts],
                 nvml_factory: Callable[[], Nvml] | None = None,
                 metrics: Metrics | None = None, mig: MigInstances | None = None) -> None:
        self.settings = settings
        self._cluster = cluster
        self._discover = discover
        self._nvml_factory = nvml_factory
        self.metrics = metrics or Metrics()
        self.facts = NodeFacts()
        self._table: dict[str, DeviceInfo] = {}
        # MIG on demand: the instances' maker, whether this node is opted in (decided at the
        # start where a label says), the facts as discovered (with every MIG card's geometry)
        # and the placements the plugin had made when they were (not an administrator's).
        self.mig = mig
        self.mig_on_demand = mig is not None and not settings.mig_on_demand_label
        self._discovered = NodeFacts()
        self._made: Made = frozenset()
        self._look_again_now = asyncio.Event()
        self._failed_to_make: set[str] = set()  # devices whose instance could not be made
        # The consumable-capacity mode: None until forced or detected.
        self.consumable_capacity: bool | None = None
        self._options = replace(settings.devices, consumable_capacity=(
            CONSUMABLE_CAPACITY_FALLBACK if settings.consumable_capacity is None
            else settings.consumable_capacity), hami_core=self._hami_core_present())
        self.health = Health(driver=settings.driver, on_change=self._health_changed,
                             metrics=self.metrics, recovery_seconds=settings.recovery_seconds)
        self.coexistence = LegacyCoexistence(
            settings.coexistence, cluster, node_name=settings.node_name, cards=self.cards,
            on_change=self._legacy_changed, published=self._slices_published,
            metrics=self.metrics)
        self.publisher = Publisher(
            cluster, node_name=settings.node_name, driver=settings.driver,
            max_devices=MAX_DEVICES_PER_SLICE if settings.device_taints is False
            else MAX_DEVICES_PER_SLICE_WITH_TAINTS, metrics=self.metrics)
        # Whether unhealthy devices are tainted (else withheld): forced, or once detected.
        self.device_taints = bool(settings.device_taints)
        self.preparer = Preparer(
            cluster, node_name=settings.node_name, driver=settings.driver,
            cdi_dir=settings.cdi_dir, state_dir=settings.state_dir, devices=self.device_table,
            enforcement=settings.enforcement, metrics=self.metrics, mig=mig,
            on_mig_failure=self._look_again)
        self.health_feed = HealthFeed(self._device_health)
        self.server = PluginServer(self.preparer, driver=settings.driver,
                                   plugins_dir=settings.plugins_dir,
                                   registry_dir=settings.registry_dir, health=self.health_feed,
                                   instance=settings.instance,
                                   on_registration=self._registration_status)
        self.fence = StateFence(settings.state_dir / FENCE_FILE,
                                holder=settings.instance or "")
        self._health_file = settings.state_dir / healthstate.HEALTH_FILE
        # Until this instance holds the fence and restored the marks, it tells the kubelet
        # nothing of the devices' health (Unknown) rather than "healthy".
        self._restored = False
        self.preparer.hold()
        self._registered = False
        self._health_reported: dict[str, Problem] = {}  # the marks the last Events told of
        self._condition_wanted = asyncio.Event()
        self._condition_wanted.set()
        self._orders_wanted = asyncio.Event()
        self._orders_told: tuple[str, ...] = ()
        self._background: set[asyncio.Task[Any]] = set()

    def _registration_status(self, registered: bool) -> None:
        self._registered = registered
        self.metrics.registered.set(1 if registered else 0)

    def readiness(self) -> str:
        """Why the plugin is not ready yet ("" once the kubelet registered it and its slices
        were published): a rolling update waits for this before it stops the old pod. Later
        republishing (a fault, a legacy change) keeps it ready."""
        if not self._registered:
            return ("the kubelet has not registered the plugin yet (it watches "
                    f"{self.server.registration_socket.parent})")
        if not self.fence.held:
            # The new pod of a rolling update: ready, so that the old pod, which publishes
            # until it stops, is stopped and hands the fence over.
            return ""
        if not self.publisher.published_once:
            return "the node's ResourceSlices are not published yet"
        return ""

    def device_table(self) -> Mapping[str, DeviceInfo]:
        """The devices a claim may be prepared on: a device a legacy plugin may hand out is
        left out, so a claim allocated on it (before a legacy plugin came back) fails to
        prepare, and the kubelet retries, instead of sharing the card with a legacy pod."""
        legacy = self.coexistence.withheld()
        if not legacy:
            return self._table
        return {name: info for name, info in self._table.items() if name not in legacy}

    def cards(self) -> tuple[Card, ...]:
        return cards_of(self.facts, self._table)

    def devices(self) -> list[dict[str, Any]]:
        """The devices to publish now, with health applied as the cluster allows and every
        device a legacy plugin may hand out left out."""
        legacy = self.coexistence.withheld()
        if self.device_taints:
            return devices_of(self.facts, self._options, taints=self.health.taints(),
                              withheld=legacy, made=self._made)
        return devices_of(self.facts, self._options, withheld=self.health.withheld() | legacy,
                          made=self._made)

    def counter_sets(self) -> list[dict[str, Any]]:
        """The counter sets of the cards cut on demand, where the cluster keeps them."""
        if not self._options.partitionable_devices:
            return []
        return counter_sets_of(self.facts, self._made)

    def _publish(self) -> None:
        self.publisher.set_devices(self.devices(), self.counter_sets())

    def _set_facts(self, facts: NodeFacts, made: Made = frozenset()) -> None:
        self._discovered, self._made = facts, made
        if not self.mig_on_demand:  # discovery read the geometry; this node is not opted in
            facts = NodeFacts(gpus=tuple(replace(g, mig_geometry=None) for g in facts.gpus))
        self.facts = facts
        self._table = device_table(facts, self._options, made)
        self.coexistence.refresh()  # new cards are judged on the last answers at once
        self._publish()
        self.health_feed.changed()

    def _look_again(self, devices: Sequence[str]) -> None:
        self._failed_to_make.update(devices)
        self._look_again_now.set()

    def _judge_placements(self) -> None:
        """A placement whose instance could not be made because an instance made by hand
        overlaps it is marked (fatal: the pod holding it is evicted and placed again
        elsewhere); a marked one whose slices are free again recovers."""
        failed, self._failed_to_make = self._failed_to_make, set()
        problems = self.health.problems
        for name in sorted(failed | {d for d, p in problems.items()
                                     if p.reason == MIG_PLACEMENT_TAKEN}):
            info = self._table.get(name)
            overlap = None if info is None or info.make is None else hand_made_overlap(
                self.facts, info.make, self._made)
            if overlap is not None and name in failed:
                log.warning("MIG placement %s cannot be made: instance %s (%s at memory slice "
                            "%s) was made by hand over it; the claim holding it is let go",
                            name, overlap.uuid, overlap.profile, overlap.placement_start)
                self.health.mark([name], MIG_PLACEMENT_TAKEN)
            elif overlap is None and name in problems:
                self.health.recovered([name], "no instance made by hand overlaps it any more",
                                      reason=MIG_PLACEMENT_TAKEN)

    async def _keep_discovering(self) -> None:
        """MIG on demand: discover again every `rediscover_seconds`, and at once after an
        instance could not be made, so that instances an administrator makes or destroys by
        hand are published as they are and their slices leave the card's counters (until then
        the allocator may give out a placement they overlap, and its prepare fails). A failed
        discovery keeps what was published."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.rediscover_seconds):
                    await self._look_again_now.wait()
            self._look_again_now.clear()
            assert self.mig is not None
            before = self.mig.placements()
            try:
                facts = await asyncio.to_thread(self._discover)
            except DiscoveryError as exc:
                log.warning("GPU discovery failed again (%s); the devices published stay as "
                            "they were", exc)
                continue
            made = before | self.mig.placements()
            if facts != self._discovered or made != self._made:
                log.info("the node's GPUs changed since the last discovery (MIG instances "
                         "made or destroyed by hand); publishing them as they are now")
                self._set_facts(facts, made)
            self._judge_placements()

    def _refresh(self) -> None:
        """The devices and their table again from the last discovery (a mode changed)."""
        self._set_facts(self._discovered, self._made)

    def _legacy_changed(self) -> None:
        self._publish()

    async def _slices_published(self) -> None:
        """Until the slices show the devices set last (the publisher's pass after a change)."""
        await self.publisher.synced.wait()

    # Consumable capacity --------------------------------------------------------------------

    async def settle_consumable_capacity(self) -> bool | None:
        """Force or detect the mode; while undecided, keep asking in the background."""
        forced = self.settings.consumable_capacity
        if forced is not None:
            self._set_capacity_mode(forced, "forced by --consumable-capacity"
                                    if forced else "forced by --no-consumable-capacity")
            return forced
        verdict, how = await self._detect_consumable_capacity()
        if verdict is not None:
            self._set_capacity_mode(verdict, how)
            return verdict
        self.metrics.consumable_capacity.set(1 if self._options.consumable_capacity else 0)
        self.metrics.consumable_capacity_detected.set(0)
        log.warning("cannot tell whether the API server keeps consumable capacity (%s): "
                    "publishing shared cards %s meanwhile and asking again", how,
                    "with allowMultipleAllocations (a server without DRAConsumableCapacity "
                    "drops it)" if self._options.consumable_capacity else
                    "without consumable-capacity fields",
                    extra={"consumableCapacity": self._options.consumable_capacity,
                           "detectedBy": "fallback"})
        self._spawn(self._detect_until_known(), "consumable-capacity-detection")
        return None

    async def settle_device_taints(self) -> None:
        """Ask the API server whether it keeps device taints; while it cannot tell, unhealthy
        devices are withheld and it is asked again in the background."""
        if await self._detect_device_taints():
            return
        self._spawn(self._detect_device_taints_until_known(), "device-taints-detection")

    async def _detect_device_taints(self) -> bool:
        """One attempt; True once known."""
        try:
            async with asyncio.timeout(self.settings.detect_timeout_seconds):
                verdict = await detect_device_taints(self._cluster, driver=self.settings.driver,
                                                     node_name=self.settings.node_name)
        except ApiError as err:
            log.warning("cannot tell whether the API server keeps device taints: %s",
                        err.message)
            return False
        except (OSError, TimeoutError) as err:
            log.warning("cannot tell whether the API server keeps device taints: %r", err)
            return False
        if verdict is None:
            return False
        log.info("unhealthy devices are %s", "tainted (the API server keeps device taints)"
                 if verdict else "withheld (the API server drops device taints)",
                 extra={"deviceTaints": verdict})
        if verdict != self.device_taints:
            self.device_taints = verdict
            self._health_changed()
        return True

    async def _detect_device_taints_until_known(self) -> None:
        delay = self.settings.detect_retry_seconds
        while not await self._detect_device_taints():
            await asyncio.sleep(delay)
            delay = min(60.0, delay * 2)

    async def _detect_consumable_capacity(self) -> tuple[bool | None, str]:
        try:
            async with asyncio.timeout(self.settings.detect_timeout_seconds):
                verdict, how = await detect_consumable_capacity(
                    self._cluster, driver=self.settings.driver,
                    node_name=self.settings.node_name)
        except ApiError as err:
            return None, f"detection failed: {err.message}"
        except (OSError, TimeoutError) as err:
            return None, f"detection failed: {err!r}"
        if how == BY_PUBLISHED_SLICES and verdict is not True:
            # Slices without the field prove nothing: their plugins may not have sent it.
            return None, "the dry-run probe was refused and no published slice kept " \
                         "allowMultipleAllocations"
        return verdict, how

    async def _read_back_own_slices(self) -> bool | None:
        """What the API server kept of the fields this node sent (None: nothing sent yet)."""
        if not self.publisher.synced.is_set() or not any(
                d.get("allowMultipleAllocations") for d in self.devices()):
            return None
        try:
            listed = await self._cluster.list(
                RESOURCE_SLICES, field_selector=f"spec.nodeName={self.settings.node_name},"
                f"spec.driver={self.settings.driver}")
        except ApiError:
            return None
        return slices_show_consumable_capacity(listed.items)

    async def _detect_until_known(self) -> None:
        delay = self.settings.detect_retry_seconds
        while True:
            await asyncio.sleep(delay)
            verdict, how = await self._detect_consumable_capacity()
            if verdict is None:
                verdict, how = await self._read_back_own_slices(), "this node's published slices"
            if verdict is not None:
                self._set_capacity_mode(verdict, how)
                return
            delay = min(delay * 2, 60.0)

    def _set_capacity_mode(self, enabled: bool, how: str) -> None:
        self.consumable_capacity = enabled
        self.metrics.consumable_capacity.set(1 if enabled else 0)
        self.metrics.consumable_capacity_detected.set(1)
        log.info("consumable capacity %s (%s)", "on: shared cards are published with "
                 "allowMultipleAllocations and request policies" if enabled else "off: shared "
                 "cards are published without consumable-capacity fields and the allocator "
                 "records shares in claim annotations", how,
                 extra={"consumableCapacity": enabled, "detectedBy": how})
        if self._options.consumable_capacity != enabled:
            self._options = replace(self._options, consumable_capacity=enabled)
            self._refresh()  # republish (nothing before the first discovery)

    # MIG on demand ----------------------------------------------------------------------------

    async def settle_mig_on_demand(self) -> None:
        """Whether this node is opted in (its label, where one is asked for), and how its cards
        cut on demand are published: with counter sets where the API server keeps them
        (DRAPartitionableDevices), laid out as its release wants (1.34: beside the devices;
        from 1.35: apart, and at most 64 devices a slice). Where the server drops the fields
        the devices' attributes say the same, and the allocator counts those."""
        label = self.settings.mig_on_demand_label
        if label:
            node = await self._read_node(until_read=True) or {}
            self.mig_on_demand = objects.labels(node).get(label) == "true"
            log.info("MIG on demand %s on node %s (label %s=%s)",
                     "on" if self.mig_on_demand else "off", self.settings.node_name, label,
                     objects.labels(node).get(label, "<unset>"))
        if not self.mig_on_demand:
            self._refresh()
            return
        minor = await self._server_minor()
        verdict = await self._detect_partitionable()
        self.publisher.set_layout(
            max_devices=MAX_DEVICES_PER_SLICE_WITH_TAINTS if verdict
            else self.publisher.max_devices, counters_apart=minor >= 35)
        log.info("MIG on demand on node %s: cards in MIG mode publish every profile at every "
                 "placement, %s", self.settings.node_name,
                 "with counter sets (the API server keeps them)" if verdict else
                 "their counters in attributes (the API server drops counter sets)",
                 extra={"partitionableDevices": verdict, "serverMinor": minor})
        self._options = replace(self._options, partitionable_devices=bool(verdict))
        self._refresh()

    async def _server_minor(self) -> int:
        """The API server's minor version, asked until it answers (the layout depends on it);
        a cluster that cannot say counts as the newest."""
        if not isinstance(self._cluster, Discovery):
            return _NEWEST_MINOR
        delay = self.settings.retry_seconds
        while True:
            try:
                version = await self._cluster.server_version()
                return int(str(version.get("minor", "")).rstrip("+"))
            except (ApiError, OSError, TimeoutError, ValueError) as exc:
                log.warning("could not read the API server's version (slices of cards cut on "
                            "demand are laid out by release): %r; retrying in %.0fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.max_retry_seconds)

    async def _detect_partitionable(self) -> bool:
        """Whether the API server keeps counter sets; unknown (the probe refused) counts as
        not: the attributes alone then tell the allocator, and no slice is refused."""
        try:
            async with asyncio.timeout(self.settings.detect_timeout_seconds):
                verdict = await detect_partitionable_devices(
                    self._cluster, driver=self.settings.driver, node_name=self.settings.node_name)
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("cannot tell whether the API server keeps counter sets: %r", exc)
            return False
        return bool(verdict)

    # HAMi-core --------------------------------------------------------------------------------

    def _hami_core_present(self) -> bool:
        """Whether a share HAMi-core enforces can be prepared here: its library is on the node
        (where the plugin does not mount it, the containers' images bring it)."""
        enforcement = self.settings.enforcement
        return not enforcement.mount_hami_library or cdi.hami_library_present(
            enforcement.hami_library)

    def check_hami_core(self) -> None:
        """Look for the library again; republish when it came or went."""
        present = self._hami_core_present()
        if present == self._options.hami_core:
            return
        self._options = replace(self._options, hami_core=present)
        log.info("HAMi-core library %s %s: cards are published with %s=%s",
                 self.settings.enforcement.hami_library,
                 "found" if present else "gone", names.ATTR_HAMI_CORE, str(present).lower(),
                 extra={"hamiCore": present})
        self._refresh()

    async def _watch_hami_core(self) -> None:
        while True:
            await asyncio.sleep(self.settings.hami_check_seconds)
            self.check_hami_core()

    async def _report_setup(self) -> None:
        """Say on the Node what the plugin found there (setupreport.py): at the start, then
        whenever it changes, looked at as often as HAMi-core's library; a failed write is tried
        again with backoff."""
        written: NodeSetup | None = None
        delay = self.settings.retry_seconds
        while True:
            found = await asyncio.to_thread(find_setup, self.settings.cdi_dir,
                                            self.settings.enforcement)
            if found == written:
                await asyncio.sleep(self.settings.hami_check_seconds)
            elif await report_setup(self._cluster, self.settings.node_name, found):
                written, delay = found, self.settings.retry_seconds
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.max_retry_seconds)

    def _device_health(self) -> list[DeviceHealthState]:
        """Every device of the node and its health, for the kubelet (DRAResourceHealth);
        nothing before the marks of an earlier run are restored."""
        if not self._restored:
            return []
        problems = self.health.problems
        states = []
        for name in sorted(self._table):
            problem = problems.get(name)
            states.append(DeviceHealthState(
                self.settings.node_name, name, problem is None,
                "" if problem is None else f"{problem.reason} ({problem.severity} fault) since "
                                           f"{problem.since}"))
        return states

    def _health_changed(self) -> None:
        self.health_feed.changed()
        self._publish()
        now = self.health.problems
        for change in transitions(self._health_reported, now, tainted=self.device_taints,
                                  lifted_because=self.health.lifted_because):
            event = node_event(self.settings.node_name, type_=change.type, reason=change.reason,
                               message=change.message, instance=self.settings.node_name)
            self._spawn(record(self._cluster, event, node=self.settings.node_name),
                        f"event-{change.device}")
        self._health_reported = now
        self.health.lifted_because.clear()
        self._save_health()
        self._condition_wanted.set()
        self._orders_wanted.set()

    def _save_health(self) -> None:
        """Persist the marks (healthstate.py), before the condition is written: the file is
        never older than the condition. Only the fence's holder writes it."""
        if not self.fence.held or not self._restored:
            return
        try:
            healthstate.save(self._health_file, self.health.saved())
        except OSError as exc:
            log.error("could not save the device health marks to %s: %s; the Node's condition "
                      "keeps them meanwhile", self._health_file, exc)

    async def restore_health(self) -> None:
        """Take back the marks of an earlier run before anything is published: from the state
        file, else from the Node's condition (read until it answers: without either, the first
        condition written would say every device is healthy); then the administrator's keep
        and clear on the Node, read once whether or not anything is marked."""
        saved = healthstate.load(self._health_file)
        node = await self._read_node(until_read=saved is None)
        if saved is None and node is not None:
            saved = healthstate.from_node(node, recovery_seconds=self.settings.recovery_seconds)
        if saved is not None:
            if self._nvml_factory is None:
                # Only NVML answering again clears an outage's marks: without NVML, none.
                saved = replace(saved, marks=tuple(
                    m for m in saved.marks if m.reason != NVML_UNAVAILABLE))
            self.health.restore(saved)
            if saved.marks or saved.kept:
                log.warning("restored %d device mark(s) from %s: %s%s", len(saved.marks),
                            saved.source, ", ".join(f"{m.device} ({m.reason}, {m.severity}, "
                                                    f"since {m.since})" for m in saved.marks)
                            or "none", f"; kept: {', '.join(sorted(saved.kept))}"
                            if saved.kept else "")
        self._health_reported = self.health.problems
        self._restored = True
        self._publish()
        self.health_feed.changed()
        self._save_health()
        if node is not None:
            self._apply_orders(node)

    async def _read_node(self, *, until_read: bool) -> Mapping[str, Any] | None:
        """This plugin's Node ({} when there is none); None when it could not be read and
        `until_read` is false."""
        delay = self.settings.retry_seconds
        while True:
            try:
                return await self._cluster.get(NODES, self.settings.node_name)
            except NotFound:
                return {}
            except ApiError as exc:
                why = f"{exc.message} ({exc.reason})"
            except (OSError, TimeoutError) as exc:
                why = repr(exc)
            if not until_read:
                log.warning("could not read Node %s for its device health annotations: %s",
                            self.settings.node_name, why)
                return None
            log.warning("could not read Node %s for the device marks of an earlier run: %s; "
                        "publishing nothing until it answers (retrying in %.0fs)",
                        self.settings.node_name, why, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.max_retry_seconds)

    def _apply_orders(self, node: Mapping[str, Any]) -> None:
        orders = admin_orders(objects.annotations(node))
        if orders.problems != self._orders_told:
            for problem in orders.problems:
                log.warning("Node %s: %s", self.settings.node_name, problem)
            self._orders_told = orders.problems
        self.health.apply_orders(orders)

    async def _report_condition(self) -> None:
        """The one writer of the Node's health condition: the latest marks, once per burst of
        changes, in order, a failed write tried again with backoff until one lands (where the
        cluster keeps no device taints the allocator drains by this condition alone). The
        first write at the start carries the marks restored from an earlier run."""
        delay = self.settings.retry_seconds
        while True:
            await self._condition_wanted.wait()
            self._condition_wanted.clear()
            if await report_condition(self._cluster, self.settings.node_name, self.health,
                                      tainted=self.device_taints):
                delay = self.settings.retry_seconds
                continue
            self._condition_wanted.set()  # the latest marks, whatever changed meanwhile
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.max_retry_seconds)

    async def _follow_admin_orders(self) -> None:
        """While a device is marked, read the Node's annotations (a clear, a keep) every
        `admin_check_seconds`, and at once when the marks change (a device kept beforehand
        stays out from its first fault); a healthy node is not read."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.admin_check_seconds):
                    await self._orders_wanted.wait()
            self._orders_wanted.clear()
            if not self.health.problems and not self.health.kept:
                continue
            node = await self._read_node(until_read=False)
            if node is not None:
                self._apply_orders(node)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def discover_once(self) -> bool:
        """Discover and publish; False (and an empty pool) when discovery failed."""
        # The instances this plugin made are told apart from an administrator's by the journal,
        # as it stood on either side of the discovery (one may be made meanwhile).
        before = self.mig.placements() if self.mig is not None else frozenset()
        try:
            facts = await asyncio.to_thread(self._discover)
        except DiscoveryError as exc:
            if exc.nvml:
                self.metrics.nvml_up.set(0)
            log.error("GPU discovery failed: %s; publishing no devices and retrying in %.0fs",
                      exc, self.settings.rediscover_seconds)
            self._set_facts(NodeFacts())
            return False
        if self._nvml_factory is not None:
            self.metrics.nvml_up.set(1)
        self._set_facts(facts, before | (self.mig.placements() if self.mig is not None
                                         else frozenset()))
        log.info("discovered %d GPU(s) on node %s", len(facts.gpus), self.settings.node_name)
        return True

    async def run(self, *, started: asyncio.Event | None = None) -> None:
        """Serve until cancelled."""
        ok = await self.discover_once()
        # The sockets first: the kubelet registers this instance while an older one (a
        # rolling update's) still holds the fence, and the update can go on.
        await self.server.start()
        try:
            await self.fence.acquire(self.settings.fence_poll_seconds)
            self.preparer.recover()  # the checkpoint as the fence's last holder left it
            await self.restore_health()
            # Before the first publish, so that it already has the mode the allocator sees.
            await self.settle_consumable_capacity()
            if self.mig is not None:
                await self.settle_mig_on_demand()
            if self.settings.device_taints is None:
                await self.settle_device_taints()
            # Before the first publish too: until the kubelet has said what legacy pods hold,
            # every card is withheld, and the first publish shows what may really be offered.
            if self.settings.coexistence.enabled:
                await self.coexistence.check()
                self._spawn(self.coexistence.run(), "legacy-coexistence")
            self._spawn(self.publisher.run(), "publisher")
            while not ok:
                if started is not None:
                    started.set()
                await asyncio.sleep(self.settings.rediscover_seconds)
                ok = await self.discover_once()
            if self._nvml_factory is not None:
                self._spawn(watch_nvml(health=self.health, nvml_factory=self._nvml_factory,
                                       cards=devices_by_card(self._table),
                                       instances=mig_instances(self._table),
                                       metrics=self.metrics,
                                       retry_seconds=self.settings.nvml_retry_seconds),
                            "nvml-health")
            if self.mig is not None:
                self._spawn(self._keep_discovering(), "rediscovery")
            if self.settings.fault_file is not None:
                self._spawn(watch_fault_file(begin_following(self.settings.fault_file),
                                             health=self.health,
                                             table=lambda: self._table), "fault-file")
            if not self._options.hami_core:
                log.warning("no HAMi-core library at %s on node %s: shares enforced by "
                            "HAMi-core are not placed here (cards publish %s=false) until it "
                            "is installed", self.settings.enforcement.hami_library,
                            self.settings.node_name, names.ATTR_HAMI_CORE)
            self._spawn(self._watch_hami_core(), "hami-core")
            self._spawn(self._report_setup(), "node-setup")
            self._spawn(self.server.keep_sockets(), "sockets")
            if self.settings.recovery_seconds > 0:
                self._spawn(self.health.run_recovery(
                    min(5.0, self.settings.recovery_seconds / 10)), "health-recovery")
            self._spawn(self._report_condition(), "node-condition")
            self._spawn(self._follow_admin_orders(), "device-health-orders")
            if started is not None:
                started.set()
            await asyncio.Event().wait()
        finally:
            for task in list(self._background):
                task.cancel()
            for task in list(self._background):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.server.stop()
            self.fence.release()
