"""The gateway's default namespace has one home, `kube.names.GATEWAY_NAMESPACE`.

Every `--namespace` default, settings default and namespace list of the production code reads
it; none spells "dra-gateway" again (the driver's, the labels' and the components' names are
other facts and are not looked at). This test reads the code and refuses such a literal.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from testkit import REPOSITORY

from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.kube import names
from dra_gateway.kube.runtime.leader import LeaseSettings
from dra_gateway.migrate.plan import DEFAULT_EXCLUDED
from dra_gateway.webhook.settings import WebhookSettings

LITERAL = "dra-gateway"
FOLDERS = ("kube", "allocator", "webhook", "node-plugin", "policy", "translator", "certs")
HOME = REPOSITORY / "kube" / "names.py"


def production_files() -> list[Path]:
    """The component folders, and the package's own files (commands, migrate, devkit), each
    through its real path (src/dra_gateway links to the component folders)."""
    found = [p for folder in FOLDERS for p in sorted((REPOSITORY / folder).rglob("*.py"))]
    # os.walk does not descend into the links.
    for folder, _, files in os.walk(REPOSITORY / "src" / "dra_gateway"):
        found += [Path(folder) / f for f in sorted(files) if f.endswith(".py")]
    return [p for p in found if p != HOME and "_pb2" not in p.name]


def _is_literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == LITERAL


def _contains_literal(node: ast.AST | None) -> bool:
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_literal(e) for e in node.elts)
    return _is_literal(node)


def _name(target: ast.AST) -> str:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return ""


def _about_namespaces(name: str) -> bool:
    return "namespace" in name.lower() or "excluded" in name.lower()


def offenders(tree: ast.AST) -> list[int]:
    """Lines where "dra-gateway" is written as a namespace default."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            named = any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and "namespace" in a.value for a in node.args)
            if named and any(k.arg == "default" and _is_literal(k.value) for k in node.keywords):
                lines.append(node.lineno)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if (any(_about_namespaces(_name(t)) for t in targets)
                    and _contains_literal(node.value)):
                lines.append(node.lineno)
        elif isinstance(node, ast.arguments):
            positional = [*node.posonlyargs, *node.args]
            pairs = [*zip(positional[len(positional) - len(node.defaults):], node.defaults,
                          strict=True),
                     *zip(node.kwonlyargs, node.kw_defaults, strict=True)]
            lines += [arg.lineno for arg, default in pairs
                      if _about_namespaces(arg.arg) and _is_literal(default)]
    return sorted(lines)


def test_no_production_file_spells_the_gateway_namespace_again() -> None:
    files = production_files()
    assert len(files) >= 200, len(files)
    assert REPOSITORY / "src" / "dra_gateway" / "report.py" in files
    found = [f"{path.relative_to(REPOSITORY)}:{line}"
             for path in files
             for line in offenders(ast.parse(path.read_text(), str(path)))]
    assert found == []


def test_the_check_sees_each_kind_of_default() -> None:
    source = '''
parser.add_argument("--namespace", default="dra-gateway")
namespace: str = "dra-gateway"
NAMESPACE = "dra-gateway"
DEFAULT_EXCLUDED = ("kube-system", "dra-gateway")
def read(kubeconfig, namespace="dra-gateway", *, gateway_namespace="dra-gateway"): ...
parser.add_argument("--driver", default="dra-gateway")
MANAGED_BY = "dra-gateway"
'''
    assert offenders(ast.parse(source)) == [2, 3, 4, 5, 6, 6]


def test_the_defaults_are_the_constant() -> None:
    assert names.GATEWAY_NAMESPACE == LITERAL
    assert ControllerSettings().namespace == names.GATEWAY_NAMESPACE
    assert WebhookSettings().namespace == names.GATEWAY_NAMESPACE
    assert LeaseSettings(identity="me").namespace == names.GATEWAY_NAMESPACE
    assert names.GATEWAY_NAMESPACE in DEFAULT_EXCLUDED
