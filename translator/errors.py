"""The translator's errors: rules that fail to load, and a pod's request that is refused.

Loading reports all problems at once (`RulesError`, gathered by `Problems`), each as
`<source>: <path>: <problem>`, and counts what failed (rules, overrides, whole documents) for
the summary line. Translating refuses a pod with one `Refusal` (raised as `Refused`), whose
message names the container, the resources and the rule. This module only formats and counts;
it must not decide what is an error (the models, the compiler and the translation do).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from dra_gateway.translator.documents import IDENT_RE


class RulesError(ValueError):
    """Rules that failed to load. `errors` holds one `<source>: <path>: <problem>` per problem;
    `summary` says what failed, e.g. "2 rules and 1 document failed to load" (a document that
    cannot be read or parsed, or whose own fields are wrong, counts as a document)."""

    def __init__(self, errors: Sequence[str], failed: Mapping[str, int]) -> None:
        self.errors = list(errors)
        self.failed = dict(failed)
        parts = [f"{n} {kind}{'' if n == 1 else 's'}"
                 for kind in ("rule", "override", "document") if (n := failed.get(kind, 0))]
        listed = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
        self.summary = f"{listed or 'nothing'} failed to load"
        super().__init__(f"{self.summary}: " + "; ".join(self.errors))


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request that cannot be honoured. `message` names the container, resource and rule."""

    message: str
    container: str
    resource: str
    rule: str


class Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def refuse(message: str, *, container: str, resource: str, rule: str,
           name_rule: bool = True) -> Refused:
    where = f" (rule {rule})" if rule and name_rule else ""
    return Refused(Refusal(message=f"container {quote(container)}: {message}{where}",
                           container=container, resource=resource, rule=rule))


def quote(text: str) -> str:
    return orjson.dumps(text).decode()


@dataclass
class Problems:
    errors: list[str] = field(default_factory=list)
    failed: set[tuple[str, str]] = field(default_factory=set)

    def add(self, source: str, path: str, message: str) -> None:
        # One line each, whatever text of the document a message quotes: the errors are
        # joined into Events, conditions, /readyz and the rules webhook's Status message.
        message = message.replace("\r", "\\r").replace("\n", "\\n")
        self.errors.append(f"{source}: {path}: {message}" if path else f"{source}: {message}")
        # Count failures per rule (or per other top-level entry) as the summary line says.
        entry = re.match(r"^(rules|overrides)\[\d+\]", path)
        self.failed.add((source, entry.group(0) if entry else ""))

    def counts(self) -> dict[str, int]:
        """How many rules, overrides and whole documents failed."""
        out: dict[str, int] = {}
        for _, entry in self.failed:
            kind = ("rule" if entry.startswith("rules[") else
                    "override" if entry.startswith("overrides[") else "document")
            out[kind] = out.get(kind, 0) + 1
        return out


def format_path(loc: Iterable[int | str]) -> str:
    """A pydantic location as a field path: `rules[3].resources["aliyun.com/gpu-mem"].unit`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif IDENT_RE.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def pydantic_message(error: Mapping[str, Any], fields: Sequence[str] = ()) -> str:
    """A pydantic error in the rules' words; `fields`: the valid field names where the error
    is, for the did-you-mean of an unknown field."""
    kind = error.get("type", "")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        loc = error.get("loc") or ()
        given = loc[-1] if loc else None
        close = difflib.get_close_matches(given, fields, n=1, cutoff=0.6) \
            if isinstance(given, str) else []
        return f"unknown field; did you mean {close[0]}?" if close else "unknown field"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"must be {expected}, not {json.dumps(error.get('input'), default=str)}"
    message = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    return message

