"""YAML written by people, loaded safely: the one loader of every command's user input.

PyYAML's safe loader builds no Python objects of its own choosing, but an alias still shares a
node: a "billion laughs" of nine nested anchors, a few hundred bytes, reads at once and then
expands to a billion nodes in whatever walks it (the translator, a JSON or YAML writer), which
hangs without a word. `BoundedLoader` counts, while it composes, the nodes each alias brings
in again and refuses a stream whose aliases add more than its own written nodes or
`ALIAS_NODES` (whichever is more), and an alias inside the node it names (a cycle), naming the
line. `ManifestLoader` also reads unquoted dates as the strings Kubernetes sees. Input is read
up to `MAX_INPUT_BYTES`. This module only reads; it knows nothing of what the documents mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, SequenceNode

# Nodes aliases may bring in again, at the least: far beyond any hand-written manifest's.
ALIAS_NODES = 100_000
# The most a command reads from one file or standard input.
MAX_INPUT_BYTES = 64 * 1024 * 1024


class ExpansionError(ComposerError):
    """Aliases expand past the bound, or into themselves."""


class InputTooLarge(ValueError):
    """More than `MAX_INPUT_BYTES`."""


class BoundedLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases that expand past the bound (see the module)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._written = 0  # nodes as written
        self._expanded = 0  # nodes brought in again by aliases
        self._sizes: dict[int, int] = {}  # id(node) -> nodes in it, aliases expanded
        self._open: set[str] = set()  # anchors whose node is being composed

    def compose_document(self) -> Node | None:
        try:
            node: Node | None = super().compose_document()
        except RecursionError:
            raise ExpansionError(None, None, "the document nests too deeply to be read",
                                 None) from None
        self._sizes.clear()
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise ExpansionError(None, None, f"alias *{event.anchor} is inside the node it "
                                     "names: a structure without end", mark)
            node: Node | None = super().compose_node(parent, index)
            if node is not None:
                self._expanded += self._size(node)
            bound = max(ALIAS_NODES, self._written)
            if self._expanded > bound:
                raise ExpansionError(None, None, f"its aliases expand to more than {bound} "
                                     "nodes (an alias bomb?); write the repeated parts out",
                                     mark)
            return node
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            if anchor is not None:
                self._open.discard(anchor)
        self._written += 1
        return node

    def _size(self, node: Node) -> int:
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        size = 1
        if isinstance(node, SequenceNode):
            size += sum(self._size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            size += sum(self._size(key) + self._size(value) for key, value in node.value)
        self._sizes[id(node)] = size
        return size


class ManifestLoader(BoundedLoader):
    """The bounded loader reading unquoted dates as strings: the API server's YAML decoding
    keeps `2024-01-01` a string, and JSON output cannot hold a date."""


ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in BoundedLoader.yaml_implicit_resolvers.items()}


def load_all(text: str, *,
             read: Callable[[int, float], None] | None = None) -> list[Any]:
    """Every document of `text` but the empty ones; `yaml.YAMLError` (`ExpansionError`) else.
    `read(documents, fraction)`, when given, hears after each document how many were read
    and how far into `text` the reader is (0 to 1)."""
    loader = ManifestLoader(text)
    documents: list[Any] = []
    try:
        while loader.check_data():  # type: ignore[no-untyped-call]
            document = loader.get_data()
            if document is not None:
                documents.append(document)
            if read is not None:
                read(len(documents), loader.get_mark().index / max(1, len(text)))
    finally:
        loader.dispose()
    return documents


def check_size(data: bytes | str, what: str) -> None:
    """Refuse input past `MAX_INPUT_BYTES`, naming it."""
    if len(data) > MAX_INPUT_BYTES:
        raise InputTooLarge(f"{what} is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB: "
                            "refused; split it into several files")


__all__ = ["ALIAS_NODES", "MAX_INPUT_BYTES", "BoundedLoader", "ExpansionError",
           "InputTooLarge", "ManifestLoader", "check_size", "load_all"]
