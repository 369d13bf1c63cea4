"""`python -m dra_gateway.devkit.bench.speedlayer`: the planner against the plain reference on
a slice of an openb trace, timed, and every plan compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_gateway.allocator.planner import PodPlan
from dra_gateway.devkit.bench import speedlayer, trace

DATA = Path(__file__).parent / "data"
SLICE = ["--nodes", str(DATA / "openb_nodes_small.csv"),
         "--pods", str(DATA / "openb_pods_small.csv"), "--node-count", "20", "--pod-count", "50"]


def test_the_planner_and_the_reference_agree_on_a_slice_and_both_are_timed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert speedlayer.main([*SLICE, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"nodes", "cards", "pods", "pods_placed", "real", "reference", "ratio",
            "wall_ratio", "runs", "agree", "disagreements"} <= set(out)
    assert (out["nodes"], out["pods"], out["repeat"], out["seeds"]) == (20, 50, 2, [42])
    assert 0 < out["pods_placed"] <= 50
    for planner in ("real", "reference"):
        assert out[planner]["seconds"] > 0
        assert out[planner]["ms_per_pod"] > 0
    assert out["ratio"] > 0
    assert out["agree"] is True
    assert out["disagreements"] == 0
    # The order of the two runs alternates.
    assert [run["first"] for run in out["runs"]] == ["real", "reference"]


def test_the_table_says_the_plans_agreed(capsys: pytest.CaptureFixture[str]) -> None:
    assert speedlayer.main([*SLICE, "--repeat", "1", "--strategy", "binpack"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("20 nodes (")
    assert "50 pods planned" in lines[0]
    assert [line.split()[0] for line in lines[2:4]] == ["real", "reference"]
    assert lines[-1] == "plans: every one agreed (node and devices)"


def test_a_disagreement_is_printed_and_fails_the_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def nowhere(state: Any, pod: Any, claims: Any) -> PodPlan:
        return PodPlan(None, reason="no node fits")

    monkeypatch.setitem(speedlayer.PLANNERS, "reference", nowhere)
    assert speedlayer.main([*SLICE, "--repeat", "1", "-o", "json"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["agree"] is False
    assert out["disagreements"] > 0
    assert "pod p0 " in captured.err
    assert "reference: (not placed)" in captured.err


def test_a_slice_of_the_cluster_gets_the_load_of_the_whole() -> None:
    pods = trace.read_pods(DATA / "openb_pods_small.csv")
    sequence = speedlayer.pod_sequence(pods, 40, load=1.3, seed=42, pod_count=None)
    requested = sum(p.gpu_share for p in sequence)
    assert requested >= 1.3 * 40 > requested - sequence[-1].gpu_share
    assert speedlayer.pod_sequence(pods, 40, load=1.3, seed=42, pod_count=5) == sequence[:5]


def test_bad_options_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert speedlayer.main([*SLICE, "--strategy", "nope"]) == 2
    assert "--strategy 'nope' is not a strategy" in capsys.readouterr().err
    assert speedlayer.main([*SLICE, "--repeat", "0"]) == 2
    assert "--repeat must be at least 1" in capsys.readouterr().err


def test_each_part_of_the_speed_layer_is_timed_off_and_plans_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert speedlayer.main([*SLICE, "--repeat", "3", "--variants",
                            "no-memo,no-rankings,reference", "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["variants"] == ["real", "no-memo", "no-rankings", "reference"]
    for name in out["variants"]:
        assert out[name]["seconds"] > 0
    assert out["real"]["times_real"] == 1.0
    assert out["agree"] is True
    # The order rotates: each repetition another planner goes first.
    assert [run["first"] for run in out["runs"]] == ["real", "no-memo", "no-rankings"]
    assert speedlayer.main([*SLICE, "--variants", "no-cache"]) == 2
    assert "--variants: 'no-cache' is not a planner" in capsys.readouterr().err
