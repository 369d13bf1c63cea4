"""The running node plugin: discovery, publishing, health, the kubelet's sockets, together.

`NodePlugin.run()` repairs the checkpoint, starts the DRA and registration sockets, publishes the
node's slices and watches health until cancelled. It must never crash-loop a node: a failed
NVML discovery publishes an empty pool ("no healthy devices"), logs why, and tries again; a
failed API call is retried by the publisher. Settings come in explicitly, nothing is global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.devices import DeviceInfo, DeviceOptions, device_table, devices_of
from dra_gateway.node_plugin.discovery import DiscoveryError
from dra_gateway.node_plugin.facts import NodeFacts
from dra_gateway.node_plugin.health import (
    Health,
    devices_by_card,
    mig_instances,
    report_condition,
    watch_nvml,
)
from dra_gateway.node_plugin.metrics import Metrics
from dra_gateway.node_plugin.nvml import Nvml
from dra_gateway.node_plugin.prepare import Preparer
from dra_gateway.node_plugin.publish import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS,
    Publisher,
)
from dra_gateway.node_plugin.server import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, PluginServer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PluginSettings:
    node_name: str
    driver: str = names.DRIVER
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    cdi_dir: Path = Path("/var/run/cdi")
    state_dir: Path = Path("/var/lib/kubelet/plugins/gpu.dra-gateway.io")
    devices: DeviceOptions = field(default_factory=DeviceOptions)
    # Whether the cluster keeps device taints (DRADeviceTaints); else unhealthy devices are
    # withheld and reported through a Node condition.
    device_taints: bool = False
    enforcement: cdi.EnforcementSettings = field(default_factory=cdi.EnforcementSettings)
    rediscover_seconds: float = 60.0
    # How long the health watcher waits before reopening NVML after it failed.
    nvml_retry_seconds: float = 30.0


class NodePlugin:
    def __init__(self, settings: PluginSettings, cluster: Cluster, *,
                 discover: Callable[[], NodeFacts],
                 nvml_factory: Callable[[], Nvml] | None = None,
                 metrics: Metrics | None = None) -> None:
        self.settings = settings
        self._cluster = cluster
        self._discover = discover
        self._nvml_factory = nvml_factory
        self.metrics = metrics or Metrics()
        self.facts = NodeFacts()
        self._table: dict[str, DeviceInfo] = {}
        self.health = Health(driver=settings.driver, on_change=self._health_changed,
                             metrics=self.metrics)
        self.publisher = Publisher(
            cluster, node_name=settings.node_name, driver=settings.driver,
            max_devices=MAX_DEVICES_PER_SLICE_WITH_TAINTS if settings.device_taints
            else MAX_DEVICES_PER_SLICE, metrics=self.metrics)
        self.preparer = Preparer(
            cluster, node_name=settings.node_name, driver=settings.driver,
            cdi_dir=settings.cdi_dir, state_dir=settings.state_dir, devices=self.device_table,
            enforcement=settings.enforcement, metrics=self.metrics)
        self.server = PluginServer(self.preparer, driver=settings.driver,
                                   plugins_dir=settings.plugins_dir,
                                   registry_dir=settings.registry_dir)
        self._background: set[asyncio.Task[Any]] = set()

    def device_table(self) -> Mapping[str, DeviceInfo]:
        return self._table

    def devices(self) -> list[dict[str, Any]]:
        """The devices to publish now, with health applied as the cluster allows."""
        if self.settings.device_taints:
            return devices_of(self.facts, self.settings.devices, taints=self.health.taints())
        return devices_of(self.facts, self.settings.devices, withheld=self.health.withheld())

    def _set_facts(self, facts: NodeFacts) -> None:
        self.facts = facts
        self._table = device_table(facts, self.settings.devices)
        self.publisher.set_devices(self.devices())

    def _health_changed(self) -> None:
        self.publisher.set_devices(self.devices())
        if not self.settings.device_taints:
            self._spawn(report_condition(self._cluster, self.settings.node_name, self.health),
                        "node-condition")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def discover_once(self) -> bool:
        """Discover and publish; False (and an empty pool) when discovery failed."""
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
        self._set_facts(facts)
        log.info("discovered %d GPU(s) on node %s", len(facts.gpus), self.settings.node_name)
        return True

    async def run(self, *, started: asyncio.Event | None = None) -> None:
        """Serve until cancelled."""
        self.preparer.recover()
        ok = await self.discover_once()
        await self.server.start()
        try:
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
