"""The component folders are imported through `dra_gateway` only, never by their folder names.

The folders sit at the repository root and reach the package through links (ARCHITECTURE.md,
"Layout"). `python -m pytest` and scripts run from the root put it on the import path, so
`import kube` would work there and load a second copy of the core, whose exception classes and
registries then no longer match the package's. This test reads every Python file of the
repository and refuses such an import.
"""

from __future__ import annotations

import ast
from pathlib import Path

from testkit import REPOSITORY

COMPONENT_FOLDERS = frozenset({"kube", "gpu", "translator", "allocator", "webhook", "node_plugin",
                               "node-plugin", "certs", "policy"})
SKIPPED = frozenset({".venv", ".git", "build", "dist", ".mypy_cache", ".ruff_cache", "src"})


def python_files() -> list[Path]:
    """Every Python file of the repository, each once (through its real folder, not a link)."""
    found = []
    for path in sorted(REPOSITORY.rglob("*.py")):
        parts = path.relative_to(REPOSITORY).parts
        if parts[0] in SKIPPED or path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        found.append(path)
    return found


def top_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def offenders(files: list[Path]) -> list[str]:
    return [f"{path.relative_to(REPOSITORY)}:{line}: import {name}"
            for path in files
            for line, name in top_level_imports(ast.parse(path.read_text(), str(path)))
            if name in COMPONENT_FOLDERS]


def test_no_file_imports_a_component_by_its_folder_name() -> None:
    files = python_files()
    # Over 300 files when this was written; far fewer means the walk lost a folder.
    assert len(files) >= 200, len(files)
    assert {f.relative_to(REPOSITORY).parts[0] for f in files} >= {
        "kube", "translator", "allocator", "webhook", "node-plugin", "certs", "policy", "tests"}
    assert offenders(files) == []


def test_the_check_sees_a_top_level_import(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "import kube.cel\nfrom allocator import controller\nimport dra_gateway.kube\n")
    found = [name for _, name in top_level_imports(ast.parse((tmp_path / "bad.py").read_text()))
             if name in COMPONENT_FOLDERS]
    assert found == ["kube", "allocator"]
