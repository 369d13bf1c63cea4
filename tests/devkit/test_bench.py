"""The trace benchmarks (`dra_gateway.devkit.bench`): openb files in, per-policy figures out,
through the real planner."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import kubernetes_validate
import pytest

from dra_gateway.allocator.planner import PlannerSettings, plan_pod
from dra_gateway.cli import main as cli_main
from dra_gateway.devkit.bench import allocator, trace

DATA = Path(__file__).parent / "data"
NODES = DATA / "openb_nodes_tiny.csv"
PODS = DATA / "openb_pods_tiny.csv"


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {"nodes": str(NODES), "pods": str(PODS), "strategies": None,
                                 "load": 1.3, "seeds": "42-43", "output": "json"}
    values.update(overrides)
    return argparse.Namespace(**values)


def test_json_output_has_every_policy_with_the_agreed_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert allocator.main(_args()) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"default", "binpack", "spread", "first-fit"}
    for figures in out["policies"].values():
        assert {"allocation_ratio", "claims_per_second", "p50_ms", "p99_ms",
                "unallocated_gpus"} <= set(figures)
        assert 0 < figures["allocation_ratio"] <= 100
        assert figures["p50_ms"] <= figures["p99_ms"]
    assert out["seeds"] == [42, 43]


def test_the_command_line_prints_a_table_for_the_chosen_policies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--policy", "first-fit", "--policy", "default", "--seeds", "7"])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["policy", "GPU", "alloc"]
    assert [line.split()[0] for line in lines[2:4]] == ["first-fit", "default"]
    assert lines[-1] == "(mean over 1 seed(s): 7)"


def test_a_larger_sample_replays_with_every_policy_above_a_sane_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args(nodes=str(DATA / "openb_nodes_small.csv"),
                 pods=str(DATA / "openb_pods_small.csv"), seeds="42")
    assert allocator.main(args) == 0
    ratios = {name: f["allocation_ratio"]
              for name, f in json.loads(capsys.readouterr().out)["policies"].items()}
    assert all(r > 80 for r in ratios.values()), ratios


def test_gpu_spec_restricts_the_models_a_pod_may_use() -> None:
    cluster = trace.TraceCluster(trace.read_nodes(NODES))
    translator = trace.Translator()
    state = cluster.state(PlannerSettings(default_strategy="first-fit"))
    trace_pod = trace.TracePod("x", 1000, 1024, 1, 250, ("V100M32",))
    pod, templates = translator.translate(trace_pod)
    pod = {**pod, "metadata": {**pod["metadata"], "uid": "u"}}
    claims = trace.claims_for(pod, templates)
    assert len(claims) == 1
    kubernetes_validate.validate(claims[0], "1.34", strict=True)
    plan = plan_pod(state, pod, claims)
    assert plan.node_name == "node-b"
    allocated = {**claims[0], "status": {"allocation": plan.allocations["u-claim-0"]}}
    kubernetes_validate.validate(allocated, "1.34", strict=True)


def test_the_sample_reaches_the_load_and_keeps_every_pod() -> None:
    pods = trace.read_pods(PODS)
    sample = trace.sample(pods, total_gpus=7, load=1.3, seed=1)
    assert sum(p.gpu_share for p in sample) >= 1.3 * 7
    assert {p.name for p in pods} <= {p.name for p in sample}
    assert trace.sample(pods, 7, 1.3, 1) == sample


def test_seeds_are_ranges_or_lists() -> None:
    assert trace.parse_seeds("42-44,50") == [42, 43, 44, 50]
    with pytest.raises(trace.TraceError, match="--seeds 'x': write a range such as 42-51"):
        trace.parse_seeds("x")


def test_a_file_without_the_openb_columns_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    broken = tmp_path / "nodes.csv"
    broken.write_text("name,cpu\nn1,1\n")
    assert allocator.main(_args(nodes=str(broken))) == 2
    err = capsys.readouterr().err
    assert "nodes.csv: missing column(s) sn, cpu_milli, memory_mib, gpu" in err


def test_an_unknown_policy_is_refused_with_the_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert allocator.main(_args(strategies=["best"], strategy_option="--policy")) == 2
    assert "--policy 'best' is not a policy; use one of default, binpack, spread, first-fit" in \
        capsys.readouterr().err


def test_an_unknown_strategy_is_refused_naming_the_flag_typed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--strategy", "best"])
    assert code == 2
    assert "--strategy 'best' is not a strategy; use one of default, binpack, spread, " \
        "first-fit" in capsys.readouterr().err


def test_policy_is_a_deprecated_name_of_strategy_that_still_works(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--strategy", "first-fit", "--policy", "binpack", "--seeds", "7"])
    assert code == 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()[2:4]] == [
        "first-fit", "binpack"]
    assert "--policy is deprecated, use --strategy (same values)" in captured.err


def test_configurations_replayed_side_by_side_place_as_each_replayed_alone() -> None:
    # Pod by pod, first in each in turn: no state passes between the replays, so each places
    # exactly what it places alone (only the times are shared with the other).
    nodes = trace.read_nodes(DATA / "openb_nodes_small.csv")
    pods = trace.read_pods(DATA / "openb_pods_small.csv")
    cluster = trace.TraceCluster(nodes)
    translator = trace.Translator()
    workload = trace.trace_workload(pods)
    catalog = trace.gpu_policies(cluster.total_gpus)
    together = trace.side_by_side(cluster, translator, pods, strategy="default", load=1.3,
                                  seed=42, workload=workload, catalogs=[None, catalog],
                                  namespaces=True)
    alone = [trace.replay(cluster, translator, pods, strategy="default", load=1.3, seed=42,
                          workload=workload, catalog=c, namespaces=True)
             for c in (None, catalog)]
    for paired, single in zip(together, alone, strict=True):
        assert (paired.ratio, paired.claims, paired.placed_pods, paired.failed_pods) == \
            (single.ratio, single.claims, single.placed_pods, single.failed_pods)
        assert len(paired.per_claim_ms) == len(single.per_claim_ms)
    # The policies change what is placed, so replays mixed up would show above.
    assert (together[0].ratio, together[0].claims, together[0].failed_pods) != \
        (together[1].ratio, together[1].claims, together[1].failed_pods)


def test_scale_multiplies_the_cluster_and_its_pods_and_reports_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--strategy", "default", "--seeds", "7", "--scale", "1,3", "-o", "json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    one, three = out["default x1"], out["default x3"]
    assert three["nodes"] == 3 * one["nodes"]
    assert three["cards"] == 3 * one["cards"]
    assert three["placed_pods"] > 2 * one["placed_pods"]
    assert one["claims_per_second_vs_first_scale"] == 1.0
    assert "claims_per_second_ratio" not in one  # that one compares policies
    assert three["state_mib"] >= 0
    assert cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--scale", "0"]) == 2
    assert "--scale '0': give whole factors" in capsys.readouterr().err


def test_defrag_moves_reports_retry_and_defrag_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--strategy", "default", "--seeds", "7", "--defrag-moves", "5",
                     "-o", "json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)["policies"]["default"]
    assert figures["allocation_ratio"] <= figures["after_retry"] <= figures["after_defrag"]
    assert figures["moves"] <= figures["pods_placed"] * 0.05 + 1e-9
    assert cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--defrag-moves", "150"]) == 2
    assert "--defrag-moves is a percentage" in capsys.readouterr().err


def test_preemption_reports_high_priority_arrivals_with_and_without_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--strategy", "default", "--seeds", "7", "--load", "2.0",
                     "--preemption", "20", "-o", "json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)["policies"]["default"]
    # On a full cluster, preemption places arrivals that would not fit otherwise.
    assert figures["placed_off"] < figures["placed_on"] <= figures["arrived"]
    assert 0 < figures["preemptions"] <= figures["placed_on"]
    assert figures["victims_max"] >= figures["victims_mean"] >= (1 if figures["preemptions"]
                                                                 else 0)
    assert cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--preemption", "0"]) == 2
    assert "--preemption is a percentage" in capsys.readouterr().err


def _run_holding(cards: dict[tuple[str, str, str], list[int]]) -> trace.RunResult:
    return trace.RunResult(ratio=0.0, unallocated=0.0, claims=0, seconds=0.0, per_claim_ms=[],
                           wall_seconds=0.0, wall_per_claim_ms=[], placed_pods=0,
                           failed_pods=0, cards=cards)


def test_losses_sum_each_card_content_over_runs_largest_first() -> None:
    first = _run_holding({("n1", "n1", "gpu-0"): [810], ("n1", "n1", "gpu-1"): [470, 470],
                          ("n2", "n2", "gpu-0"): [1000], ("n2", "n2", "gpu-1"): [320, 650]})
    second = _run_holding({("n1", "n1", "gpu-0"): [810], ("n1", "n1", "gpu-1"): [810],
                           ("n2", "n2", "gpu-0"): [470, 470]})
    # Five cards: the first run left one untouched, the second two; a full card loses nothing.
    # Free thousandths: untouched 3000, beside a lone 810 3 x 190, 470+470 2 x 60, 650+320 30.
    rows = allocator.losses_of([first, second], total_gpus=5)
    assert rows == [
        {"holds": "", "cards": 1.5, "unallocated_gpus": 1.5, "share_of_unallocated": 80.6},
        {"holds": "810", "cards": 1.5, "unallocated_gpus": 0.3, "share_of_unallocated": 15.3},
        {"holds": "470+470", "cards": 1.0, "unallocated_gpus": 0.1, "share_of_unallocated": 3.2},
        {"holds": "650+320", "cards": 0.5, "unallocated_gpus": 0.0, "share_of_unallocated": 0.8},
    ]
    assert allocator.losses_of([first, second], total_gpus=5, rows=2)[-1] == {
        "holds": "other", "cards": 1.5, "unallocated_gpus": 0.1, "share_of_unallocated": 4.0}


def test_losses_account_for_every_unallocated_gpu_of_the_replays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args(nodes=str(DATA / "openb_nodes_small.csv"),
                 pods=str(DATA / "openb_pods_small.csv"), seeds="42-43",
                 strategies=["default", "first-fit"], losses=True)
    assert allocator.main(args) == 0
    for figures in json.loads(capsys.readouterr().out)["policies"].values():
        rows = figures["losses"]
        # Each row is rounded to a tenth of a GPU.
        assert sum(row["unallocated_gpus"] for row in rows) == pytest.approx(
            figures["unallocated_gpus"], abs=0.05 * len(rows) + 0.05)
        assert sum(row["share_of_unallocated"] for row in rows) == pytest.approx(
            100, abs=0.05 * len(rows))
        ranked = [row["share_of_unallocated"] for row in rows if row["holds"] != "other"]
        assert ranked == sorted(ranked, reverse=True)


def test_losses_print_a_table_after_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--strategy", "default", "--seeds", "7", "--losses"])
    assert code == 0
    out = capsys.readouterr().out
    assert "default: where the unallocated share lies (card holds, in thousandths)" in out
    assert out.splitlines()[4] == ""


def test_losses_are_refused_with_scale(capsys: pytest.CaptureFixture[str]) -> None:
    assert allocator.main(_args(losses=True, scale="1,2")) == 2
    assert "--losses reports the plain replays" in capsys.readouterr().err


def test_groups_replay_jobs_with_and_without_all_or_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "allocator", "--nodes", str(DATA / "openb_nodes_small.csv"),
                     "--pods", str(DATA / "openb_pods_small.csv"), "--strategy", "default",
                     "--seeds", "3-4", "--load", "3.0", "--groups", "-o", "json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)["policies"]
    alone, grouped = figures["default alone"], figures["default groups"]
    assert alone["jobs"] == grouped["jobs"] > 0
    # All or nothing: no job is left partly placed, and no job's cards mix models.
    assert grouped["jobs_partial"] == 0
    assert grouped["partial_gpus"] == 0.0
    assert grouped["jobs_mixed_models"] == 0
    assert alone["jobs_whole"] + alone["jobs_partial"] <= alone["jobs"]
    assert cli_main(["bench", "allocator", "--nodes", str(NODES), "--pods", str(PODS),
                     "--groups", "--preemption", "10"]) == 2
    assert "--groups measures pod groups alone" in capsys.readouterr().err


def test_jobs_are_dealt_from_multi_card_pods_with_two_to_sixteen_members() -> None:
    from dra_gateway.devkit.bench.groups import deal_jobs

    pods = trace.read_pods(DATA / "openb_pods_small.csv")
    sampled = trace.sample(pods, 200, 3.0, 5)
    jobs = deal_jobs(sampled, 5)
    assert jobs == deal_jobs(sampled, 5)  # the seed's own draw
    assert jobs
    assert all(sampled[n].num_gpu >= 2 for n in jobs)
    sizes = Counter(jobs.values())
    assert all(2 <= size <= 16 for size in sizes.values()), sizes


def test_topology_bench_places_multi_card_pods_on_aligned_cards_more_often(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli_main(["bench", "topology", "--nodes", "4", "--pods", "400", "--seeds", "1",
                     "-o", "json"])
    assert code == 0
    figures = json.loads(capsys.readouterr().out)["configurations"]
    assert set(figures) == {"topology", "no topology", "first-fit"}
    for size in (2, 4):
        assert figures["topology"][f"placed_{size}"] > 0
        assert figures["topology"][f"one_numa_{size}"] > figures["no topology"][
            f"one_numa_{size}"], size
    assert cli_main(["bench", "topology", "--load", "0"]) == 2
    assert "--load" in capsys.readouterr().err
