"""MIG instances made on demand (node-plugin/miginstances.py), against the NVML stand-in:
made and destroyed, rolled back when a step fails, finished or undone after a crash at any
step, and never touching an instance an administrator made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_gateway.devkit.migcards import MODELS, PROFILE_1_SLICE, PROFILE_3_SLICE, CardModel
from dra_gateway.devkit.nvmlmig import INSUFFICIENT_RESOURCES, MigNvml
from dra_gateway.node_plugin.miginstances import MigError, MigInstances, Wanted
from dra_gateway.node_plugin.nvml import Nvml

H100 = MODELS["NVIDIA H100 80GB HBM3"]
KEY = "0b6d9a3e-1111-4000-8000-000000000001/gpu-0-mig-1g10gb-19-6"


class Crash(BaseException):
    """The plugin killed mid-call."""


def crash() -> None:
    raise Crash


@pytest.fixture
def nvml() -> MigNvml:
    return MigNvml([H100, H100])


def _one_g(nvml: MigNvml, start: int = 6, card: int = 0) -> Wanted:
    return Wanted(nvml.cards[card].uuid, PROFILE_1_SLICE, start, 1, "1g.10gb")


def _plugin(nvml: MigNvml, tmp_path: Path) -> MigInstances:
    return MigInstances(nvml.module(), tmp_path / "mig-instances.json")


def test_an_instance_is_made_at_its_placement_and_destroyed_after(
        nvml: MigNvml, tmp_path: Path) -> None:
    instances = _plugin(nvml, tmp_path)
    made = instances.make(KEY, _one_g(nvml))
    assert nvml.instances(0) == [("1g.10gb", 6, [0])]
    assert made.stage == "made"
    assert made.uuid.startswith("MIG-")
    assert instances.make(KEY, _one_g(nvml)) == made  # the kubelet prepares again: the same
    with pytest.raises(MigError, match=r"already holds MIG 1g\.10gb at memory slice 6"):
        instances.make(KEY, _one_g(nvml, start=5))
    assert instances.destroy(KEY)
    assert nvml.instances(0) == []
    assert not instances.destroy(KEY)
    assert json.loads((tmp_path / "mig-instances.json").read_text())["instances"] == {}


@pytest.mark.parametrize("step", [
    "nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo", "nvmlGpuInstanceCreateComputeInstance",
    "nvmlComputeInstanceGetInfo", "nvmlDeviceGetMaxMigDeviceCount"])
def test_a_step_that_fails_rolls_back_what_the_earlier_ones_made(
        nvml: MigNvml, tmp_path: Path, step: str) -> None:
    instances = _plugin(nvml, tmp_path)
    nvml.fail(step, INSUFFICIENT_RESOURCES)
    with pytest.raises(MigError) as failed:
        instances.make(KEY, _one_g(nvml))
    assert str(failed.value).startswith(
        f"MIG 1g.10gb at memory slice 6 of card {nvml.cards[0].uuid}: NVML {step} failed: ")
    assert nvml.instances(0) == []
    assert instances.journal.entries() == []
    instances.make(KEY, _one_g(nvml))  # and the kubelet's next prepare makes it
    assert nvml.instances(0) == [("1g.10gb", 6, [0])]


@pytest.mark.parametrize("step", [
    "nvmlGpuInstanceGetInfo", "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceGetInfo",
    "nvmlDeviceGetMaxMigDeviceCount"])
def test_a_crash_while_making_is_undone_at_the_next_start(
        nvml: MigNvml, tmp_path: Path, step: str) -> None:
    nvml.fail(step, crash)
    with pytest.raises(Crash):
        _plugin(nvml, tmp_path).make(KEY, _one_g(nvml))
    assert nvml.instances(0) != []  # the GPU instance at least was made
    restarted = _plugin(nvml, tmp_path)
    [line] = restarted.recover()
    assert line.startswith(f"undid the half-made {KEY}: MIG 1g.10gb at memory slice 6")
    assert nvml.instances(0) == []
    assert restarted.journal.entries() == []


def test_a_crash_while_destroying_is_finished_at_the_next_start(
        nvml: MigNvml, tmp_path: Path) -> None:
    _plugin(nvml, tmp_path).make(KEY, _one_g(nvml))
    nvml.fail("nvmlGpuInstanceDestroy", crash)  # the compute instance is already gone
    with pytest.raises(Crash):
        _plugin(nvml, tmp_path).destroy(KEY)
    assert nvml.instances(0) == [("1g.10gb", 6, [])]
    [line] = _plugin(nvml, tmp_path).recover()
    assert line.startswith(f"finished destroying {KEY}")
    assert nvml.instances(0) == []


def test_a_failed_rollback_keeps_the_entry_until_a_start_finishes_it(
        nvml: MigNvml, tmp_path: Path) -> None:
    instances = _plugin(nvml, tmp_path)
    nvml.fail("nvmlGpuInstanceCreateComputeInstance", INSUFFICIENT_RESOURCES)
    nvml.fail("nvmlGpuInstanceDestroy", 999)
    with pytest.raises(MigError, match=r"rolling back failed too \(.*nvmlGpuInstanceDestroy"):
        instances.make(KEY, _one_g(nvml))
    assert [e.stage for e in instances.journal.entries()] == ["gpu-instance"]
    assert _plugin(nvml, tmp_path).recover() != []
    assert nvml.instances(0) == []


def test_instances_made_by_hand_are_never_touched(nvml: MigNvml, tmp_path: Path) -> None:
    nvml.made_by_hand(0, "3g.40gb", 4)
    nvml.made_by_hand(1, "1g.10gb", 6)
    instances = _plugin(nvml, tmp_path)
    with pytest.raises(MigError, match="an instance the plugin did not make holds it"):
        instances.make(KEY, _one_g(nvml, card=1))
    with pytest.raises(MigError, match="nvmlDeviceCreateGpuInstanceWithPlacement failed"):
        instances.make(KEY, _one_g(nvml, start=5))  # inside the 3g: NVML refuses
    made = instances.make(KEY, Wanted(nvml.cards[0].uuid, PROFILE_3_SLICE, 0, 4, "3g.40gb"))
    assert instances.recover() == []
    instances.destroy(made.key)
    assert nvml.instances(0) == [("3g.40gb", 4, [0])]
    assert nvml.instances(1) == [("1g.10gb", 6, [0])]


def test_an_instance_a_reboot_destroyed_is_forgotten(nvml: MigNvml, tmp_path: Path) -> None:
    _plugin(nvml, tmp_path).make(KEY, _one_g(nvml))
    rebooted = MigNvml([H100, H100])
    [line] = _plugin(rebooted, tmp_path).recover()
    assert line.startswith(f"forgot {KEY}")
    assert line.endswith("the instance is gone (a reboot)")


def test_an_unreadable_journal_stops_the_plugin_with_the_fix(tmp_path: Path,
                                                            nvml: MigNvml) -> None:
    (tmp_path / "mig-instances.json").write_text('{"version": 1, "instances": {"k": {}}}')
    with pytest.raises(MigError, match=r"fix or remove the file \(then destroy the plugin's"):
        _plugin(nvml, tmp_path)


def test_an_instance_made_by_hand_at_the_same_moment_is_left_alone(
        nvml: MigNvml, tmp_path: Path) -> None:
    """An administrator's instance lands on the placement between the plugin's check and its
    create: NVML refuses the plugin's, and the rollback leaves the administrator's."""
    def by_hand() -> None:
        nvml.made_by_hand(0, "1g.10gb", 6)

    nvml.fail("nvmlDeviceCreateGpuInstanceWithPlacement", by_hand)
    instances = _plugin(nvml, tmp_path)
    with pytest.raises(MigError, match="nvmlDeviceCreateGpuInstanceWithPlacement failed"):
        instances.make(KEY, _one_g(nvml))
    assert nvml.instances(0) == [("1g.10gb", 6, [0])]
    assert instances.journal.entries() == []


@pytest.mark.parametrize("names", [True, False], ids=["named", "unnamed"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_geometry_is_read_from_nvml_as_the_card_states_it(model: str, names: bool) -> None:
    """Profiles, placements, compute slices, memory and the media-extension instance, from
    NVML's read-only queries; a profile info without a name (version 1) is named as the
    node plugin names what NVML reports."""
    nvml = MigNvml([MODELS[model]], profile_names=names)
    with Nvml(nvml.module()) as session:
        geometry = session.mig_geometry(0)
    expected = MODELS[model].geometry()
    assert geometry is not None
    assert sorted(geometry.profiles, key=repr) == sorted(expected.profiles, key=repr)
    assert (geometry.memory_slices, geometry.compute_slices,
            geometry.media_extension_instances) == (8, 7, 1)
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in nvml.calls


def test_a_card_without_mig_profiles_has_no_geometry() -> None:
    nvml = MigNvml([CardModel("NVIDIA L4", 23034, ())])
    with Nvml(nvml.module()) as session:
        assert session.mig_geometry(0) is None
