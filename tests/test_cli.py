from __future__ import annotations

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
