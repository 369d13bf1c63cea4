"""The functions expressions may call beyond CEL core: Kubernetes' quantity, semver and string
libraries, with Kubernetes' names, overloads and error wording.

`FUNCTIONS` is handed to every engine context (and shared by all of them: never mutate it);
`KNOWN_FUNCTIONS` adds what the engine provides natively, for compilation's static check of the
functions an expression calls. Each function receives engine values (quantities and versions as
the marker maps of `values`) and refuses a call that fits no overload with cel-go's "found no
matching overload" wording. The functions are pure: they must not keep state between calls or
reach anything beyond their arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from dra_gateway.kube.cel.errors import Failure
from dra_gateway.kube.cel.values import (
    INT64_MAX,
    INT64_MIN,
    NANO,
    QUANTITY_KEY,
    SEMVER_KEY,
    is_int,
    parse_quantity,
    semver_of,
    semver_value,
    type_name,
)
from dra_gateway.kube.quantity import Quantity, QuantityError, is_quantity
from dra_gateway.kube.semver import Semver, SemverError, is_semver


def _no_overload(function: str, args: tuple[Any, ...]) -> Failure:
    kinds = ", ".join(type_name(a) for a in args)
    return Failure(f"found no matching overload for '{function}' applied to ({kinds})")


def _nanos(function: str, args: tuple[Any, ...], value: Any) -> int:
    if isinstance(value, dict) and len(value) == 1 and QUANTITY_KEY in value:
        return int(value[QUANTITY_KEY])
    raise _no_overload(function, args)


def _version(function: str, args: tuple[Any, ...], value: Any) -> Semver:
    if isinstance(value, dict) and len(value) == 1 and SEMVER_KEY in value:
        return semver_of(value[SEMVER_KEY])
    raise _no_overload(function, args)


def _compare(function: str, args: tuple[Any, ...]) -> int:
    if len(args) != 2:
        raise _no_overload(function, args)
    a, b = args
    kind = type_name(a)
    if kind == "quantity" and type_name(b) == "quantity":
        x, y = int(a[QUANTITY_KEY]), int(b[QUANTITY_KEY])
        return (x > y) - (x < y)
    if kind == "semver" and type_name(b) == "semver":
        return semver_of(a[SEMVER_KEY]).compare(semver_of(b[SEMVER_KEY]))
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
        return parse_quantity(args[0])
    except QuantityError as exc:
        raise Failure(str(exc)) from None


def _fn_is_quantity(*args: Any) -> bool:
    if len(args) != 1 or not isinstance(args[0], str):
        raise _no_overload("isQuantity", args)
    return is_quantity(args[0])


def _fn_sign(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("sign", args)
    n = _nanos("sign", args, args[0])
    return (n > 0) - (n < 0)


def _int64_of(nanos: int) -> int | None:
    if nanos % NANO:
        return None
    value = nanos // NANO
    return value if INT64_MIN <= value <= INT64_MAX else None


def _fn_is_integer(*args: Any) -> bool:
    if len(args) != 1:
        raise _no_overload("isInteger", args)
    return _int64_of(_nanos("isInteger", args, args[0])) is not None


def _fn_as_integer(*args: Any) -> int:
    if len(args) != 1:
        raise _no_overload("asInteger", args)
    value = _int64_of(_nanos("asInteger", args, args[0]))
    if value is None:
        raise Failure("cannot convert value to integer")
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
    right = other * NANO if is_int(other) else _nanos(function, args, other)
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
        raise Failure(str(exc)) from None


def _fn_is_semver(*args: Any) -> bool:
    text, normalize = _semver_args("isSemver", args)
    return is_semver(text, normalize=normalize)


def _checked_int64(value: int) -> int:
    if value > INT64_MAX:
        raise Failure(f"version number {value} does not fit in an int")
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
    elif len(args) == 3 and is_int(args[2]):
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
        raise Failure("join: every element of the list must be a string")
    return sep.join(args[0])


def _fn_replace(*args: Any) -> str:
    _strings("replace", args, 3)
    text, old, new = str(args[0]), str(args[1]), str(args[2])
    if len(args) == 3:
        return text.replace(old, new)
    if len(args) == 4 and is_int(args[3]):
        return text.replace(old, new, int(args[3]))
    raise _no_overload("replace", args)


def _offset(function: str, args: tuple[Any, ...]) -> int | None:
    if len(args) == 2:
        return None
    if len(args) == 3 and is_int(args[2]):
        return int(args[2])
    raise _no_overload(function, args)


def _index_from(text: str, sub: str, offset: int) -> int:
    """cel-go's `indexOf(sub, offset)`: an offset past the end finds nothing, it is no error."""
    if sub == "":
        return offset
    if offset < 0:
        raise Failure(f"indexOf: index out of range: {offset}")
    if offset >= len(text):
        return -1
    return text.find(sub, offset)


def _last_index_from(text: str, sub: str, offset: int) -> int:
    """cel-go's `lastIndexOf(sub, offset)`: the last match starting at or before `offset`."""
    if sub == "":
        return offset
    if offset < 0:
        raise Failure(f"lastIndexOf: index out of range: {offset}")
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
    if not args or not isinstance(args[0], str) or not all(is_int(a) for a in args[1:]):
        raise _no_overload("substring", args)
    text = args[0]
    if len(args) == 2:
        start, end = int(args[1]), len(text)
    elif len(args) == 3:
        start, end = int(args[1]), int(args[2])
    else:
        raise _no_overload("substring", args)
    if start < 0 or start > len(text) or end < 0 or end > len(text):
        raise Failure(f"substring: index out of range: {start}..{end} of {len(text)}")
    if start > end:
        raise Failure(f"substring: invalid range: start {start} is after end {end}")
    return text[start:end]


def _fn_char_at(*args: Any) -> str:
    if len(args) != 2 or not isinstance(args[0], str) or not is_int(args[1]):
        raise _no_overload("charAt", args)
    text, index = args[0], int(args[1])
    if index < 0 or index > len(text):
        raise Failure(f"charAt: index out of range: {index}")
    return text[index : index + 1]


def _fn_string(*args: Any) -> str:
    # The engine converts ints, doubles, strings and bytes natively and calls this only for
    # what it lacks: bools.
    if len(args) == 1 and isinstance(args[0], bool):
        return "true" if args[0] else "false"
    raise _no_overload("string", args)


# Shared by every engine context; never mutated.
FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
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
KNOWN_FUNCTIONS: Final = _NATIVE_FUNCTIONS | frozenset(FUNCTIONS)
