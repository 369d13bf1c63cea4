"""What the components' command lines share, so that they speak one dialect (light imports
only): argument types, the options every command spells alike (`--namespace NAMESPACE`,
`--kubeconfig FILE`, `-o/--output`, durations), and the one way a failure is said
(`error: <message>` on stderr). tests/test_cli_dialect.py holds every command to them.

Values are checked at the flag, so that a value the API server would refuse is named where it
was given, not at the first write far from it. Nothing here exits: handlers return the code.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Final

# RFC 1123 label, as namespace and Service names are.
DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def namespace(value: str) -> str:
    """An argparse type: `value` if it is a namespace name (a DNS label)."""
    if not DNS_LABEL.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a namespace name (a DNS label: lowercase letters, digits, '-')")
    return value


def label_key(value: str) -> str:
    """An argparse type: `value` if it is a label key (`name` or `prefix/name`)."""
    from dra_gateway.kube.objects import is_label_key

    if not is_label_key(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a label key (name or prefix/name, as "
            "topology.kubernetes.io/zone)")
    return value


_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|ms|s|m|h)")
_UNIT_SECONDS: Final = {"ns": 1e-9, "us": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# What every duration flag's help says of its value; its metavar is DURATION.
DURATION_EXAMPLES: Final = "e.g. 30s, 5m"


class Duration:
    """An argparse type: seconds from a Go or Kubernetes duration (`300ms`, `30s`, `5m`, `1h`,
    `1h30m`) or a bare number of seconds (`120`, what the flags took before and the chart still
    passes); never negative, and above zero where `positive`. `hint` ends every refusal, e.g. the
    switch that turns the thing off. Every duration flag of every command parses with an
    instance of this class, so that `5m` means the same everywhere (tests/test_cli_dialect.py)."""

    def __init__(self, *, positive: bool = False, hint: str = "") -> None:
        self.positive = positive
        self.hint = hint
        # argparse names the type in its own messages by __name__.
        self.__name__ = "duration"

    def __call__(self, value: str) -> float:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_PART.findall(text)
            if not parts or "".join(number + unit for number, unit in parts) != text:
                raise self._refuse(f"{value!r} is not a duration: give seconds (120) or a "
                                   "duration such as 90s, 2m, 1m30s or 500ms") from None
            seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
        if not math.isfinite(seconds) or seconds < 0:
            raise self._refuse(f"{value!r} is not a duration of zero or more seconds")
        if self.positive and seconds == 0:
            raise self._refuse(f"{value!r} is not a positive duration")
        return seconds

    def _refuse(self, message: str) -> argparse.ArgumentTypeError:
        return argparse.ArgumentTypeError(f"{message}; {self.hint}" if self.hint else message)


duration: Final = Duration()
positive_duration: Final = Duration(positive=True)


def format_duration(seconds: float) -> str:
    """`seconds` as the shortest duration string `Duration` reads back: 600 -> 10m, 90 ->
    1m30s, 0.5 -> 500ms, 0 -> 0s."""
    if seconds and seconds < 1:
        return f"{seconds * 1000:g}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, rest = divmod(rest, 60)
    parts = [f"{hours:g}h" if hours else "", f"{minutes:g}m" if minutes else "",
             f"{rest:g}s" if rest or not (hours or minutes) else ""]
    return "".join(parts)


def duration_help(text: str, default: float | None = None) -> str:
    """The help of a duration flag: `text`, the examples and the default as a duration."""
    shown = "" if default is None else f"; default: {format_duration(default)}"
    return f"{text} ({DURATION_EXAMPLES}{shown})".replace("%", "%%")


# The one help of every `--kubeconfig` that reads a cluster: connect() resolves it so for every
# command (kube/cluster/connect.py).
KUBECONFIG_HELP: Final = ("kubeconfig file (default: $KUBECONFIG, the pod's service account "
                          "in a cluster, then ~/.kube/config)")


def kubeconfig_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--kubeconfig FILE`, the cluster a command reads or writes."""
    parser.add_argument("--kubeconfig", metavar="FILE", help=KUBECONFIG_HELP)


class _DeprecatedAlias(argparse.Action):
    """A former name of an option, hidden from the help: stores as the option does and says on
    stderr which name to use instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, instead: str,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        warn(f"{option_string} is deprecated, use {self.instead} (same values)")
        setattr(namespace, self.dest, values)


def namespace_option(parser: argparse.ArgumentParser, *, help: str, default: str | None,
                     deprecated: Sequence[str] = ()) -> None:
    """`--namespace NAMESPACE`: the one spelling of a namespace flag, checked as the API server
    would check it. `deprecated`: former names of the flag, still accepted but left out of the
    help (a warning names `--namespace`); two actions, since argparse shows every option string
    of one action."""
    parser.add_argument("--namespace", type=namespace, default=default, metavar="NAMESPACE",
                        help=help)
    for former in deprecated:
        # default=SUPPRESS: the alias never overwrites --namespace's default.
        parser.add_argument(former, dest="namespace", type=namespace, metavar="NAMESPACE",
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                            action=_DeprecatedAlias, instead="--namespace")


# The formats `-o` may offer, and the one word for human output: `table` (kubectl's word),
# never `text`. `yaml` only where a command prints Kubernetes objects.
OUTPUT_FORMATS: Final = ("table", "json", "yaml", "html")


def output_option(parser: argparse.ArgumentParser, *formats: str,
                  aliases: Mapping[str, str] | None = None) -> None:
    """`-o/--output` with `formats`, the first the default, and its one help. `aliases`: former
    names of a format, still accepted, not shown (`text` for `table`)."""
    unknown = set(formats) - set(OUTPUT_FORMATS)
    if unknown:
        raise ValueError(f"output formats {sorted(unknown)} are not among {OUTPUT_FORMATS}")
    renamed = dict(aliases or {})

    def output(value: str) -> str:
        return renamed.get(value, value)

    output.__name__ = "output format"
    *first, last = formats
    listed = f"{', '.join(first)} or {last}" if first else last
    parser.add_argument("-o", "--output", choices=formats, default=formats[0], type=output,
                        help=f"output format: {listed} (default: {formats[0]})")


def error(message: str, code: int) -> int:
    """Say a user-facing failure on stderr, as `error: <message>`, and give back the exit code
    for the handler to return: the one prefix of every command's failures."""
    print(f"error: {message}", file=sys.stderr)
    return code


def warn(message: str) -> None:
    """Say something the user should fix that did not stop the command: `warning: <message>`."""
    print(f"warning: {message}", file=sys.stderr)
