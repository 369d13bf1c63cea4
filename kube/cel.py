"""Kubernetes CEL: compile once, evaluate many times, with Kubernetes' names and meanings.

One place for the two kinds of CEL the project runs:

- DRA device selectors (`compile_selector`, `device_view`, `Selector.matches`): the `device`
  variable has the shape the scheduler gives it (`driver`, `attributes` and `capacity` grouped
  by domain, `allowMultipleAllocations`), an evaluation error such as a missing attribute aborts
  the match with a `CelError` (it is not "no match"), and the result must be a bool;
- rule and admission-style expressions (`compile_expression`, `Expression.evaluate`) over
  variables the caller declares (`pod`, `container`, ...), returning plain Python values.

Engine: the `common-expression-language` package (Rust core). It only parses at compile time, so
compilation here adds what Kubernetes' type-checker would catch early: a length cap
(`MAX_EXPRESSION_LENGTH`, as DRA's 10 KiB), a nesting cap (`MAX_NESTING_DEPTH`), a static check
of every function and variable the expression names, and a dry run against representative
inputs (sample devices, or the sample variables given), which refuses a non-bool selector. A
missing attribute on a sample is not a compile error: it is an evaluation error at match time,
as upstream.

Supported subset, with Kubernetes' names and semantics:

- CEL core as the engine has it: operators, `has()`, `in`, `all/exists/exists_one/map/filter`,
  `size`, `contains`, `startsWith`, `endsWith`, `matches`, `int/uint/double/bytes/dyn/type`,
  `timestamp/duration`, `string(x)` (a double is written the engine's way: `string(1e6)` is
  "1000000" where cel-go writes "1e+06");
- `cel.bind(name, value, expr)`, rewritten before compiling into a one-element comprehension
  (`[value].map(name, expr)[0]`), which binds and evaluates `value` once, as `cel.bind` does;
- quantity library: `quantity(s)`, `isQuantity(s)`, `q.sign()`, `q.isInteger()`,
  `q.asInteger()`, `q.asApproximateFloat()`, `q.add(q|int)`, `q.sub(q|int)`, `q.compareTo(q)`,
  `q.isGreaterThan(q)`, `q.isLessThan(q)`; comparisons are exact across suffixes
  ("40Gi" vs "42949672960"). `isInteger`/`asInteger` follow the documented meaning (an exact
  int64) and `asApproximateFloat` is the nearest double; upstream's answers depend on the
  internal form a quantity was parsed into, so it also answers false for some integral values
  (`quantity("1000m")`, `quantity("1.0")`, `quantity("1.5Gi")`) and computes some floats a bit
  off (`quantity("0.3")` is 0.30000000000000004 there). `sign` is accepted in both spellings;
  upstream declares only the global `sign(q)`, so `q.sign()` does not compile there;
- semver library: `semver(s)`, `semver(s, true)`, `isSemver(s[, bool])`, `.major()`,
  `.minor()`, `.patch()`, `.compareTo()`, `.isGreaterThan()`, `.isLessThan()`;
- string extensions: `lowerAscii`, `upperAscii`, `split(sep[, n])`, `join([sep])`, `trim`,
  `replace(old, new[, n])`, `indexOf(sub[, offset])` (also on lists), `lastIndexOf`,
  `substring(start[, end])`, `charAt(i)`.

No type checker: what upstream's checker refuses at compile because the static types do not
fit (`quantity(1)`, `q < quantity("1")`, `device.unknownField`) is refused here when the selector
is matched, and an `==` between mismatched static types (`device.driver == 1`) is false here.
tests/kube/test_oracle.py compares all of this against the upstream Go code.

Not supported (refused at compile as unknown functions): the URL, IP/CIDR, regex-extract,
format, sets and two-variable comprehension libraries, optional syntax (`.?`), and the
quantity `mul`/`div` additions of recent releases.

Representation: the engine cannot carry Python objects, so a quantity is a one-key map
`{"\\x00k8s.quantity": "<value in billionths>"}` and a semantic version a one-key map
`{"\\x00k8s.semver": "<version without build metadata>"}`. Maps have no ordering in CEL, so
`<` between quantities is an error (as in Kubernetes, where it does not type-check), and `==`
compares by value. `device.attributes["some.domain"]` with a literal domain is rewritten to an
empty map when the device has no such domain, as upstream's map of domains behaves.

A DeviceView keeps its engine context and the verdict of every selector evaluated on it, so
matching the same selector on the same device again costs a dictionary lookup; a view must not
be used from two threads at once. This module must not reach the cluster or do I/O.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

import cel as _engine

from dra_gateway.kube import names
from dra_gateway.kube.quantity import Quantity, QuantityError
from dra_gateway.kube.semver import Semver, SemverError

MAX_EXPRESSION_LENGTH: Final = 10240
MAX_NESTING_DEPTH: Final = 32

QUANTITY_KEY: Final = "\x00k8s.quantity"
SEMVER_KEY: Final = "\x00k8s.semver"
_NANO: Final = 10**9
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_SHOWN_EXPRESSION: Final = 200


class CelError(ValueError):
    """A CEL expression that does not compile or fails to evaluate.

    The message names the expression (and, when given, where it comes from) and the reason;
    `expression` holds the full text, `reason` the reason alone.
    """

    def __init__(self, expression: str, reason: str, *, what: str = "") -> None:
        shown = expression
        if len(shown) > _SHOWN_EXPRESSION:
            shown = shown[:_SHOWN_EXPRESSION] + "..."
        prefix = f"{what}: " if what else ""
        # Quoted without escaping: selectors are full of quotes and the message is for people.
        super().__init__(f'{prefix}CEL expression "{shown}": {reason}')
        self.expression = expression
        self.reason = reason
        self.what = what


class _Fail(Exception):
    """Raised by library functions; the engine wraps it and `_reason` unwraps the message."""


# The engine logs a warning for every exception a Python function raises before re-raising it
# as RuntimeError. Those failures reach callers as CelError with the same message, so the
# warning only duplicates them (on a hot path); drop exactly those records.
class _DropCallbackFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Python function '")


logging.getLogger("cel").addFilter(_DropCallbackFailures())


# --- values crossing into the engine ------------------------------------------------------------


def quantity_value(q: Quantity) -> dict[str, str]:
    """The CEL value standing for a quantity."""
    return {QUANTITY_KEY: str(q.nanos)}


def semver_value(v: Semver) -> dict[str, str]:
    """The CEL value standing for a semantic version (build metadata does not compare)."""
    return {SEMVER_KEY: str(Semver(v.major, v.minor, v.patch, v.prerelease))}


def _to_engine(value: Any) -> Any:
    """Python value to what the engine can carry: quantities and versions become marker maps."""
    if isinstance(value, Quantity):
        return quantity_value(value)
    if isinstance(value, Semver):
        return semver_value(value)
    if isinstance(value, Mapping):
        return {k: _to_engine(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_engine(v) for v in value]
    if _is_int(value) and not _INT64_MIN <= value <= _INT64_MAX:
        # The engine would silently turn it into an inexact double.
        raise _Fail(f"integer {value} does not fit in a CEL int (64 bits)")
    return value


def _from_engine(value: Any) -> Any:
    """Engine result to Python: marker maps become `Quantity` (decimal format) and `Semver`."""
    if isinstance(value, dict):
        if len(value) == 1:
            if QUANTITY_KEY in value:
                return Quantity(int(value[QUANTITY_KEY]))
            if SEMVER_KEY in value:
                return _semver_of(value[SEMVER_KEY])
        return {k: _from_engine(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_engine(v) for v in value]
    return value


@lru_cache(maxsize=4096)
def _parse_quantity(text: str) -> dict[str, str]:
    # The result is shared by every caller (and every view): never mutated.
    return quantity_value(Quantity.parse(text))


@lru_cache(maxsize=4096)
def _semver_of(text: str) -> Semver:
    return Semver.parse(text)


@lru_cache(maxsize=4096)
def _version_value(text: str) -> dict[str, str]:
    # Shared between views (every card of a node reports the same driver version): never mutated.
    return semver_value(Semver.parse(text))


# --- the function library -----------------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, dict) and len(value) == 1:
        if QUANTITY_KEY in value:
            return "quantity"
        if SEMVER_KEY in value:
            return "semver"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "map"
    if value is None:
        return "null"
    return type(value).__name__


def _no_overload(function: str, args: tuple[Any, ...]) -> _Fail:
    kinds = ", ".join(_kind(a) for a in args)
    return _Fail(f"found no matching overload for '{function}' applied to ({kinds})")


def _nanos(function: str, args: tuple[Any, ...], value: Any) -> int:
    if isinstance(value, dict) and len(value) == 1 and QUANTITY_KEY in value:
        return int(value[QUANTITY_KEY])
    raise _no_overload(function, args)


def _version(function: str, args: tuple[Any, ...], value: Any) -> Semver:
    if isinstance(value, dict) and len(value) == 1 and SEMVER_KEY in value:
        return _semver_of(value[SEMVER_KEY])
    raise _no_overload(function, args)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _compare(function: str, args: tuple[Any, ...]) -> int:
    if len(args) != 2:
        raise _no_overload(function, args)
    a, b = args
    kind = _kind(a)
    if kind == "quantity" and _kind(b) == "quantity":
        x, y = int(a[QUANTITY_KEY]), int(b[QUANTITY_KEY])
        return (x > y) - (x < y)
    if kind == "semver" and _kind(b) == "semver":
        return _semver_of(a[SEMVER_KEY]).compare(_semver_of(b[SEMVER_KEY]))
    raise _no_overload(function, args)


def _fn_compare_to(*args: Any) -> int:
    return _compare("compareTo", args)


def _fn_is_greater_than(*args: Any) -> bool:
    return _compare("isGreaterThan", args) == 1


def _fn_is_less_than(*args: Any) -> bool:
    return _compare("isLessThan", args) == -1


def _fn_quantity(*args: Any) -> dict[str, str]:
    if len(args) != 1 or not isinstance(args[0], str):
        raise _no_overload("quantity", args)
    try:
        return _parse_quantity(args[0])
    except QuantityError as exc:
        raise _Fail(str(exc)) from None


def _fn_is_quantity(*args: Any) -> bool:
    if len(args) != 1 or not isinstance(args[0], str):
        raise _no_overload("isQuantity", args)
    try:
        _parse_quantity(args[0])
    except QuantityError:
        return False
    return True


def _fn_sign(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("sign", args)
    n = _nanos("sign", args, args[0])
    return (n > 0) - (n < 0)


def _int64_of(nanos: int) -> int | None:
    if nanos % _NANO:
        return None
    value = nanos // _NANO
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _fn_is_integer(*args: Any) -> bool:
    if len(args) != 1:
        raise _no_overload("isInteger", args)
    return _int64_of(_nanos("isInteger", args, args[0])) is not None


def _fn_as_integer(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("asInteger", args)
    value = _int64_of(_nanos("asInteger", args, args[0]))
    if value is None:
        raise _Fail("cannot convert value to integer")
    return value


def _fn_as_approximate_float(*args: Any) -> float:
    if len(args) != 1:
        raise _no_overload("asApproximateFloat", args)
    return Quantity(_nanos("asApproximateFloat", args, args[0])).as_approximate_float()


def _arithmetic(function: str, args: tuple[Any, ...], sign: int) -> dict[str, str]:
    if len(args) != 2:
        raise _no_overload(function, args)
    left = _nanos(function, args, args[0])
    other = args[1]
    right = other * _NANO if _is_int(other) else _nanos(function, args, other)
    return {QUANTITY_KEY: str(left + sign * right)}


def _fn_add(*args: Any) -> dict[str, str]:
    return _arithmetic("add", args, 1)


def _fn_sub(*args: Any) -> dict[str, str]:
    return _arithmetic("sub", args, -1)


def _semver_args(function: str, args: tuple[Any, ...]) -> tuple[str, bool]:
    if len(args) == 1 and isinstance(args[0], str):
        return args[0], False
    if len(args) == 2 and isinstance(args[0], str) and isinstance(args[1], bool):
        return args[0], args[1]
    raise _no_overload(function, args)


def _fn_semver(*args: Any) -> dict[str, str]:
    text, normalize = _semver_args("semver", args)
    try:
        return semver_value(Semver.parse(text, normalize=normalize))
    except SemverError as exc:
        raise _Fail(str(exc)) from None


def _fn_is_semver(*args: Any) -> bool:
    text, normalize = _semver_args("isSemver", args)
    try:
        Semver.parse(text, normalize=normalize)
    except SemverError:
        return False
    return True


def _checked_int64(value: int) -> int:
    if value > _INT64_MAX:
        raise _Fail(f"version number {value} does not fit in an int")
    return value


def _fn_major(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("major", args)
    return _checked_int64(_version("major", args, args[0]).major)


def _fn_minor(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("minor", args)
    return _checked_int64(_version("minor", args, args[0]).minor)


def _fn_patch(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("patch", args)
    return _checked_int64(_version("patch", args, args[0]).patch)


_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_UPPER: Final = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _strings(function: str, args: tuple[Any, ...], count: int) -> None:
    if len(args) < count or not all(isinstance(a, str) for a in args[:count]):
        raise _no_overload(function, args)


def _fn_lower_ascii(*args: Any) -> str:
    _strings("lowerAscii", args, 1)
    if len(args) != 1:
        raise _no_overload("lowerAscii", args)
    text = str(args[0])
    # str.lower() also folds non-ASCII letters, which lowerAscii must leave alone.
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


def _fn_upper_ascii(*args: Any) -> str:
    _strings("upperAscii", args, 1)
    if len(args) != 1:
        raise _no_overload("upperAscii", args)
    text = str(args[0])
    return text.upper() if text.isascii() else text.translate(_ASCII_UPPER)


def _fn_trim(*args: Any) -> str:
    _strings("trim", args, 1)
    if len(args) != 1:
        raise _no_overload("trim", args)
    return str(args[0]).strip()


def _fn_split(*args: Any) -> list[str]:
    _strings("split", args, 2)
    text, sep = str(args[0]), str(args[1])
    if len(args) == 2:
        limit = -1
    elif len(args) == 3 and _is_int(args[2]):
        limit = int(args[2])
    else:
        raise _no_overload("split", args)
    # Go's strings.SplitN: 0 parts for n == 0, all for n < 0, an empty separator splits runes.
    if limit == 0:
        return []
    if sep == "":
        chars = list(text)
        if 0 < limit < len(chars):
            return [*chars[: limit - 1], "".join(chars[limit - 1 :])]
        return chars
    return text.split(sep, limit - 1 if limit > 0 else -1)


def _fn_join(*args: Any) -> str:
    if not args or not isinstance(args[0], list):
        raise _no_overload("join", args)
    if len(args) == 1:
        sep = ""
    elif len(args) == 2 and isinstance(args[1], str):
        sep = args[1]
    else:
        raise _no_overload("join", args)
    if not all(isinstance(item, str) for item in args[0]):
        raise _Fail("join: every element of the list must be a string")
    return sep.join(args[0])


def _fn_replace(*args: Any) -> str:
    _strings("replace", args, 3)
    text, old, new = str(args[0]), str(args[1]), str(args[2])
    if len(args) == 3:
        return text.replace(old, new)
    if len(args) == 4 and _is_int(args[3]):
        return text.replace(old, new, int(args[3]))
    raise _no_overload("replace", args)


def _offset(function: str, args: tuple[Any, ...]) -> int | None:
    if len(args) == 2:
        return None
    if len(args) == 3 and _is_int(args[2]):
        return int(args[2])
    raise _no_overload(function, args)


def _index_from(text: str, sub: str, offset: int) -> int:
    """cel-go's `indexOf(sub, offset)`: an offset past the end finds nothing, it is no error."""
    if sub == "":
        return offset
    if offset < 0:
        raise _Fail(f"indexOf: index out of range: {offset}")
    if offset >= len(text):
        return -1
    return text.find(sub, offset)


def _last_index_from(text: str, sub: str, offset: int) -> int:
    """cel-go's `lastIndexOf(sub, offset)`: the last match starting at or before `offset`."""
    if sub == "":
        return offset
    if offset < 0:
        raise _Fail(f"lastIndexOf: index out of range: {offset}")
    if offset >= len(text):
        return -1
    start = min(offset, len(text) - len(sub))
    return text.rfind(sub, 0, start + len(sub)) if start >= 0 else -1


def _fn_index_of(*args: Any) -> int:
    if len(args) == 2 and isinstance(args[0], list):
        # Kubernetes' lists library: the first position of an element, or -1.
        for i, item in enumerate(args[0]):
            if item == args[1] and type(item) is type(args[1]):
                return i
        return -1
    _strings("indexOf", args, 2)
    text, sub = str(args[0]), str(args[1])
    offset = _offset("indexOf", args)
    return _index_from(text, sub, 0 if offset is None else offset)


def _fn_last_index_of(*args: Any) -> int:
    if len(args) == 2 and isinstance(args[0], list):
        for i in range(len(args[0]) - 1, -1, -1):
            item = args[0][i]
            if item == args[1] and type(item) is type(args[1]):
                return i
        return -1
    _strings("lastIndexOf", args, 2)
    text, sub = str(args[0]), str(args[1])
    offset = _offset("lastIndexOf", args)
    if offset is not None:
        return _last_index_from(text, sub, offset)
    if sub == "":
        return len(text)
    # cel-go compares the lengths in bytes here.
    if len(text.encode()) < len(sub.encode()):
        return -1
    return _last_index_from(text, sub, len(text) - 1)


def _fn_substring(*args: Any) -> str:
    if not args or not isinstance(args[0], str) or not all(_is_int(a) for a in args[1:]):
        raise _no_overload("substring", args)
    text = args[0]
    if len(args) == 2:
        start, end = int(args[1]), len(text)
    elif len(args) == 3:
        start, end = int(args[1]), int(args[2])
    else:
        raise _no_overload("substring", args)
    if start < 0 or start > len(text) or end < 0 or end > len(text):
        raise _Fail(f"substring: index out of range: {start}..{end} of {len(text)}")
    if start > end:
        raise _Fail(f"substring: invalid range: start {start} is after end {end}")
    return text[start:end]


def _fn_char_at(*args: Any) -> str:
    if len(args) != 2 or not isinstance(args[0], str) or not _is_int(args[1]):
        raise _no_overload("charAt", args)
    text, index = args[0], int(args[1])
    if index < 0 or index > len(text):
        raise _Fail(f"charAt: index out of range: {index}")
    return text[index : index + 1]


def _fn_string(*args: Any) -> str:
    # The engine converts ints, doubles, strings and bytes natively and calls this only for
    # what it lacks: bools.
    if len(args) == 1 and isinstance(args[0], bool):
        return "true" if args[0] else "false"
    raise _no_overload("string", args)


# Shared by every engine context; never mutated.
_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "quantity": _fn_quantity,
    "isQuantity": _fn_is_quantity,
    "sign": _fn_sign,
    "isInteger": _fn_is_integer,
    "asInteger": _fn_as_integer,
    "asApproximateFloat": _fn_as_approximate_float,
    "add": _fn_add,
    "sub": _fn_sub,
    "compareTo": _fn_compare_to,
    "isGreaterThan": _fn_is_greater_than,
    "isLessThan": _fn_is_less_than,
    "semver": _fn_semver,
    "isSemver": _fn_is_semver,
    "major": _fn_major,
    "minor": _fn_minor,
    "patch": _fn_patch,
    "lowerAscii": _fn_lower_ascii,
    "upperAscii": _fn_upper_ascii,
    "trim": _fn_trim,
    "split": _fn_split,
    "join": _fn_join,
    "replace": _fn_replace,
    "indexOf": _fn_index_of,
    "lastIndexOf": _fn_last_index_of,
    "substring": _fn_substring,
    "charAt": _fn_char_at,
    "string": _fn_string,
}

# What the engine itself provides; operators (`_+_`, `@in`, `!_`, ...) are recognised by shape.
_NATIVE_FUNCTIONS: Final = frozenset(
    {
        "size",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "int",
        "uint",
        "double",
        "bytes",
        "dyn",
        "type",
        "timestamp",
        "duration",
        "getFullYear",
        "getMonth",
        "getDayOfYear",
        "getDayOfMonth",
        "getDate",
        "getDayOfWeek",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    }
)
_KNOWN_FUNCTIONS: Final = _NATIVE_FUNCTIONS | frozenset(_FUNCTIONS)


# --- source handling: literals, nesting, rewrites -----------------------------------------------

_IDENT_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_STRING_PREFIXES: Final = frozenset(
    {"r", "R", "b", "B", "rb", "rB", "Rb", "RB", "br", "bR", "Br", "BR"}
)


def _mask(text: str) -> str:
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


def _nesting_depth(code: str) -> int:
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
    raise _Fail("unbalanced parentheses")


_BIND: Final = re.compile(r"(?<![\w.])cel\s*\.\s*bind\s*\(")
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _rewrite_binds(text: str) -> str:
    """cel.bind(x, v, e) -> [v].map(x, e)[0]: binds x to v, evaluated once, within e."""
    code = _mask(text)
    match = _BIND.search(code)
    if match is None:
        return text
    spans, close = _call_arguments(code, match.end() - 1)
    if len(spans) != 3:
        raise _Fail(f"cel.bind takes 3 arguments (name, value, expression), got {len(spans)}")
    name = text[spans[0][0] : spans[0][1]].strip()
    if not _IDENTIFIER.fullmatch(name):
        raise _Fail(f"cel.bind needs a variable name as its first argument, got {name!r}")
    value = _rewrite_binds(text[spans[1][0] : spans[1][1]])
    body = _rewrite_binds(text[spans[2][0] : spans[2][1]])
    rest = _rewrite_binds(text[close + 1 :])
    return f"{text[: match.start()]}[{value}].map({name}, {body})[0]{rest}"


_DOMAIN_INDEX: Final = re.compile(
    r"(?<![\w.])device\s*\.\s*(attributes|capacity)\s*\[\s*(\"[^\"\n]*\"|'[^'\n]*')\s*\]"
)


def _rewrite_domains(text: str) -> str:
    """device.attributes["d"] -> an empty map when the device has no domain "d", as upstream."""
    code = _mask(text)
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


def _bound_names(code: str) -> set[str]:
    """Names introduced by comprehension macros; the engine reports them as variables."""
    found: set[str] = set()
    for match in _BOUND_NAMES.finditer(code):
        found.update(g for g in match.groups() if g)
    return found


# --- errors from the engine ---------------------------------------------------------------------

_CALLBACK_FAILURE: Final = re.compile(
    r"Function '[^']*' error: Python function call failed: (?:[\w.]+: )?(.*?)\.? Check function "
    r"arguments and their types\.$",
    re.S,
)
_UNDEFINED: Final = re.compile(r"Undefined variable or function: '([^']*)'")


def _reason(exc: BaseException) -> str:
    """A short, stable reason for an engine error (cel-go's wording where there is one)."""
    if isinstance(exc, KeyError):
        return f"no such key: {exc.args[0] if exc.args else ''}"
    message = str(exc)
    if isinstance(exc, RuntimeError):
        failure = _CALLBACK_FAILURE.match(message)
        if failure:
            return failure.group(1)
        undefined = _UNDEFINED.search(message)
        if undefined:
            return f"undeclared reference to '{undefined.group(1)}'"
    if isinstance(exc, ZeroDivisionError):
        return "division by zero"
    if isinstance(exc, TypeError):
        first = message.split(". ", 1)[0].rstrip(".")
        return first or "no such overload"
    return message.split(". Check ", 1)[0] or type(exc).__name__


def _syntax_reason(exc: BaseException) -> str:
    message = str(exc)
    at = message.find("ERROR: ")
    return "syntax error: " + (message[at + len("ERROR: ") :] if at >= 0 else message)


# --- compilation --------------------------------------------------------------------------------


def _prepare(
    expression: str, declared: Iterable[str], *, what: str, device_domains: bool
) -> _engine.Program:
    """Length and nesting caps, rewrites, parse, and the static check of names."""
    if not isinstance(expression, str):
        raise CelError(str(expression), "an expression must be a string", what=what)
    if not expression.strip():
        raise CelError(expression, "empty expression", what=what)
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelError(
            expression,
            f"too long: {len(expression)} characters, at most {MAX_EXPRESSION_LENGTH}",
            what=what,
        )
    depth = _nesting_depth(_mask(expression))
    if depth > MAX_NESTING_DEPTH:
        raise CelError(
            expression, f"nested too deeply: {depth} levels, at most {MAX_NESTING_DEPTH}", what=what
        )
    try:
        source = _rewrite_binds(expression)
        if device_domains:
            source = _rewrite_domains(source)
    except _Fail as exc:
        raise CelError(expression, str(exc), what=what) from None
    try:
        program = _engine.compile(source)
    except Exception as exc:  # the engine raises ValueError, or RuntimeError on odd input
        raise CelError(expression, _syntax_reason(exc), what=what) from None
    unknown_functions = sorted(
        f for f in program.functions() if f[:1] not in "_@!-" and f not in _KNOWN_FUNCTIONS
    )
    if unknown_functions:
        listed = ", ".join(f"'{f}'" for f in unknown_functions)
        raise CelError(expression, f"undeclared function {listed}", what=what)
    allowed = set(declared) | _bound_names(_mask(source))
    unknown_variables = sorted(v for v in program.variables() if v not in allowed)
    if unknown_variables:
        listed = ", ".join(f"'{v}'" for v in unknown_variables)
        raise CelError(expression, f"undeclared reference to {listed}", what=what)
    return program


def _type_name(value: Any) -> str:
    return _kind(value)


_MISSING_DATA: Final = (KeyError, IndexError)


class DeviceView:
    """The CEL `device` variable of one ResourceSlice device, with its engine context.

    Build one per device with `device_view` when its slice changes and keep it: the engine
    context and the selector verdicts it caches are only valid for that device content.
    `value` is the `device` map itself; treat it as read-only (parts are shared between views).
    """

    __slots__ = ("_context", "_verdicts", "driver", "name", "value")

    def __init__(self, driver: str, value: dict[str, Any], name: str = "") -> None:
        self.driver = driver
        self.name = name
        self.value = value
        self._context: _engine.Context | None = None
        self._verdicts: dict[str, bool | str] = {}

    def context(self) -> _engine.Context:
        if self._context is None:
            self._context = _engine.Context(variables={"device": self.value}, functions=_FUNCTIONS)
        return self._context

    def __repr__(self) -> str:
        return f"DeviceView(driver={self.driver!r}, name={self.name!r})"


def _qualified(driver: str, name: str) -> tuple[str, str]:
    domain, slash, ident = name.partition("/")
    return (domain, ident) if slash else (driver, name)


def _attribute_value(driver: str, name: str, attribute: Any) -> Any:
    where = f"device attribute {name!r} of driver {driver!r}"
    if not isinstance(attribute, Mapping) or len(attribute) != 1:
        raise ValueError(f"{where}: expected exactly one of int, bool, string, version")
    ((kind, value),) = attribute.items()
    if kind == "int" and _is_int(value):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "version" and isinstance(value, str):
        try:
            return _version_value(value)
        except SemverError as exc:
            raise ValueError(f"{where}: {exc}") from None
    raise ValueError(
        f"{where}: {kind!r} value {value!r} is not a valid int, bool, string or version"
    )


def device_view(driver: str, device: Mapping[str, Any]) -> DeviceView:
    """The CEL `device` of a ResourceSlice device dict, names grouped by domain.

    Bare attribute and capacity names belong to the driver's domain; a qualified name such as
    `resource.kubernetes.io/pcieRoot` goes to `device.attributes["resource.kubernetes.io"]`.
    Raises ValueError, naming the attribute, for a value the API server would have refused.
    """
    attributes: dict[str, dict[str, Any]] = {}
    for name, attribute in (device.get("attributes") or {}).items():
        domain, ident = _qualified(driver, name)
        attributes.setdefault(domain, {})[ident] = _attribute_value(driver, name, attribute)
    capacity: dict[str, dict[str, Any]] = {}
    for name, entry in (device.get("capacity") or {}).items():
        domain, ident = _qualified(driver, name)
        raw = entry.get("value") if isinstance(entry, Mapping) else None
        if raw is None:
            raise ValueError(f"device capacity {name!r} of driver {driver!r}: no value")
        try:
            amount = (
                _parse_quantity(raw)
                if isinstance(raw, str)
                else quantity_value(Quantity.from_int(raw))
            )
        except (QuantityError, TypeError) as exc:
            raise ValueError(f"device capacity {name!r} of driver {driver!r}: {exc}") from None
        capacity.setdefault(domain, {})[ident] = amount
    value = {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.get("allowMultipleAllocations", False)),
    }
    return DeviceView(driver, value, str(device.get("name", "")))


class Selector:
    """A compiled DRA device selector; `matches` is the allocator's hot path."""

    __slots__ = ("_program", "expression")

    def __init__(self, expression: str, program: _engine.Program) -> None:
        self.expression = expression
        self._program = program

    def matches(self, device: DeviceView) -> bool:
        """Whether the device is selected; raises CelError if evaluation fails or is not bool.

        The verdict (or the error) is cached on the view, keyed by the expression text.
        """
        verdict = device._verdicts.get(self.expression)
        if verdict is None:
            verdict = self._evaluate(device)
            device._verdicts[self.expression] = verdict
        if verdict is True or verdict is False:
            return verdict
        raise CelError(self.expression, str(verdict))

    def _evaluate(self, device: DeviceView) -> bool | str:
        try:
            result = self._program.execute(device.context())
        except Exception as exc:  # every engine failure becomes the claim's error message
            return _reason(exc)
        if result is True or result is False:
            return result
        return f"must evaluate to bool, got {_type_name(result)}"

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


def _sample_device(driver: str, kind: str) -> dict[str, Any]:
    memory = "10Gi" if kind == "mig" else "80Gi"
    attributes: dict[str, Any] = {
        names.ATTR_TYPE: {"string": kind},
        names.ATTR_UUID: {"string": "GPU-00000000-0000-0000-0000-000000000000"},
        names.ATTR_PRODUCT_NAME: {"string": "NVIDIA H100 80GB HBM3"},
        names.ATTR_BRAND: {"string": "Nvidia"},
        names.ATTR_ARCHITECTURE: {"string": "Hopper"},
        names.ATTR_CUDA_COMPUTE_CAPABILITY: {"version": "9.0.0"},
        names.ATTR_DRIVER_VERSION: {"version": "550.54.15"},
        names.ATTR_CUDA_DRIVER_VERSION: {"version": "12.4.0"},
        names.ATTR_PCIE_BUS_ID: {"string": "0000:3b:00.0"},
        names.ATTR_PCIE_ROOT: {"string": "pci0000:3a"},
        names.ATTR_NUMA_NODE: {"int": 0},
        names.ATTR_INDEX: {"int": 0},
    }
    if kind == "mig":
        attributes[names.ATTR_PROFILE] = {"string": "1g.10gb"}
        attributes[names.ATTR_PARENT_UUID] = {"string": "GPU-00000000-0000-0000-0000-000000000000"}
    capacity = {
        names.CAPACITY_MEMORY: {"value": memory},
        names.CAPACITY_CORES: {"value": str(names.CORES_PER_CARD)},
    }
    return {
        "name": f"sample-{kind}",
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": kind == "gpu",
    }


_SAMPLES_LOCK: Final = threading.Lock()


@lru_cache(maxsize=1)
def _sample_views() -> tuple[DeviceView, ...]:
    return tuple(
        device_view(driver, _sample_device(driver, kind))
        for driver, kind in (
            (names.DRIVER, "gpu"),
            (names.NVIDIA_GPU_CLASS, "gpu"),
            (names.NVIDIA_MIG_CLASS, "mig"),
        )
    )


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile a DRA device selector; raises CelError for what can be known before matching.

    Refused: syntax errors, an expression over MAX_EXPRESSION_LENGTH or nested over
    MAX_NESTING_DEPTH, unknown functions or variables, and a result that is not a bool on a
    sample device. Errors that depend on the device (a missing attribute) surface in `matches`.
    """
    program = _prepare(expression, ("device",), what="", device_domains=True)
    selector = Selector(expression, program)
    for view in _sample_views():
        try:
            # The sample contexts are shared by every compilation; engine contexts are not
            # thread-safe.
            with _SAMPLES_LOCK:
                result = program.execute(view.context())
        except _MISSING_DATA:
            continue
        except RuntimeError as exc:
            reason = _reason(exc)
            if reason.startswith("undeclared reference"):
                raise CelError(expression, reason) from None
            continue
        except Exception:  # type and overload errors may depend on the device's values
            continue
        if not isinstance(result, bool):
            raise CelError(expression, f"must evaluate to bool, got {_type_name(result)}")
    return selector


class Expression:
    """A compiled rule or admission-style expression over declared variables.

    Safe to share between threads: evaluations of one expression take turns on its engine
    context.
    """

    __slots__ = ("_context", "_current", "_lock", "_program", "expression", "variables", "what")

    def __init__(
        self, expression: str, program: _engine.Program, variables: frozenset[str], what: str
    ) -> None:
        self.expression = expression
        self._program = program
        self.variables = variables
        self.what = what
        self._context: _engine.Context | None = None
        self._current: Mapping[str, Any] = {}
        self._lock = threading.Lock()

    def _resolve(self, name: str) -> Any:
        return self._current.get(name)

    def _engine_context(self) -> _engine.Context:
        # One context per expression, its functions wrapped once; the activation of the
        # evaluation in progress is handed over through the resolver. Building a context per
        # evaluation costs about a third more. Declared variables are also added as null so
        # that a variable whose value is null resolves (the resolver's None means "not mine").
        if self._context is None:
            context = _engine.Context(variables=dict.fromkeys(self.variables), functions=_FUNCTIONS)
            context.set_variable_resolver(self._resolve)
            self._context = context
        return self._context

    def evaluate(self, activation: Mapping[str, Any]) -> Any:
        """The result as plain Python values; quantities come back as `Quantity`, versions as
        `Semver`. Raises CelError naming the expression on any evaluation error."""
        missing = self.variables - activation.keys()
        if missing:
            listed = ", ".join(sorted(missing))
            raise CelError(self.expression, f"no value for variable(s) {listed}", what=self.what)
        try:
            converted = {name: _to_engine(activation[name]) for name in self.variables}
            with self._lock:
                context = self._engine_context()
                self._current = converted
                try:
                    result = self._program.execute(context)
                finally:
                    self._current = {}
        except Exception as exc:  # every engine failure becomes a CelError with its reason
            raise CelError(self.expression, _reason(exc), what=self.what) from None
        return _from_engine(result)

    def __repr__(self) -> str:
        return f"Expression({self.expression!r})"


def compile_expression(
    expression: str,
    *,
    variables: Mapping[str, Any],
    what: str,
    expect: type | tuple[type, ...] | None = None,
) -> Expression:
    """Compile an expression over `variables` (name -> representative sample value).

    `what` names where the expression comes from (e.g. "rules[3].match") and prefixes every
    error. The expression is dry-run on the samples: a failure other than a missing key or
    index is a compile error, and so is a result that is not an instance of `expect`.
    """
    program = _prepare(expression, variables.keys(), what=what, device_domains=False)
    compiled = Expression(expression, program, frozenset(variables), what)
    try:
        result = compiled.evaluate(variables)
    except CelError as exc:
        if exc.reason.startswith(("no such key", "index out of bounds")):
            return compiled
        raise
    if expect is not None:
        wanted = _as_tuple(expect)
        # bool is an int in Python but not in CEL: an int is not accepted where bool is expected.
        if not isinstance(result, wanted) or (isinstance(result, bool) and bool not in wanted):
            names_ = " or ".join(t.__name__ for t in wanted)
            raise CelError(
                expression, f"must evaluate to {names_}, got {_type_name(result)}", what=what
            )
    return compiled


def _as_tuple(expect: type | tuple[type, ...] | None) -> tuple[type, ...]:
    if expect is None:
        return ()
    return expect if isinstance(expect, tuple) else (expect,)
