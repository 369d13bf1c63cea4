"""YAML as the project writes it for people and for `kubectl apply`: no anchors and aliases.

PyYAML writes `&id001` / `*id001` where one Python object appears twice in a document (the
webhook configurations share their namespaceSelector between webhooks, say). That is valid
YAML, but not what kubectl users read or diff, and a tool that edits one occurrence edits them
all. These dumpers write every occurrence in full.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(document: Any, **options: Any) -> str:
    """`yaml.safe_dump` of one document, every repeated object written in full."""
    text: str = yaml.dump(document, Dumper=_NoAliases, **options)
    return text


def dump_all(documents: Iterable[Any], **options: Any) -> str:
    """`yaml.safe_dump_all` of several documents, every repeated object written in full."""
    text: str = yaml.dump_all(documents, Dumper=_NoAliases, **options)
    return text


__all__ = ["dump", "dump_all"]
