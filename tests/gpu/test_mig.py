"""MIG geometry and placement (gpu/mig.py), on the stand-in's card models."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gateway.devkit.migcards import MODELS
from dra_gateway.gpu import mig
from dra_gateway.gpu.mig import Card, CardUse, Placement
from dra_gateway.node_plugin.nvml import _mig_profile

H100 = MODELS["NVIDIA H100 80GB HBM3"]
H200 = MODELS["NVIDIA H200"].geometry()


def _at(geometry: mig.Geometry, name: str, start: int) -> Placement:
    return Placement(geometry.profile(name), start)


def _use(geometry: mig.Geometry, *placements: tuple[str, int]) -> CardUse:
    use = CardUse()
    for name, start in placements:
        placement = _at(geometry, name, start)
        assert mig.fits(geometry, use, placement), (name, start)
        use = use.with_placement(placement)
    return use


def test_an_empty_h200_holds_each_profile_as_often_as_nvidia_says() -> None:
    counts = dict(zip((p.name for p in H200.ranked()), mig.capacity(H200, CardUse()),
                      strict=True))
    assert counts == {"7g.141gb": 1, "4g.71gb": 1, "3g.71gb": 2, "2g.35gb": 3, "1g.35gb": 4,
                      "1g.18gb": 7, "1g.18gb+me": 1}


def test_a_4g_and_a_3g_fit_together_two_3g_and_a_1g_do_not() -> None:
    _use(H200, ("4g.71gb", 0), ("3g.71gb", 4))
    both = _use(H200, ("3g.71gb", 0), ("3g.71gb", 4))
    assert mig.free_placements(H200, both, H200.profile("1g.18gb")) == []
    assert mig.capacity(H200, both) == (0,) * len(H200.profiles)


def test_only_one_instance_of_a_card_holds_the_media_extensions() -> None:
    use = _use(H200, ("1g.18gb+me", 0))
    assert mig.free_placements(H200, use, H200.profile("1g.18gb+me")) == []
    assert len(mig.free_placements(H200, use, H200.profile("1g.18gb"))) == 6
    freed = use.without_placement(_at(H200, "1g.18gb+me", 0))
    assert freed == CardUse()
    with pytest.raises(ValueError, match="not on this card"):
        freed.without_placement(_at(H200, "1g.18gb", 3))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_stand_ins_profiles_are_named_as_the_node_plugin_names_what_nvml_reports(
        model: str) -> None:
    card = MODELS[model]
    for row in card.rows:
        attrs = SimpleNamespace(gpuInstanceSliceCount=row.compute_slices,
                                computeInstanceSliceCount=row.compute_slices,
                                memorySizeMB=row.memory_mib)
        info = SimpleNamespace(sliceCount=row.compute_slices, memorySizeMB=row.memory_mib)
        assert _mig_profile(attrs, card.memory_mib << 20, (row.index, info)) == row.name


def test_a_small_instance_goes_where_it_keeps_the_bigger_profiles_placeable() -> None:
    geometry = H100.geometry()
    with_3g = _use(geometry, ("3g.40gb", 0))
    cards = [Card("empty", geometry), Card("with-3g", geometry, with_3g)]
    # Not on the empty card (its 7g would be lost), and at slice 6, which keeps the 2g at 4.
    assert mig.choose(cards, "1g.10gb") == ("with-3g", _at(geometry, "1g.10gb", 6))
    # kube-scheduler's first fit takes the empty card's first slice.
    assert mig.first_fit(cards, "1g.10gb") == ("empty", _at(geometry, "1g.10gb", 0))
    # A 7g fits only the empty card; a 4g nowhere but there either.
    assert mig.choose(cards, "7g.80gb") == ("empty", _at(geometry, "7g.80gb", 0))
    assert mig.choose([Card("with-3g", geometry, with_3g)], "4g.40gb") is None


def test_cards_without_the_profile_are_passed_over() -> None:
    a100 = MODELS["NVIDIA A100-SXM4-40GB"].geometry()
    cards = [Card("a100", a100), Card("h200", H200)]
    # At slice 6 of an empty card, a 1g keeps the 4g at 0 and a 3g at 0 placeable.
    assert mig.choose(cards, "1g.18gb") == ("h200", _at(H200, "1g.18gb", 6))
    assert mig.first_fit(cards, "1g.18gb") == ("h200", _at(H200, "1g.18gb", 0))
    assert mig.choose(cards, "9g.1gb") is None
    with pytest.raises(KeyError, match=r"no MIG profile '9g\.1gb' on this card"):
        H200.profile("9g.1gb")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([p.name for p in H200.profiles]), st.booleans()),
                max_size=40))
def test_no_counter_is_ever_over_committed(steps: list[tuple[str, bool]]) -> None:
    """Placements chosen one after another, some released again: the counters the devices
    consume never exceed the card's counter set."""
    cards = [Card(i, H200) for i in range(2)]
    held: list[tuple[int, Placement]] = []
    for name, release in steps:
        if release and held:
            key, placement = held.pop(0)
            cards[key] = Card(key, H200, cards[key].use.without_placement(placement))
            continue
        chosen = mig.choose(cards, name)
        if chosen is None:
            assert all(not mig.free_placements(H200, c.use, H200.profile(name)) for c in cards)
            continue
        key, placement = chosen
        cards[key] = Card(key, H200, cards[key].use.with_placement(placement))
        held.append(chosen)
    for key in range(2):
        shared = mig.shared_counters(H200, key)["counters"]
        total: dict[str, int] = {}
        for k, placement in held:
            if k == key:
                consumed = mig.consumed_counters(key, placement, H200)["counters"]
                for counter, value in consumed.items():  # type: ignore[attr-defined]
                    total[counter] = total.get(counter, 0) + int(value["value"])
        for counter, value in total.items():
            assert value <= int(shared[counter]["value"]), (counter, held)  # type: ignore[index]


def test_the_whole_card_consumes_every_counter_of_its_set() -> None:
    whole = mig.consumed_counters(3, None, H200)
    shared = mig.shared_counters(H200, 3)
    assert whole["counterSet"] == shared["name"] == "gpu-3-counter-set"
    assert whole["counters"] == shared["counters"]
    one = mig.consumed_counters(3, _at(H200, "2g.35gb", 2), H200)
    assert one["counters"] == {"memory-slice-2": {"value": "1"}, "memory-slice-3": {"value": "1"},
                               "compute-slices": {"value": "2"}}


@pytest.mark.parametrize(("resource", "profile"), [
    ("nvidia.com/mig-1g.10gb", "1g.10gb"),
    ("nvidia.com/mig-1g.10gb.me", "1g.10gb+me"),
    ("nvidia.com/mig-1g.18gb.me.all", "1g.18gb+me.all"),
    ("nvidia.com/mig-1c.2g.20gb", "1c.2g.20gb"),
    ("nvidia.com/mig-7g.141gb", "7g.141gb"),
    ("nvidia.com/gpu", None),
    ("nvidia.com/mig-", None),
    ("nvidia.com/mig-1g", None),
    ("nvidia.com/mig-0g.10gb", None),
    ("nvidia.com/mig-1g.10gb.", None),
    ("nvidia.com/mig-1g.10gb+me", None),
])
def test_legacy_mig_names_read_as_profiles(resource: str, profile: str | None) -> None:
    assert mig.profile_of_resource(resource) == profile
    if profile is not None:
        assert mig.resource_of_profile(profile) == resource


def test_devices_are_named_as_nvidias_driver_names_them() -> None:
    geometry = H100.geometry()
    assert mig.device_name(0, _at(geometry, "1g.10gb", 6)) == "gpu-0-mig-1g10gb-19-6"
    assert mig.device_name(2, _at(geometry, "1g.10gb+me", 1)) == "gpu-2-mig-1g10gbme-20-1"
    names = [mig.device_name(0, p) for p in mig.placements_of(geometry)]
    assert len(names) == len(set(names)) == 7 + 7 + 4 + 3 + 2 + 1 + 1


def test_memory_and_compute_asks_are_offered_the_smallest_profiles_first() -> None:
    geometry = H100.geometry()
    assert [p.name for p in mig.smallest_fitting(geometry, memory_mib=15000)] == [
        "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert [p.name for p in mig.smallest_fitting(geometry, compute_percent=30)] == [
        "3g.40gb", "4g.40gb", "7g.80gb"]
    assert [p.name for p in mig.smallest_fitting(geometry, memory_mib=1, limit=2)] == [
        "1g.10gb", "1g.20gb"]
    assert mig.smallest_fitting(geometry, memory_mib=200_000) == []


def test_a_geometry_whose_placements_leave_the_card_is_refused() -> None:
    bad = mig.Profile("3g.40gb", 9, 3, 40448, 4, (0, 5))
    with pytest.raises(ValueError, match=r"3g.40gb: placements \[0, 5\] of 4 slices"):
        mig.Geometry(memory_slices=8, compute_slices=7, profiles=(bad,))
