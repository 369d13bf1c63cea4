"""Every command of `dra-gateway` speaks one dialect (`kube/arguments.py`).

The real parser of `dra_gateway.cli` is walked, every command and subcommand, so that a command
added later is held to the same rules without being named here: a one-line help and a
description; help on every option; metavars from one small vocabulary; `-o/--output` with the
same formats and help; `--namespace NAMESPACE` for a namespace; one duration parser; one
`--kubeconfig FILE`; each command named in the pages an operator reads (README.md and docs/,
besides the generated reference) and given a section of docs/reference/cli.md. What the user
sees when a command fails (`error: <message>`) and when none is given (the help, exit 0) is
tested here too.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from testkit import REPOSITORY

from dra_gateway.cli import build_parser, main
from dra_gateway.kube import arguments

# Metavars are uppercase words of this vocabulary, joined by "/", ":" or "=" where a value has
# parts (HOST:PORT, NAMESPACE/NAME); a flag with choices shows them instead.
METAVAR_WORDS = frozenset({
    "FILE", "DIR", "PATH", "NAMESPACE", "NAME", "POD", "NODE", "DEVICE", "DURATION", "COUNT",
    "HOST", "PORT", "ADDR", "URL", "LABEL", "STRATEGY", "PERCENT", "DAYS", "NUMBER", "SEEDS",
    "FACTORS", "VARIABLE", "TOKEN", "ID", "RULE", "COMMAND", "BENCH", "ACTION",
})
# Where -o may offer yaml: the commands that print Kubernetes objects.
PRINTS_OBJECTS = frozenset({
    "translate", "webhook-config", "migrate quotas", "node-plugin discover",
    "node-plugin device-classes",
})
# A --kubeconfig that is written, not read: the embedded API's for kubectl.
WRITES_KUBECONFIG = frozenset({"cluster serve"})
# Flags that take a time, by name: each must parse with the one duration type.
TIME_WORDS = ("timeout", "deadline", "after", "interval", "seconds", "window", "hold", "wait")


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    parser: argparse.ArgumentParser
    help: str | None

    @property
    def name(self) -> str:
        return " ".join(self.path)


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = (),
          help: str | None = "") -> Iterator[Command]:
    yield Command(path, parser, help)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                if child.prog.split()[-1] == name:  # aliases are the same parser again
                    yield from _walk(child, (*path, name), helps.get(name))


COMMANDS = list(_walk(build_parser()))
SUBCOMMANDS = [c for c in COMMANDS if c.path]


def _options(command: Command) -> Iterator[argparse.Action]:
    for action in command.parser._actions:
        if action.option_strings and not isinstance(
                action, argparse._HelpAction | argparse._VersionAction):
            yield action


def _shown(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS


def _metavar(action: argparse.Action) -> str | None:
    """The metavar argparse shows, None where the flag takes no value or shows its choices."""
    if action.nargs == 0 or (action.metavar is None and action.choices is not None):
        return None
    metavar = action.metavar or action.dest.upper()
    return metavar if isinstance(metavar, str) else " ".join(metavar)


def test_the_walk_reaches_every_component_and_its_subcommands() -> None:
    names = {c.name for c in COMMANDS}
    assert {"report", "migrate plan", "defrag apply", "devices list", "rules check",
            "certs generate", "webhook-config", "node-plugin discover", "allocator",
            "smoke"} <= names


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda c: c.name)
def test_every_command_has_a_one_line_help_and_a_description(command: Command) -> None:
    assert command.help, f"{command.name}: help= missing"
    assert "\n" not in command.help, command.name
    assert command.parser.description, f"{command.name}: description= missing"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name or "dra-gateway")
def test_every_option_is_explained_with_a_metavar_of_the_vocabulary(command: Command) -> None:
    for action in _options(command):
        if not _shown(action):
            continue
        flag = "/".join(action.option_strings)
        assert action.help, f"{command.name} {flag}: no help"
        metavar = _metavar(action)
        if metavar is not None:
            words = re.split(r"[/:=]", metavar)
            assert all(w in METAVAR_WORDS for w in words), f"{command.name} {flag}: {metavar}"
    for action in command.parser._actions:
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            assert action.help, f"{command.name} {action.dest}: positional without help"
            assert _metavar(action) in METAVAR_WORDS | {None}, f"{command.name} {action.dest}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name or "dra-gateway")
def test_output_formats_are_one_vocabulary_with_one_help(command: Command) -> None:
    for action in _options(command):
        if "--output" not in action.option_strings:
            continue
        assert action.option_strings == ["-o", "--output"], command.name
        formats = tuple(action.choices or ())
        assert set(formats) <= set(arguments.OUTPUT_FORMATS), f"{command.name}: {formats}"
        assert "text" not in formats  # the word is table
        if "yaml" in formats:
            assert command.name in PRINTS_OBJECTS, f"{command.name} prints no Kubernetes object"
        assert action.help, command.name
        assert action.help.startswith("output format: "), command.name
        assert all(f in action.help for f in formats), command.name


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name or "dra-gateway")
def test_a_namespace_flag_is_namespace_checked_as_the_api_server_would(command: Command) -> None:
    for action in _options(command):
        if action.dest != "namespace":
            continue
        if _shown(action):
            assert action.option_strings == ["--namespace"], command.name
            assert action.metavar == "NAMESPACE", command.name
        assert action.type is arguments.namespace, command.name
    visible = {s for a in _options(command) if _shown(a) for s in a.option_strings}
    assert "--gateway-namespace" not in visible, command.name
    assert "-n" not in visible, command.name


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name or "dra-gateway")
def test_every_duration_flag_parses_with_the_one_duration_type(command: Command) -> None:
    for action in _options(command):
        flag = action.option_strings[-1]
        timely = any(word in flag for word in TIME_WORDS) and action.nargs != 0
        if action.metavar == "DURATION" or timely or isinstance(action.type, arguments.Duration):
            assert isinstance(action.type, arguments.Duration), f"{command.name} {flag}"
            assert action.metavar == "DURATION", f"{command.name} {flag}"
            assert action.help, f"{command.name} {flag}"
            assert f"({arguments.DURATION_EXAMPLES}" in action.help, f"{command.name} {flag}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name or "dra-gateway")
def test_kubeconfig_is_one_flag_with_one_help(command: Command) -> None:
    for action in _options(command):
        if action.dest == "kubeconfig":
            assert action.option_strings == ["--kubeconfig"], command.name
            assert action.metavar == "FILE", command.name
            if command.name not in WRITES_KUBECONFIG:
                assert action.help == arguments.KUBECONFIG_HELP, command.name


@pytest.mark.parametrize(("value", "seconds"), [
    ("300ms", 0.3), ("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("1h30m", 5400.0),
    ("120", 120.0), ("0", 0.0), ("2.5", 2.5), ("1.5m", 90.0)])
def test_a_duration_is_a_go_duration_or_a_bare_number_of_seconds(value: str,
                                                                 seconds: float) -> None:
    assert arguments.duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["-1s", "5 m", "m", "5d", "inf", "nan", ""])
def test_a_duration_that_is_none_is_refused(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        arguments.duration(value)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.5, "500ms"), (30, "30s"), (90, "1m30s"), (600, "10m"), (3600, "1h"),
    (5400, "1h30m")])
def test_a_default_is_shown_as_the_duration_it_parses_back_from(seconds: float,
                                                               text: str) -> None:
    assert arguments.format_duration(seconds) == text
    assert arguments.duration(text) == seconds


@pytest.mark.parametrize(("argv", "dest", "seconds"), [
    (["allocator", "--defrag-after", "1h30m"], "defrag_after", 5400.0),
    (["defrag", "plan", "--window", "300"], "window", 300.0),
    (["webhook", "--tls-dir", "t", "--review-deadline", "4s"], "review_deadline", 4.0),
    (["smoke", "--webhook-url", "u", "--ca-file", "c", "--timeout", "500ms"], "timeout", 0.5),
    (["node-plugin", "serve", "--nvml", "--node-name", "n", "--recovery-seconds", "10m"],
     "recovery_seconds", 600.0),
    (["node-plugin", "serve", "--nvml", "--node-name", "n", "--admin-check-seconds", "10"],
     "admin_check_seconds", 10.0),
])
def test_duration_flags_take_go_durations_and_bare_seconds_alike(
        argv: list[str], dest: str, seconds: float) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == seconds


# The pages written by hand: the README and docs/, less the reference generated from the parser
# (which names every command by construction; tests/test_docs.py keeps it up to date).
GUIDES = {str(path.relative_to(REPOSITORY)): path.read_text(encoding="utf-8")
          for path in [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").rglob("*.md"))]
          if "reference" not in path.relative_to(REPOSITORY).parts}
CLI_REFERENCE = (REPOSITORY / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=lambda c: c.name)
def test_every_command_is_named_in_the_docs(command: Command) -> None:
    # `dra-gateway NAME` for a command; `PARENT NAME` (as in `rules check`) for a subcommand.
    words = command.path if len(command.path) > 1 else ("dra-gateway", *command.path)
    pattern = r"\s+".join(re.escape(w) for w in words) + r"(?![\w-])"
    assert any(re.search(pattern, text) for text in GUIDES.values()), (
        f"neither README.md nor docs/ (besides docs/reference/) names `{' '.join(words)}`")
    heading = " ".join(("dra-gateway", *command.path))
    assert f"\n## `{heading}`\n" in CLI_REFERENCE, (
        f"docs/reference/cli.md has no section for `{heading}`; run "
        "`.venv/bin/python hack/gen-docs.py`")


def test_dra_gateway_alone_prints_its_commands_and_exits_0(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dra-gateway")
    for command in ("report", "migrate", "translate", "node-plugin", "webhook-config"):
        assert f"    {command}" in out


@pytest.mark.parametrize("group", [c for c in SUBCOMMANDS if any(
    isinstance(a, argparse._SubParsersAction) for a in c.parser._actions)], ids=lambda c: c.name)
def test_a_command_group_alone_prints_its_subcommands_and_exits_0(
        group: Command, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(list(group.path)) == 0
    assert capsys.readouterr().out.startswith(f"usage: dra-gateway {group.name}")


def test_migrate_gateway_namespace_is_a_hidden_deprecated_name_of_namespace(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["migrate", "plan"]).namespace == "dra-gateway"
    assert capsys.readouterr().err == ""
    args = parser.parse_args(["migrate", "plan", "--gateway-namespace", "gw"])
    assert args.namespace == "gw"
    assert capsys.readouterr().err == (
        "warning: --gateway-namespace is deprecated, use --namespace (same values)\n")
    assert parser.parse_args(["migrate", "node", "n", "--namespace", "gw"]).namespace == "gw"
    with pytest.raises(SystemExit):
        main(["migrate", "plan", "--help"])
    assert "--gateway-namespace" not in capsys.readouterr().out


def test_migrate_node_says_table_and_still_takes_text(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["migrate", "node", "n"]).output == "table"
    assert parser.parse_args(["migrate", "node", "n", "-o", "text"]).output == "table"
    with pytest.raises(SystemExit):
        main(["migrate", "node", "--help"])
    assert "{table,json}" in capsys.readouterr().out


def test_failures_say_error_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each prefix that was its own (`dra-gateway migrate plan:`, `certs generate:`,
    `webhook:`, `refused:`) is `error:` now; the exit codes are as they were."""
    bad = tmp_path / "dump.yaml"
    bad.write_text("kind: [\n")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
                        "  - name: c\n    resources: {limits: {nvidia.com/gpu: '-1'}}\n")
    cases = [
        (["migrate", "plan", "-f", str(bad)], 2),
        (["certs", "generate", "--out", str(tmp_path / "certs")], 2),
        (["webhook", "--tls-dir", str(tmp_path / "none")], 2),
        (["webhook-config", "--service", "a/b", "--ca-file", str(tmp_path / "none")], 2),
        (["translate", "-f", str(manifest)], 1),
        (["smoke", "--webhook-url", "https://127.0.0.1:1", "--ca-env", "NO_SUCH_CA_VAR"], 2),
    ]
    for argv, code in cases:
        assert main(argv) == code, argv
        err = capsys.readouterr().err
        assert err.startswith("error: "), (argv, err)
