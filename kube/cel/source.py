"""Expression source before the engine parses it: literals, nesting and rewrites.

`mask` blanks string literals and comments so that the checks and rewrites here look at code
only; `nesting_depth` measures brackets for compilation's cap; `rewrite_binds` turns
`cel.bind(name, value, expr)` into a one-element comprehension (`[value].map(name, expr)[0]`),
which binds and evaluates `value` once, as `cel.bind` does; `rewrite_domains` makes
`device.attributes["some.domain"]` (and `capacity`) with a literal domain an empty map when the
device has no such domain, as upstream's map of domains behaves; `bound_names` lists the names
comprehension macros introduce. Text in, text out: this module must not call the engine.
"""

from __future__ import annotations

import re
from typing import Final

from dra_gateway.kube.cel.errors import Failure

_IDENT_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_STRING_PREFIXES: Final = frozenset(
    {"r", "R", "b", "B", "rb", "rB", "Rb", "RB", "br", "bR", "Br", "BR"}
)


def mask(text: str) -> str:
    """`text` with the insides of string literals and comments blanked out, same length.

    Lets the rewrites and checks below look at code only: a "cel.bind(" or a bracket inside a
    string must not count.
    """
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"":
            start = i
            while start > 0 and text[start - 1] in _IDENT_CHARS:
                start -= 1
            prefix = text[start:i]
            raw = prefix in _STRING_PREFIXES and ("r" in prefix or "R" in prefix)
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            k = i + len(quote)
            while k < n and not text.startswith(quote, k):
                if text[k] == "\\" and not raw:
                    k += 1
                elif text[k] == "\n" and len(quote) == 1:
                    break
                k += 1
            for p in range(i + len(quote), min(k, n)):
                out[p] = " "
            i = k + len(quote)
        elif ch == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            for p in range(i, end):
                out[p] = " "
            i = end
        else:
            i += 1
    return "".join(out)


def nesting_depth(code: str) -> int:
    depth = deepest = 0
    for ch in code:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def _call_arguments(code: str, open_paren: int) -> tuple[list[tuple[int, int]], int]:
    """Spans of the top-level arguments of the call opening at `open_paren`, and its close."""
    spans: list[tuple[int, int]] = []
    depth = 0
    start = open_paren + 1
    for i in range(open_paren, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                spans.append((start, i))
                return spans, i
        elif ch == "," and depth == 1:
            spans.append((start, i))
            start = i + 1
    raise Failure("unbalanced parentheses")


_BIND: Final = re.compile(r"(?<![\w.])cel\s*\.\s*bind\s*\(")
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def rewrite_binds(text: str) -> str:
    """cel.bind(x, v, e) -> [v].map(x, e)[0]: binds x to v, evaluated once, within e."""
    code = mask(text)
    match = _BIND.search(code)
    if match is None:
        return text
    spans, close = _call_arguments(code, match.end() - 1)
    if len(spans) != 3:
        raise Failure(f"cel.bind takes 3 arguments (name, value, expression), got {len(spans)}")
    name = text[spans[0][0] : spans[0][1]].strip()
    if not _IDENTIFIER.fullmatch(name):
        raise Failure(f"cel.bind needs a variable name as its first argument, got {name!r}")
    value = rewrite_binds(text[spans[1][0] : spans[1][1]])
    body = rewrite_binds(text[spans[2][0] : spans[2][1]])
    rest = rewrite_binds(text[close + 1 :])
    return f"{text[: match.start()]}[{value}].map({name}, {body})[0]{rest}"


_DOMAIN_INDEX: Final = re.compile(
    r"(?<![\w.])device\s*\.\s*(attributes|capacity)\s*\[\s*(\"[^\"\n]*\"|'[^'\n]*')\s*\]"
)


def rewrite_domains(text: str) -> str:
    """device.attributes["d"] -> an empty map when the device has no domain "d", as upstream."""
    code = mask(text)
    pieces: list[str] = []
    last = 0
    for match in _DOMAIN_INDEX.finditer(code):
        literal = text[match.start(2) : match.end(2)]
        if "\\" in literal:
            continue  # escapes: leave to the engine, the plain lookup is still correct
        field = match.group(1)
        pieces.append(text[last : match.start()])
        pieces.append(f"(({literal} in device.{field}) ? device.{field}[{literal}] : {{}})")
        last = match.end()
    pieces.append(text[last:])
    return "".join(pieces)


_BOUND_NAMES: Final = re.compile(
    r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,(?:\s*([A-Za-z_]\w*)\s*,)?"
)


def bound_names(code: str) -> set[str]:
    """Names introduced by comprehension macros; the engine reports them as variables."""
    found: set[str] = set()
    for match in _BOUND_NAMES.finditer(code):
        found.update(g for g in match.groups() if g)
    return found

