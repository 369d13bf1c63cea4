"""Partitionable devices in the planner (issue 47): MIG cards cut on demand, published by the
node plugin's own builders in each release's layout, are planned with their counters counted as
kube-scheduler counts them, and a new instance goes where it keeps the bigger profiles
placeable (`gpu.mig.choose`), first-fit in slice order under the `first-fit` strategy.

Layouts: 1.34 (counter sets beside the devices), 1.35 and later (counter sets in a slice of
their own), and a cluster whose API server drops the fields (DRAPartitionableDevices off): the
gateway's own record, read from the devices' attributes, must count alike."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from dra_gateway.allocator.planner import ClusterState, PlannerSettings, plan_pod
from dra_gateway.devkit.migcards import MODELS
from dra_gateway.gpu import mig
from dra_gateway.kube import names
from dra_gateway.node_plugin.devices import DeviceOptions, counter_sets_of, devices_of
from dra_gateway.node_plugin.facts import GpuFacts, MigFacts, NodeFacts
from dra_gateway.node_plugin.publish import build_slices

from .planner_support import claim, device_class, node, place, pod

H100 = MODELS["NVIDIA H100 80GB HBM3"]
LAYOUTS = ("1.34", "1.35", "fields-dropped")
PROFILES = ("1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb",
            "4g.40gb", "7g.80gb")


def card(index: int, *, hand_made: Sequence[MigFacts] = ()) -> GpuFacts:
    return GpuFacts(index=index, uuid=f"GPU-{index}", product_name=H100.name,
                    memory=H100.memory_mib << 20, mig_enabled=True, mig_devices=tuple(hand_made),
                    mig_geometry=H100.geometry())


def mig_slices(node_name: str, cards: Sequence[GpuFacts], layout: str) -> list[dict[str, Any]]:
    facts = NodeFacts(gpus=tuple(cards))
    kept = layout != "fields-dropped"
    devices = devices_of(facts, DeviceOptions(partitionable_devices=kept))
    return build_slices(node_name=node_name, driver=names.DRIVER, devices=devices, generation=1,
                        node_uid=None, max_devices=64,
                        counter_sets=counter_sets_of(facts) if kept else (),
                        counters_apart=layout == "1.35")


def mig_cluster(layout: str, nodes: dict[str, Sequence[GpuFacts]], *,
                strategy: str = "default") -> ClusterState:
    state = ClusterState(PlannerSettings(default_strategy=strategy))
    state.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    state.set_device_class(device_class(names.MIG_CLASS, "mig"))
    for name, cards in nodes.items():
        state.set_node(node(name))
        for slice_ in mig_slices(name, cards, layout):
            state.set_slice(slice_)
    return state


def profile_claim(name: str, profile: str) -> dict[str, Any]:
    return claim(name, cls=names.MIG_CLASS,
                 selectors=[f"device.attributes['{names.DRIVER}'].profile == '{profile}'"])


def whole_claim(name: str) -> dict[str, Any]:
    return claim(name, cls=names.GPU_CLASS)


def ask(state: ClusterState, name: str, c: dict[str, Any]) -> str | None:
    """Plan and assume one pod; the device given, or None."""
    plan = place(state, pod(name), c)
    if plan.node_name is None:
        return None
    (result,) = plan.allocations[c["metadata"]["uid"]]["devices"]["results"]
    return str(result["device"])


# Every published device's card and memory slices, read from the builder's own counters (an
# independent account of what each device takes, whatever the planner reads).
def _spots() -> dict[str, tuple[int, mig.Placement | None]]:
    out: dict[str, tuple[int, mig.Placement | None]] = {}
    geometry = H100.geometry()
    for index in range(4):
        out[f"gpu-{index}"] = (index, None)
        for placement in mig.placements_of(geometry):
            out[mig.device_name(index, placement)] = (index, placement)
    return out


SPOTS = _spots()


def _uses(held: dict[str, str]) -> dict[int, tuple[mig.CardUse, bool]]:
    """Per card, what the held devices take; raises where two overlap."""
    geometry = H100.geometry()
    uses: dict[int, tuple[mig.CardUse, bool]] = {}
    for device in held.values():
        index, placement = SPOTS[device]
        use, whole = uses.get(index, (mig.CardUse(), False))
        assert not whole, f"{device} given beside the whole card {index}"
        if placement is None:
            assert use.mask == 0, f"card {index} given whole beside its instances"
            uses[index] = (mig.CardUse(geometry.full_mask(), 0), True)
            continue
        assert mig.fits(geometry, use, placement), f"{device} overlaps card {index}'s {use}"
        uses[index] = (use.with_placement(placement), False)
    return uses


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_instance_takes_the_whole_card_away_and_the_whole_card_every_instance(
        layout: str) -> None:
    state = mig_cluster(layout, {"n1": [card(0)]})
    first = ask(state, "p1", profile_claim("c1", "1g.10gb"))
    assert first is not None
    assert ask(state, "p2", whole_claim("c2")) is None
    plan = plan_pod(state, pod("p3"), [profile_claim("c3", "7g.80gb")])
    assert plan.node_name is None
    assert "draw on counters that devices already allocated hold" in (plan.reason or "")

    state = mig_cluster(layout, {"n1": [card(0)]})
    assert ask(state, "p1", whole_claim("c1")) == "gpu-0"
    for i, profile in enumerate(("1g.10gb", "3g.40gb", "7g.80gb")):
        assert ask(state, f"q{i}", profile_claim(f"d{i}", profile)) is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_released_instance_gives_its_counters_back(layout: str) -> None:
    state = mig_cluster(layout, {"n1": [card(0)]})
    p, c = pod("p1"), profile_claim("c1", "7g.80gb")
    plan = place(state, p, c)
    assert plan.node_name == "n1"
    assert ask(state, "p2", profile_claim("c2", "1g.10gb")) is None
    state.forget(p, plan)
    assert ask(state, "p3", profile_claim("c3", "1g.10gb")) is not None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_burst_never_overcommits_a_counter_and_refuses_only_what_fits_nowhere(
        layout: str) -> None:
    rng = random.Random(7)
    cards = [card(i) for i in range(3)]
    state = mig_cluster(layout, {"n1": cards[:2], "n2": cards[2:]})
    held: dict[str, str] = {}  # pod uid -> device ("<node>/<device>")
    plans: dict[str, tuple[dict[str, Any], Any]] = {}
    geometry = H100.geometry()
    for step in range(160):
        if held and rng.random() < 0.3:
            uid = rng.choice(sorted(held))
            state.forget(*plans.pop(uid))
            del held[uid]
            continue
        profile = rng.choice(PROFILES)
        p = pod(f"p{step}")
        c = profile_claim(f"c{step}", profile) if profile != "7g.80gb" or rng.random() < 0.5 \
            else whole_claim(f"c{step}")
        plan = place(state, p, c)
        per_node = {n: _uses({k: v.split("/")[1] for k, v in held.items()
                              if v.startswith(n + "/")}) for n in ("n1", "n2")}
        if plan.node_name is None:
            # Refused only where no card of any node has room for it.
            wanted = profile if c["spec"]["devices"]["requests"][0]["exactly"][
                "deviceClassName"] == names.MIG_CLASS else None
            for n, cards_ in (("n1", (0, 1)), ("n2", (2,))):
                for index in cards_:
                    use, whole = per_node[n].get(index, (mig.CardUse(), False))
                    if wanted is None:
                        assert whole or use.mask, f"step {step}: card {index} free, whole refused"
                    elif not whole:
                        assert not mig.free_placements(geometry, use, geometry.profile(wanted)), (
                            f"step {step}: {wanted} refused, card {index} has room: {use}")
            continue
        (result,) = plan.allocations[c["metadata"]["uid"]]["devices"]["results"]
        held[p["metadata"]["uid"]] = f"{plan.node_name}/{result['device']}"
        plans[p["metadata"]["uid"]] = (p, plan)
        for n in ("n1", "n2"):
            _uses({k: v.split("/")[1] for k, v in held.items() if v.startswith(n + "/")})


@pytest.mark.parametrize("strategy", ["default", "first-fit"])
def test_a_new_instance_goes_where_it_keeps_the_bigger_profiles_placeable(strategy: str) -> None:
    """The planner's choice on a node is `gpu.mig.choose`'s (first fit in slice order under
    `first-fit`), whatever the cards already hold."""
    rng = random.Random(3)
    geometry = H100.geometry()
    for trial in range(40):
        state = mig_cluster("1.35", {"n1": [card(0), card(1)]}, strategy=strategy)
        uses = [mig.CardUse(), mig.CardUse()]
        for k in range(rng.randint(0, 6)):
            index = rng.randrange(2)
            profile = geometry.profile(rng.choice(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb"]))
            free = mig.free_placements(geometry, uses[index], profile)
            if not free:
                continue
            placement = rng.choice(free)
            uses[index] = uses[index].with_placement(placement)
            # Held by someone else: an allocated claim naming the device.
            state.set_claim(_allocated(f"h{trial}-{k}", mig.device_name(index, placement)))
        profile_name = rng.choice(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb"])
        cards = [mig.Card(i, geometry, uses[i]) for i in range(2)]
        pick = (mig.choose if strategy == "default" else mig.first_fit)(cards, profile_name)
        got = ask(state, f"p{trial}", profile_claim(f"c{trial}", profile_name))
        expected = None if pick is None else mig.device_name(pick[0], pick[1])
        assert got == expected, f"trial {trial}: {profile_name} on {uses}"


def _allocated(name: str, device: str) -> dict[str, Any]:
    c = profile_claim(name, "any")
    c["status"] = {"allocation": {"devices": {"results": [
        {"request": "main", "driver": names.DRIVER, "pool": "n1", "device": device}]}}}
    return c


@pytest.mark.parametrize("layout", LAYOUTS)
def test_instances_made_by_hand_hold_their_slices(layout: str) -> None:
    """An administrator's 3g instance at slice 4 is published as it is (a device of its own,
    made already); its slices, and the whole card, are nobody else's."""
    by_hand = MigFacts(uuid="MIG-hand", profile="3g.40gb", memory=40448 << 20, profile_id=9,
                       placement_start=4, placement_size=4)
    state = mig_cluster(layout, {"n1": [card(0, hand_made=[by_hand])]})
    assert ask(state, "p0", whole_claim("c0")) is None
    got = {ask(state, f"p{i}", profile_claim(f"c{i}", "3g.40gb")) for i in (1, 2, 3)}
    assert got == {"gpu-0-mig-3g40gb-9-0", "gpu-0-mig-9-4-4", None}
    assert ask(state, "p4", profile_claim("c4", "1g.10gb")) is None


def test_devices_of_a_counter_set_not_yet_published_fit_nowhere() -> None:
    """1.35: the devices' slice came, the counter sets' slice not yet (or it was deleted)."""
    slices = mig_slices("n1", [card(0)], "1.35")
    devices_only = [s for s in slices if s["spec"].get("devices")]
    assert len(devices_only) < len(slices)
    state = ClusterState(PlannerSettings())
    state.set_device_class(device_class(names.MIG_CLASS, "mig"))
    state.set_node(node("n1"))
    for slice_ in devices_only:
        state.set_slice(slice_)
    assert ask(state, "p1", profile_claim("c1", "1g.10gb")) is None
    for slice_ in slices:
        state.set_slice(slice_)
    assert ask(state, "p2", profile_claim("c2", "1g.10gb")) is not None


def test_each_layout_is_valid_for_its_release() -> None:
    """The slices the node plugin writes pass the strict schemas of their releases, within
    each release's limits (1.34: at most 32 counters a slice, a card's devices beside its
    set; 1.35: counter sets alone, at most 8 a slice)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    cards = [card(i) for i in range(4)]
    for layout, release in (("1.34", "1.34"), ("1.35", "1.35"), ("1.35", "1.37")):
        slices = mig_slices("n1", cards, layout)
        for slice_ in slices:
            kubernetes_validate.validate(slice_, release, strict=True)
            spec = slice_["spec"]
            counters = sum(len(s["counters"]) for s in spec.get("sharedCounters", ()))
            if layout == "1.34":
                assert counters <= 32
                sets = {s["name"] for s in spec.get("sharedCounters", ())}
                for device in spec.get("devices", ()):
                    for entry in device.get("consumesCounters", ()):
                        assert entry["counterSet"] in sets
            else:
                assert not (spec.get("devices") and spec.get("sharedCounters"))
                assert len(spec.get("sharedCounters", ())) <= 8
                assert len(spec.get("devices", ())) <= 64
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}


def test_quotas_count_an_instance_by_its_memory_and_compute_slices() -> None:
    """A 1g instance of an H100 is charged its memory and 1 of 7 compute slices (14 cores, the
    card being 100), a 4g and a 3g together less than the card; before allocation a MIG request
    surely costs no cores (its profile decides), where a whole card surely costs 100."""
    from dra_gateway.policy.amounts import charges_of, requests_of, total

    slices = mig_slices("n1", [card(0)], "1.35")
    devices = {(names.DRIVER, "n1", d["name"]): d for s in slices
               for d in s["spec"].get("devices", ())}
    charged = {}
    for device in ("gpu-0-mig-1g10gb-19-3", "gpu-0-mig-4g40gb-5-0", "gpu-0-mig-3g40gb-9-4",
                   "gpu-0"):
        c = profile_claim("c", "x") if device != "gpu-0" else whole_claim("c")
        c["status"] = {"allocation": {"devices": {"results": [
            {"request": "main", "driver": names.DRIVER, "pool": "n1", "device": device}]}}}
        charged[device] = total(charges_of(c, devices.get))
    assert charged["gpu-0-mig-1g10gb-19-3"].cores == 14
    assert charged["gpu-0-mig-1g10gb-19-3"].memory == 9984 << 20
    assert charged["gpu-0-mig-4g40gb-5-0"].cores + charged["gpu-0-mig-3g40gb-9-4"].cores < 100
    assert charged["gpu-0"].cores == 100
    (mig_request,) = requests_of(profile_claim("c", "1g.10gb")["spec"])
    (whole_request,) = requests_of(whole_claim("c")["spec"])
    assert mig_request.amounts.cores == 0
    assert whole_request.amounts.cores == 100


@pytest.mark.parametrize(("strategy", "node_given"), [("default", "n2"), ("binpack", "n2"),
                                                      ("spread", "n2"), ("first-fit", "n1")])
def test_nodes_compare_by_what_the_instance_costs_their_bigger_profiles(
        strategy: str, node_given: str) -> None:
    """A 3g goes beside a 1g already on n2's card (the 7g and 4g there are gone already)
    rather than onto n1's free card, where it would cost them; first fit takes n1 by name."""
    state = mig_cluster("1.35", {"n1": [card(0)], "n2": [card(0)]}, strategy=strategy)
    held = _allocated("h", "gpu-0-mig-1g10gb-19-0")
    held["status"]["allocation"]["devices"]["results"][0]["pool"] = "n2"
    state.set_claim(held)
    plan = place(state, pod("p"), profile_claim("c", "3g.40gb"))
    assert plan.node_name == node_given
