"""The MIG placement bench (`python -m dra_gateway.devkit.bench.mig`)."""

from __future__ import annotations

import json

import pytest

from dra_gateway.devkit.bench import mig as bench
from dra_gateway.devkit.migcards import MODELS


def test_both_rules_replay_one_stream_and_their_figures_add_up(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--nodes", "2", "--requests", "600", "--load", "1.2", "--seeds", "4-5",
                       "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == [4, 5]
    assert set(out["rules"]) == {"gateway", "first-fit"}
    for figures in out["rules"].values():
        assert figures["asked"] == 1200
        assert figures["placed"] == sum(placed for placed, _ in figures["by_kind"].values())
        assert figures["asked"] == sum(asked for _, asked in figures["by_kind"].values())
        assert figures["big_placed"] == sum(figures["by_kind"][k][0] for k in bench.BIG)
        assert 0 < figures["slice_share"] <= 1
    assert out["rules"]["gateway"]["by_kind"] != out["rules"]["first-fit"]["by_kind"]
    gateway, first = out["rules"]["gateway"], out["rules"]["first-fit"]
    assert out["ratio"]["placed"] == round(gateway["placed"] / first["placed"], 3)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_stand_in_model_names_each_kind_of_the_mix(model: str) -> None:
    profiles = bench._profiles(MODELS[model].geometry())
    assert set(profiles) == {kind for kind, _ in bench.MIX}
    tally = bench.replay("gateway", MODELS[model].geometry(), 8,
                         bench.stream(1, 300, 8, 1.0))
    assert sum(tally.asked.values()) == 300


def test_the_table_ends_with_the_ratio_and_the_setup(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--nodes", "1", "--requests", "200", "--seeds", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["rule", "placed"]
    assert [line.split()[0] for line in lines[1:3]] == ["gateway", "first-fit"]
    assert lines[-2].startswith("gateway / first-fit: placed x")
    assert lines[-1] == ("(NVIDIA H100 80GB HBM3, 1 nodes of 8 cards, 200 requests per seed at "
                         "load 1.0, seeds 3)")


def test_bad_seeds_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--seeds", "x"]) == 2
    assert "error: --seeds 'x': write 7, 1,2,5 or 1-3" in capsys.readouterr().err


@pytest.mark.parametrize("rule", sorted(bench.RULES))
def test_the_planner_places_as_the_rule_it_stands_for_on_one_node(rule: str) -> None:
    """On one node the planner's choice among the node plugin's devices is the placement
    rule's: `default` is `gpu.mig.choose`, `first-fit` first fit in slice order, request by
    request of one stream (arrivals and departures)."""
    model = "NVIDIA H100 80GB HBM3"
    trace = bench.stream(11, 400, 8, 1.1)
    planned = bench.replay_planner(bench.PLANNER_STRATEGIES[rule], model, 1, trace)
    alone = bench.replay(rule, MODELS[model].geometry(), 8, trace)
    assert planned.placed == alone.placed
    assert planned.slice_ticks == pytest.approx(alone.slice_ticks)


def test_the_planner_replay_reports_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--planner", "--nodes", "2", "--requests", "300", "--seeds", "2",
                       "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planner"] is True
    assert {rule: figures["asked"] for rule, figures in out["rules"].items()} == {
        "gateway": 300, "first-fit": 300}
