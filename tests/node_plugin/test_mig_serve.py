"""MIG on demand switched on in the running node plugin (issue 47): discovery reads the geometry
of the cards in MIG mode, the plugin publishes them cut on demand with counter sets laid out as
the API server's release wants (or their counters in attributes where it drops the fields),
makes an allocated placement's instance at prepare and destroys it at unprepare; a node not
labelled where a label is asked for publishes its instances as they are; a restart tells the
instances it made from an administrator's by its journal. On the NVML stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.cli import main
from dra_gateway.devkit.migcards import MODELS
from dra_gateway.devkit.nvmlmig import MigNvml
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.standin_nvml import install
from dra_gateway.kube import names, objects
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin.devices import DeviceOptions
from dra_gateway.node_plugin.discovery import discover
from dra_gateway.node_plugin.faults import MIG_PLACEMENT_TAKEN
from dra_gateway.node_plugin.miginstances import MIG_JOURNAL_FILE, MigInstances
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings
from dra_gateway.node_plugin.prepare import ClaimRef

from .claimdata import NODE, claim
from .conftest import allocated

H100 = MODELS["NVIDIA H100 80GB HBM3"]
ONE_G = "gpu-0-mig-1g10gb-19-6"
LABEL = "gpu.dra-gateway.io/mig-on-demand"


class Release(MemoryCluster):
    """An API server of release 1.`minor`, keeping counter sets or (gate off) dropping them."""

    def __init__(self, minor: int, *, partitionable: bool = True) -> None:
        super().__init__()
        self.minor = minor
        self.partitionable = partitionable

    async def server_version(self) -> dict[str, Any]:
        return {**await super().server_version(), "minor": str(self.minor)}

    def _drop(self, rt: Any, obj: dict[str, Any]) -> dict[str, Any]:
        if rt is RESOURCE_SLICES and not self.partitionable:
            obj["spec"].pop("sharedCounters", None)
            for device in obj["spec"].get("devices") or []:
                device.pop("consumesCounters", None)
        return obj

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        return await super().create(rt, self._drop(rt, obj), namespace=namespace,
                                    dry_run=dry_run)

    async def update(self, rt: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return await super().update(rt, self._drop(rt, obj), **kw)


@contextlib.asynccontextmanager
async def serving(cluster: MemoryCluster, root: Path, nvml: MigNvml, *, label: str = "",
                  node_labels: dict[str, str] | None = None,
                  rediscover_seconds: float = 60.0,
                  recovery_seconds: float = 600.0) -> AsyncIterator[NodePlugin]:
    """The plugin as `serve --nvml --mig-on-demand` builds it, on the stand-in."""
    with contextlib.suppress(Exception):
        await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": node_labels or {}}})
    lib = nvml.module()
    settings = PluginSettings(node_name=NODE, plugins_dir=root / "plugins",
                              registry_dir=root / "registry", cdi_dir=root / "cdi",
                              state_dir=root / "state", devices=DeviceOptions(),
                              consumable_capacity=True, mig_on_demand_label=label,
                              rediscover_seconds=rediscover_seconds,
                              recovery_seconds=recovery_seconds)
    mig = MigInstances(lib, root / "state" / MIG_JOURNAL_FILE, session=True)
    plugin = NodePlugin(settings, cluster, mig=mig, discover=lambda: discover(
        nvml=True, nvml_lib=lib, mig_geometry=True))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    try:
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.wait_for(plugin.publisher.synced.wait(), 5)
        yield plugin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        mig.close()


async def _slices(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return sorted((await cluster.list(RESOURCE_SLICES)).items, key=objects.name)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def _ref(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


@pytest.mark.parametrize(("minor", "apart"), [(34, False), (36, True)])
async def test_a_card_in_mig_mode_is_published_cut_on_demand_as_its_release_wants(
        root: Path, minor: int, apart: bool) -> None:
    cluster = Release(minor)
    async with serving(cluster, root, MigNvml([H100, H100])):
        slices = await _slices(cluster)
    devices = _devices(slices)
    # The whole card and every profile at every placement NVML lists, per card.
    assert {"gpu-0", "gpu-1", ONE_G, "gpu-1-mig-7g80gb-0-0"} <= set(devices)
    assert len(devices) == 2 * (1 + sum(len(p.starts) for p in H100.geometry().profiles))
    assert devices[ONE_G]["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"
    sets = [(objects.name(s), [c["name"] for c in s["spec"].get("sharedCounters") or []])
            for s in slices if s["spec"].get("sharedCounters")]
    assert sorted(n for _, names_ in sets for n in names_) == ["gpu-0-counter-set",
                                                               "gpu-1-counter-set"]
    for obj in slices:
        # 1.34: a card's set beside its devices; from 1.35 sets in slices of their own, and at
        # most 64 devices a slice where devices draw on counters.
        if obj["spec"].get("sharedCounters"):
            assert bool(obj["spec"].get("devices")) is not apart
        assert len(obj["spec"].get("devices") or []) <= (64 if apart else 128)
        kubernetes_validate.validate(obj, f"1.{minor}", strict=True)


async def test_where_the_server_drops_counter_sets_the_attributes_say_the_same(
        root: Path) -> None:
    cluster = Release(34, partitionable=False)
    async with serving(cluster, root, MigNvml([H100])):
        slices = await _slices(cluster)
    assert not any(s["spec"].get("sharedCounters") for s in slices)
    one = _devices(slices)[ONE_G]
    assert "consumesCounters" not in one
    assert one["attributes"][names.ATTR_COUNTER_SET] == {"string": "gpu-0-counter-set"}
    assert one["attributes"][names.ATTR_MIG_START] == {"int": 6}


async def test_an_allocated_placement_is_made_at_prepare_and_destroyed_at_unprepare(
        root: Path) -> None:
    cluster = Release(36)
    nvml = MigNvml([H100])
    async with serving(cluster, root, nvml) as plugin:
        obj = await allocated(cluster, claim(devices=[ONE_G]))
        result = (await plugin.preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
        assert result.error == ""
        assert nvml.instances(0) == [("1g.10gb", 6, [0])]
        assert await plugin.preparer.unprepare([_ref(obj)]) == {obj["metadata"]["uid"]: ""}
        assert nvml.instances(0) == []


async def test_after_a_restart_the_plugins_own_instance_is_not_taken_for_an_administrators(
        root: Path) -> None:
    """Made, then the plugin restarts: discovery sees the instance, the journal says whose it
    is, so the placement stays published (allocated to its claim) and no fixed device of an
    administrator's appears; a hand-made one beside it is published as it is."""
    cluster = Release(36)
    nvml = MigNvml([H100])
    async with serving(cluster, root, nvml) as plugin:
        obj = await allocated(cluster, claim(devices=[ONE_G]))
        assert (await plugin.preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]].error == ""
    nvml.made_by_hand(0, "3g.40gb", 0)
    async with serving(cluster, root, nvml) as plugin:
        devices = _devices(await _slices(cluster))
        assert ONE_G in devices
        hand_made = [name for name in devices if name.startswith("gpu-0-mig-") and
                     devices[name]["attributes"].get(names.ATTR_MIG_START) == {"int": 0}
                     and "consumesCounters" not in devices[name]]
        assert len(hand_made) == 1, hand_made  # the 3g made by hand, drawing nothing
        assert await plugin.preparer.unprepare([_ref(obj)]) == {obj["metadata"]["uid"]: ""}
    assert nvml.instances(0) == [("3g.40gb", 0, [0])]  # never the administrator's


@pytest.mark.parametrize(("labels", "on"), [({}, False), ({LABEL: "false"}, False),
                                             ({LABEL: "true"}, True)])
async def test_with_a_label_asked_for_only_a_labelled_node_is_cut_on_demand(
        root: Path, labels: dict[str, str], on: bool) -> None:
    cluster = Release(36)
    nvml = MigNvml([H100])
    nvml.made_by_hand(0, "3g.40gb", 4)
    async with serving(cluster, root, nvml, label=LABEL, node_labels=labels) as plugin:
        devices = _devices(await _slices(cluster))
        assert plugin.mig_on_demand is on
    assert (ONE_G in devices) is on
    assert ("gpu-0" in devices) is on
    placements = sum(len(p.starts) for p in H100.geometry().profiles)
    assert len(devices) == (1 + placements + 1 if on else 1)  # off: only the one made by hand


def test_stand_in_discovery_prints_the_card_cut_on_demand(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", sys.modules["pynvml"])  # restored after
    install([H100.name], tmp_path / "cards.json")
    assert main(["node-plugin", "discover", "--nvml", "--node-name", NODE, "--mig-on-demand",
                 "-o", "json"]) == 0
    out = capsys.readouterr().out
    assert ONE_G in out
    assert "gpu-0-counter-set" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--inventory", "nodes.yaml", "--mig-on-demand"], "--mig-on-demand needs --nvml"),
    (["--nvml", "--mig-on-demand-label", LABEL], "--mig-on-demand-label needs --mig-on-demand"),
])
def test_flags_that_cannot_work_together_are_refused_with_the_fix(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["node-plugin", "serve", "--node-name", NODE, *argv])
    assert code == 2
    assert message in capsys.readouterr().err



async def _until(what: str, done: Any) -> None:
    """Until `done()` holds, for at most 5 s (the publisher's pass after a change)."""
    for _ in range(250):
        if await done():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{what}: never happened")


def _counters(slices: list[dict[str, Any]]) -> set[str]:
    """The counters of the node's sets with room in them (those instances made by hand hold
    are published at 0)."""
    return {name for s in slices for c in s["spec"].get("sharedCounters") or []
            for name, value in c["counters"].items() if value["value"] != "0"}


async def test_an_instance_made_by_hand_meanwhile_fails_the_prepare_cleanly_then_is_published(
        root: Path) -> None:
    """An administrator makes a 3g by hand on slices 0-3 after the plugin's discovery; a claim
    given the 1g at slice 0 fails to prepare (NVML refuses the overlap), leaves nothing behind,
    and the plugin looks again at once: the 3g is published as it is and its slices leave the
    card's counters, so the allocator gives that placement out no more; the placement is marked
    (fatal: the pod holding it is evicted, and placed elsewhere) until the 3g is gone."""
    cluster = Release(36)
    nvml = MigNvml([H100])
    async with serving(cluster, root, nvml, recovery_seconds=0.1) as plugin:
        nvml.made_by_hand(0, "3g.40gb", 0)
        obj = await allocated(cluster, claim(devices=["gpu-0-mig-1g10gb-19-0"]))
        result = (await plugin.preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
        assert "1g.10gb" in result.error
        assert "memory slice 0" in result.error
        assert nvml.instances(0) == [("3g.40gb", 0, [0])]
        assert plugin.preparer.checkpoint.get(obj["metadata"]["uid"]) is None

        async def republished() -> bool:
            return "memory-slice-0" not in _counters(await _slices(cluster))

        await _until("the card's counters without the 3g's slices", republished)
        slices = await _slices(cluster)
        assert {"memory-slice-4", "memory-slice-7"} <= _counters(slices)
        assert any(d["attributes"].get(names.ATTR_PROFILE) == {"string": "3g.40gb"}
                   and "consumesCounters" not in d for d in _devices(slices).values())
        taken = "gpu-0-mig-1g10gb-19-0"
        assert plugin.health.problems[taken].reason == MIG_PLACEMENT_TAKEN
        assert plugin.health.problems[taken].severity == "fatal"
        assert set(plugin.health.problems) == {taken}  # its neighbours are merely unallocatable
        assert taken not in _devices(slices)  # withheld (this cluster drops device taints)

        # The administrator's 3g goes: the placement recovers and is published again.
        module = nvml.module()
        dev = module.nvmlDeviceGetHandleByIndex(0)
        (gi,) = nvml.cards[0].instances
        handle = module.nvmlDeviceGetGpuInstanceById(dev, gi)
        module.nvmlComputeInstanceDestroy(module.nvmlGpuInstanceGetComputeInstanceById(handle, 0))
        module.nvmlGpuInstanceDestroy(handle)
        plugin._look_again([])

        async def back() -> bool:
            return taken in _devices(await _slices(cluster)) and not plugin.health.problems

        await _until("the placement published again", back)


async def test_instances_made_or_destroyed_by_hand_are_seen_every_rediscovery(
        root: Path) -> None:
    cluster = Release(36)
    nvml = MigNvml([H100])
    async with serving(cluster, root, nvml, rediscover_seconds=0.05):
        gi = nvml.made_by_hand(0, "1g.10gb", 6)

        async def hand_made_published() -> bool:
            return "memory-slice-6" not in _counters(await _slices(cluster))

        await _until("the instance made by hand to be published", hand_made_published)
        module = nvml.module()
        dev = module.nvmlDeviceGetHandleByIndex(0)
        handle = module.nvmlDeviceGetGpuInstanceById(dev, gi)
        module.nvmlComputeInstanceDestroy(module.nvmlGpuInstanceGetComputeInstanceById(handle, 0))
        module.nvmlGpuInstanceDestroy(handle)

        async def gone() -> bool:
            return "memory-slice-6" in _counters(await _slices(cluster))

        await _until("the card's counters whole again", gone)
