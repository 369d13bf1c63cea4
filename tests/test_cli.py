from __future__ import annotations

from pathlib import Path

import pytest

from dra_gateway.cli import build_parser, main


def test_help_lists_every_component_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "bench"):
        assert command in out


def test_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["no-such-command"])
    assert exc.value.code == 2


@pytest.mark.parametrize("argv", [
    ["--token", "secret", "--no-token"],  # --no-token silently won: the token was ignored
    ["--token", ""],  # an empty token was silently replaced by a random one
    ["--token", "two words"],
])
def test_cluster_serve_refuses_a_token_it_would_not_use(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["cluster", "serve", "--kubeconfig", "kc", *argv])
    assert exc.value.code == 2
    assert "--token" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "default"), [
    (["cluster", "serve"], "(default: 1000)"),
    (["bench", "cluster"], "(default: 2000)"),
    (["bench", "cluster"], "(default: 16)"),
])
def test_help_states_the_defaults(argv: list[str], default: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    assert default in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flag", ["--strategy", "--policy"])
def test_allocator_packing_strategy_is_strategy_and_policy_its_deprecated_name(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["allocator"]).strategy == "default"
    assert build_parser().parse_args(["allocator", flag, "binpack"]).strategy == "binpack"
    deprecated = "warning: --policy is deprecated, use --strategy (same values)\n"
    assert capsys.readouterr().err == (deprecated if flag == "--policy" else "")


def test_allocator_refuses_a_namespace_the_api_would_refuse(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Accepted until the first Lease write, which the API server refuses far from the flag.
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["allocator", "--namespace", "Team_A"])
    assert exc.value.code == 2
    assert "argument --namespace: 'Team_A' is not a namespace name" in capsys.readouterr().err


def test_bench_allocator_names_a_trace_that_is_not_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_bytes(b"\xff\xfe\x00sn,cpu_milli\n")

    code = main(["bench", "allocator", "--nodes", str(nodes), "--pods", str(nodes)])

    assert code == 2  # was a UnicodeDecodeError traceback
    assert capsys.readouterr().err == (f"dra-gateway bench allocator: {nodes}: not a text file "
                                       "(not UTF-8); give an openb CSV\n")


def test_webhook_tls_dir_that_is_a_file_is_named_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It said "tls.crt and tls.key not found" and suggested `certs generate --out FILE`,
    # which fails on a file too.
    tls = tmp_path / "tls.crt"
    tls.write_text("")
    assert main(["webhook", "--listen", "127.0.0.1:0", "--tls-dir", str(tls)]) == 2
    assert capsys.readouterr().err == (f"error: --tls-dir {tls} is a file; pass the folder "
                                       "that holds tls.crt and tls.key\n")


@pytest.mark.parametrize(("command", "text"), [
    ("webhook", "--log-level {debug,info,warning,error} least severe level logged, in any "
                "case (default: info)"),
    ("webhook-config", "--no-builtin-rules derive the configurations from the --rules files")])
def test_every_webhook_option_is_explained(command: str, text: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert text in " ".join(capsys.readouterr().out.split())


def test_log_levels_are_accepted_in_either_case() -> None:
    # The node plugin took only DEBUG..ERROR and the webhook only debug..error.
    base = ["node-plugin", "serve", "--inventory", "i.yaml", "--node-name", "n"]
    assert build_parser().parse_args([*base, "--log-level", "debug"]).log_level == "DEBUG"
    args = build_parser().parse_args(["webhook", "--tls-dir", "t", "--log-level", "WARNING"])
    assert args.log_level == "warning"


@pytest.mark.parametrize(("value", "seconds"), [
    ("120", 120.0), ("2m", 120.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0),
    ("0", 0.0), ("0s", 0.0), ("1.5m", 90.0)])
def test_webhook_gated_event_after_takes_a_duration(value: str, seconds: float) -> None:
    args = build_parser().parse_args(["webhook", "--tls-dir", "t", "--gated-event-after", value])
    assert args.gated_event_after == seconds


def test_webhook_gated_event_after_defaults_to_two_minutes_and_refuses_nonsense(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args(["webhook", "--tls-dir", "t"]).gated_event_after == 120.0
    for value in ("-1s", "2x", "1m 30s", "inf", "m"):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["webhook", "--tls-dir", "t", "--gated-event-after",
                                       value])
        assert exc.value.code == 2
        assert "argument --gated-event-after:" in capsys.readouterr().err, value
