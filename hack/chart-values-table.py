#!/usr/bin/env python3
"""Write the values table of the chart's README (helm/dra-gateway/README.md) from values.yaml.

Every key of values.yaml is described by the comment lines right above it (tests/helm/test_chart.py
checks that each has one); this script turns them into a Markdown table, one row per key, nested
keys dotted (lists are not entered), and writes it between the README's markers
`<!-- values-table:begin -->` and `<!-- values-table:end -->`.

    hack/chart-values-table.py           rewrite the table in place
    hack/chart-values-table.py --check   exit 1 (saying so) when the README's table is not what
                                         values.yaml gives (tests/helm/test_chart_readme.py)

hack/gen-docs.py writes the same table (`table`) into docs/reference/values.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "dra-gateway"
BEGIN = "<!-- values-table:begin -->"
END = "<!-- values-table:end -->"


def _comment_above(lines: list[str], line: int) -> str:
    """The comment lines right above line number `line` (0-based), joined."""
    found: list[str] = []
    index = line - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        found.append(lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(reversed(found))


def _default(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode) and node.value:
        return ""
    value = yaml.safe_load(yaml.serialize(node))
    text = json.dumps(value, separators=(", ", ": "))
    if len(text) > 60:
        return "see values.yaml"
    return f"`{text}`"


def rows(text: str) -> list[tuple[str, str, str]]:
    """(dotted key, default, description) of every key of a values document, in file order."""
    lines = text.splitlines()
    out: list[tuple[str, str, str]] = []

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key, value in node.value:
            name = f"{prefix}{key.value}"
            description = _comment_above(lines, key.start_mark.line).replace("|", "\\|")
            out.append((name, _default(value), description))
            if isinstance(value, yaml.MappingNode):
                walk(value, name + ".")

    root = yaml.compose(text)
    assert isinstance(root, yaml.MappingNode)
    walk(root, "")
    return out


def table(text: str) -> str:
    body = [f"| `{name}` | {default} | {description} |"
            for name, default, description in rows(text)]
    return "\n".join(["| Key | Default | Description |", "|---|---|---|", *body])


def rewrite(readme: str, values: str) -> str:
    """`readme` with the text between its markers replaced by the table of `values`."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"the README lacks the markers {BEGIN} and {END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(values)}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail when the README's table is out of date; change nothing")
    parser.add_argument("--chart", type=Path, default=CHART, help="the chart's folder")
    args = parser.parse_args()
    readme_path = args.chart / "README.md"
    readme = readme_path.read_text()
    wanted = rewrite(readme, (args.chart / "values.yaml").read_text())
    if wanted == readme:
        return 0
    if args.check:
        print(f"{readme_path}: the values table differs from values.yaml; run "
              "hack/chart-values-table.py to rewrite it", file=sys.stderr)
        return 1
    readme_path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
