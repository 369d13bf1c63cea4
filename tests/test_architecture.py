"""ARCHITECTURE.md stays true to the tree where its claims are mechanical: every file or folder
it names in backquotes exists (a path from the repository root or from `src/dra_gateway/`, or,
for a bare file name, somewhere in the tree), and the import layers it states are the import
contract's (`.importlinter`)."""

from __future__ import annotations

import configparser
import re

from testkit import REPOSITORY

ARCHITECTURE = REPOSITORY / "ARCHITECTURE.md"
_PATH = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?)`")
_FILE = re.compile(r"\.(?:py|yaml|md|sh|json|proto|toml|csv)$")


def _named_paths(text: str) -> set[str]:
    """What reads as a path: a name with a folder, or a file name. A first part with a dot
    is a domain (an annotation, a label, an API group such as resource.k8s.io/v1), not a
    folder."""
    found = set()
    for name in _PATH.findall(text):
        first = name.split("/", 1)[0]
        if "/" in name.rstrip("/") and "." in first and not _FILE.search(first):
            continue
        if "/" in name.rstrip("/") or _FILE.search(name):
            found.add(name)
    return found


def _exists(name: str) -> bool:
    path = name.rstrip("/")
    if "/" in path:
        return any((root / path).exists() for root in (REPOSITORY,
                                                        REPOSITORY / "src" / "dra_gateway"))
    return any(True for found in REPOSITORY.rglob(path)
               if ".venv" not in found.parts and ".git" not in found.parts)


def test_every_file_and_folder_the_architecture_names_exists() -> None:
    named = _named_paths(ARCHITECTURE.read_text())
    assert len(named) > 40  # the document names the tree; the pattern still reads it
    missing = sorted(name for name in named if not _exists(name))
    assert missing == [], f"ARCHITECTURE.md names what the tree does not have: {missing}"


def test_the_layers_it_states_are_the_import_contracts() -> None:
    contracts = configparser.ConfigParser()
    contracts.read(REPOSITORY / ".importlinter")
    layers = [line.strip() for line in
              contracts["importlinter:contract:layers"]["layers"].strip().splitlines()]
    components = next(layer for layer in layers if "dra_gateway.allocator" in layer)
    independent = [name.strip().removeprefix("dra_gateway.") for name in components.split("|")]
    text = ARCHITECTURE.read_text()
    assert independent == ["allocator", "webhook", "node_plugin"], independent
    for folder in ("allocator/", "webhook/", "node-plugin/", "translator/", "policy/", "certs/",
                   "kube/"):
        assert f"| `{folder}` |" in text, f"ARCHITECTURE.md's layout has no row for {folder}"
