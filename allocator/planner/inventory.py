"""What the cluster has: devices per node, device classes, and nodes' allocatable and taints.

`Inventory` keeps the published devices (from ResourceSlices: only the highest generation of
each pool, per node in slice order), the DeviceClasses with their selectors compiled, and what
each Node allows (CPU, memory, taints, labels). It knows nothing of who holds what (`ledger`)
nor of memoised searches (`caches`); its updates return the nodes whose devices changed, and
the `ClusterState` composing them tells the node classes.

`Interner` gives small ids to device content and to the signatures built from them: the ids
enter node class keys, so one table serves the inventory and the node classes.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner import counters, kubefit
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.settings import PlannerSettings
from dra_gateway.gpu.mig import Geometry
from dra_gateway.kube import names, objects


@dataclass(slots=True)
class DeviceClassInfo:
    name: str
    selectors: tuple[Any, ...]
    expressions: tuple[str, ...]
    configs: tuple[Mapping[str, Any], ...]
    error: str | None = None


@dataclass(slots=True)
class NodeInfo:
    name: str
    cpu: int = 0  # allocatable, milli
    memory: int = 0  # allocatable, bytes
    taints: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    known: bool = False  # a Node object was seen (slices may come first)


class Interner:
    """Small ids for hashable values, in order of first sight."""

    def __init__(self) -> None:
        self._ids: dict[object, int] = {}

    def id_of(self, value: object) -> int:
        ident = self._ids.get(value)
        if ident is None:
            ident = len(self._ids)
            self._ids[value] = ident
        return ident


class Inventory:
    """Slices, pools and devices per node, device classes, and nodes."""

    def __init__(self, settings: PlannerSettings, interner: Interner) -> None:
        self.settings = settings
        self.intern = interner.id_of
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._pool_generation: dict[tuple[str, str], int] = {}
        self._pool_slices: dict[tuple[str, str], set[str]] = {}
        self._pool_devices: dict[tuple[str, str], list[Device]] = {}
        self._pool_counters: dict[tuple[str, str], dict[counters.CounterKey, int]] = {}
        self._node_pools: dict[str, set[tuple[str, str]]] = {}
        self.devices: dict[tuple[str, str, str], Device] = {}
        self.node_devices: dict[str, list[Device]] = {}
        # Partitionable devices: the counter sets of each node's pools (absent: none), and the
        # MIG geometry of each set its devices draw as placements (`counters.geometry`).
        self.node_counters: dict[str, dict[counters.CounterKey, int]] = {}
        self.node_mig: dict[str, dict[counters.SetKey, Geometry]] = {}
        self.classes: dict[str, DeviceClassInfo] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self._serial = 0
        self._smallest: int | None = None

    # --- slices -------------------------------------------------------------------------------

    def set_slice(self, obj: Mapping[str, Any]) -> set[str]:
        """Index a ResourceSlice; the nodes whose devices were listed again."""
        name = objects.name(obj)
        old = self._slices.get(name)
        if old is not None:
            self._unindex_pool(old)
        self._slices[name] = obj
        pool = self._pool_of(obj)
        self._pool_slices.setdefault(pool, set()).add(name)
        return self._rebuild_pool(pool)

    def remove_slice(self, name: str) -> set[str] | None:
        """Forget a ResourceSlice; the nodes whose devices were listed again (None: unknown)."""
        old = self._slices.pop(name, None)
        if old is None:
            return None
        self._unindex_pool(old)
        return self._rebuild_pool(self._pool_of(old))

    @staticmethod
    def _pool_of(obj: Mapping[str, Any]) -> tuple[str, str]:
        spec = obj.get("spec") or {}
        return (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))

    def _unindex_pool(self, obj: Mapping[str, Any]) -> None:
        slices = self._pool_slices.get(self._pool_of(obj))
        if slices is not None:
            slices.discard(objects.name(obj))

    def _rebuild_pool(self, pool: tuple[str, str]) -> set[str]:
        """Replace the pool's devices by those of its highest generation (upstream rule)."""
        names_ = self._pool_slices.get(pool, set())
        slices = [self._slices[n] for n in sorted(names_) if n in self._slices]
        touched: set[str] = set()
        self._smallest = None
        for device in self._pool_devices.pop(pool, ()):
            self.devices.pop(device.key, None)
            if device.node is not None:
                touched.add(device.node)
        self._pool_counters.pop(pool, None)
        if not slices:
            self._pool_slices.pop(pool, None)
            self._pool_generation.pop(pool, None)
        else:
            top = max(int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))
                      for s in slices)
            self._pool_generation[pool] = top
            devices: list[Device] = []
            totals: dict[counters.CounterKey, int] = {}
            for s in slices:
                spec = s.get("spec") or {}
                if int((spec.get("pool") or {}).get("generation", 0)) != top:
                    continue
                totals.update(counters.shared_counters(pool[0], pool[1], spec))
                node = spec.get("nodeName")
                for raw in spec.get("devices") or ():
                    device = Device(driver=pool[0], pool=pool[1], node=node, raw=raw,
                                    consumable_capacity=self.settings.consumable_capacity)
                    device.group_id = self.intern(device.group)
                    self._serial += 1
                    device.serial = self._serial
                    self.devices[device.key] = device
                    devices.append(device)
                    if node:
                        touched.add(node)
                        self._node_pools.setdefault(node, set()).add(pool)
            self._pool_devices[pool] = devices
            # Where the API dropped the fields, the gateway's cards declare their sets, less
            # what instances made by hand hold.
            fallback: dict[counters.CounterKey, int] = {}
            for device in devices:
                fallback.update(counters.declared(pool[0], pool[1], device.raw,
                                                  device.attributes))
            for device in devices:
                for key, value in counters.standing(pool[0], pool[1], device.raw,
                                                    device.attributes).items():
                    fallback[key] = fallback.get(key, 0) - value
            for key, value in fallback.items():
                totals.setdefault(key, value)
            if totals:
                self._pool_counters[pool] = totals
        for node in touched:
            self._reindex_node_devices(node)
        return touched

    def _reindex_node_devices(self, node: str) -> None:
        # Slice order: pools by (driver, pool) name, devices as published (stable across
        # restarts because the node plugin builds slices in sorted order).
        pools = sorted(p for p in self._node_pools.get(node, ()) if p in self._pool_devices)
        devices = [d for p in pools for d in self._pool_devices[p] if d.node == node]
        if devices:
            self.node_devices[node] = devices
        else:
            self.node_devices.pop(node, None)
            self._node_pools.pop(node, None)
        self._index_counters(node, pools, devices)
        self.nodes.setdefault(node, NodeInfo(node))

    def _index_counters(self, node: str, pools: list[tuple[str, str]],
                        devices: list[Device]) -> None:
        totals = {k: v for p in pools for k, v in self._pool_counters.get(p, {}).items()}
        self.node_counters.pop(node, None)
        self.node_mig.pop(node, None)
        if not totals and not any(d.counters for d in devices):
            return
        self.node_counters[node] = totals
        spots = []
        for device in devices:
            device.mig = counters.placement(device.counters,
                                            device.attributes.get(f"{device.driver}/"
                                                                  f"{names.ATTR_PROFILE}"),
                                            device.gpu_memory >> 20)
            if device.mig is not None:
                spots.append(device.mig)
        self.node_mig[node] = counters.geometry(totals, spots)

    def counter_sig(self, node: str) -> object:
        """What the node's counter sets hold, for its node class (None: no counters)."""
        totals = self.node_counters.get(node)
        return None if totals is None else tuple(sorted(totals.items()))

    def device_raw(self, key: tuple[str, str, str]) -> Mapping[str, Any] | None:
        device = self.devices.get(key)
        return device.raw if device is not None else None

    def smallest_card_memory(self) -> int:
        """Bytes of the smallest gateway GPU published (0 when none): a lower bound of what a
        whole card or a share relative to the card costs wherever it lands."""
        if self._smallest is None:
            self._smallest = min((d.gpu_memory for d in self.devices.values()
                                  if d.is_gateway_gpu), default=0)
        return self._smallest

    def typical_card_memory(self) -> int:
        sizes = sorted(d.gpu_memory for d in self.devices.values() if d.is_gateway_gpu)
        return sizes[len(sizes) // 2] if sizes else 16 << 30

    # --- classes and nodes --------------------------------------------------------------------

    def set_device_class(self, obj: Mapping[str, Any]) -> None:
        from dra_gateway.kube import cel

        name = objects.name(obj)
        spec = obj.get("spec") or {}
        selectors: list[Any] = []
        expressions: list[str] = []
        error = None
        for i, selector in enumerate(spec.get("selectors") or ()):
            expression = ((selector or {}).get("cel") or {}).get("expression", "")
            try:
                selectors.append(cel.compile_selector(expression))
                expressions.append(expression)
            except cel.CelError as exc:
                error = f"DeviceClass {name}: spec.selectors[{i}].cel.expression: {exc}"
        configs = tuple(c for c in spec.get("config") or () if c.get("opaque"))
        self.classes[name] = DeviceClassInfo(name, tuple(selectors), tuple(expressions), configs,
                                             error)

    def remove_device_class(self, name: str) -> None:
        self.classes.pop(name, None)

    def set_node(self, obj: Mapping[str, Any]) -> str:
        name = objects.name(obj)
        cpu, memory = kubefit.node_allocatable(obj)
        info = self.nodes.setdefault(name, NodeInfo(name))
        info.cpu, info.memory = cpu, memory
        info.taints = tuple(kubefit.node_taints(obj))
        info.labels = dict(objects.labels(obj))
        info.known = True
        return name

    def remove_node(self, name: str) -> bool:
        info = self.nodes.get(name)
        if info is None:
            return False
        info.known = False
        info.cpu = info.memory = 0
        return True


__all__ = ["DeviceClassInfo", "Interner", "Inventory", "NodeInfo"]
