"""Log calls never pass an `extra=` key that LogRecord owns.

`logging` refuses such a key (`KeyError: "Attempt to overwrite 'name' in LogRecord"`) when the
record is made, that is only when the level is enabled: the call that should report a problem
then raises instead. Every literal `extra={...}` in the package is checked here.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import dra_gateway

_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime"}


def _extra_keys(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
                found += [(key.lineno, key.value) for key in keyword.value.keys
                          if isinstance(key, ast.Constant) and isinstance(key.value, str)]
    return found


def test_no_log_call_overwrites_a_log_record_attribute() -> None:
    root = Path(dra_gateway.__file__).parent
    clashes = [f"{path.relative_to(root)}:{line}: {key!r}"
               for path in sorted(root.rglob("*.py"))
               for line, key in _extra_keys(ast.parse(path.read_text(), str(path)))
               if key in _RESERVED]
    assert clashes == []


def test_the_check_sees_a_clash() -> None:
    tree = ast.parse('log.info("x", extra={"kind": "Pod", "name": "web"})')
    assert [key for _, key in _extra_keys(tree) if key in _RESERVED] == ["name"]
