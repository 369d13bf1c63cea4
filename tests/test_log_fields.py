"""Log calls never pass an `extra=` key that LogRecord owns.

`logging` refuses such a key (`KeyError: "Attempt to overwrite 'name' in LogRecord"`) when the
record is made, that is only when the level is enabled: the call that should report a problem
then raises instead. Every literal `extra={...}` in the package is checked here.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import pkgutil
from pathlib import Path

import pytest

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


# The component packages: each must contribute its modules, so that a layout change that hides
# a folder from the walk (a link a tool does not follow, a moved package) fails here.
COMPONENTS = ("allocator", "certs", "kube", "node_plugin", "translator", "webhook")


def package_modules() -> dict[str, Path]:
    """Every module of the package, by name, as the import system finds it.

    Walking the import system rather than the file tree sees modules wherever the layout puts
    them; a file walk (`rglob`) did not enter the linked component folders and checked 4 of
    95 modules.
    """
    found: dict[str, Path] = {}
    for info in pkgutil.walk_packages(dra_gateway.__path__, prefix="dra_gateway."):
        spec = importlib.util.find_spec(info.name)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            found[info.name] = Path(spec.origin)
    return found


def _clashes(modules: dict[str, Path]) -> list[str]:
    return [f"{name}:{line}: {key!r}"
            for name, path in sorted(modules.items())
            for line, key in _extra_keys(ast.parse(path.read_text(), str(path)))
            if key in _RESERVED]


def test_the_walk_sees_every_component_module() -> None:
    modules = package_modules()
    per_component = {c: sum(1 for n in modules if n.startswith(f"dra_gateway.{c}."))
                     for c in COMPONENTS}
    assert all(n >= 3 for n in per_component.values()), per_component
    # 95 modules when this was written: far fewer means the walk lost a folder.
    assert len(modules) >= 80, f"only {len(modules)} modules seen: {sorted(modules)}"


def test_no_log_call_overwrites_a_log_record_attribute() -> None:
    assert _clashes(package_modules()) == []


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_clash_in_any_component_module_is_found(component: str, tmp_path: Path) -> None:
    # The same walk, with one module of the component replaced by one that logs `name`.
    modules = package_modules()
    victim = min(n for n in modules if n.startswith(f"dra_gateway.{component}."))
    bad = tmp_path / "bad.py"
    bad.write_text(modules[victim].read_text() +
                   '\nlog.info("x", extra={"kind": "Pod", "name": "web"})\n')
    assert _clashes({**modules, victim: bad}) == [f"{victim}:{_last_line(bad)}: 'name'"]


def _last_line(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_check_sees_a_clash() -> None:
    tree = ast.parse('log.info("x", extra={"kind": "Pod", "name": "web"})')
    assert [key for _, key in _extra_keys(tree) if key in _RESERVED] == ["name"]
