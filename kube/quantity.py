"""Kubernetes `resource.Quantity`: parsing, exact arithmetic, comparison, canonical text.

Every amount the project reads from a pod, a claim, a rule or a ResourceSlice ("40Gi", "500m",
"1e3") goes through here, so that the gateway agrees with the API server on what a text means
and on how it is written back. The semantics follow apimachinery's `ParseQuantity` and
`CanonicalizeBytes`:

- grammar: optional sign, digits with an optional fraction (".5", "1.", "1.5"), then one suffix:
  binary `Ki Mi Gi Ti Pi Ei`, decimal `n u m "" k M G T P E`, or a decimal exponent `e3`/`E-3`;
  as upstream, a lone sign or dot ("-", ".") and a bare suffix ("Mi") parse as zero;
- values are kept exactly down to nano; a finer non-zero value is rounded away from zero
  ("0.9n" is 1n); a binary-suffixed value is capped at 2^63-1 as upstream does;
- the text form keeps the kind of suffix that was parsed (binary, decimal, exponent) and picks
  the largest suffix that loses nothing: "1024Mi" is "1Gi", "0.5" is "500m", "1.5Gi" is
  "1536Mi"; a binary value that is not a whole number of bytes, or is under 1Ki, is written in
  decimal ("0.5Ki" is "512");
- as upstream's `String()`, a parsed text that its fast path takes for canonical is written back
  as it was given: "+1", "007", "1E3", "1e+3", "1.", "1.500" and "+1Ki" stay as they are
  (upstream keeps the input for a small decimal value whose scale is a multiple of 3 and whose
  digits neither start with 0 nor end in 000, and for a binary one whose number is not a
  multiple of 8); arithmetic results are always written canonically.

Deliberate differences, both about inputs no manifest carries: a decimal exponent beyond
+-1000 or a number with more than 1000 digits is refused (upstream accepts them and wraps or
allocates unboundedly), and a binary value of 1024Ei or more keeps the "Ei" suffix where
upstream would drop it.

This module must not use floats for values (only `as_approximate_float` returns one) and must
not import anything beyond the standard library: the translator and the allocator planner call
it on hot paths.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from functools import lru_cache, total_ordering
from typing import Final, Literal

QuantityFormat = Literal["BinarySI", "DecimalSI", "DecimalExponent"]
BINARY_SI: Final = "BinarySI"
DECIMAL_SI: Final = "DecimalSI"
DECIMAL_EXPONENT: Final = "DecimalExponent"

_NANO: Final = 10**9
# Upstream caps binary-suffixed quantities at the largest int64 when parsing.
_MAX_BINARY_NANOS: Final = (2**63 - 1) * _NANO
_INT64_MAX: Final = 2**63 - 1
_MAX_EXPONENT: Final = 1000
_MAX_DIGITS: Final = 1000
# apimachinery's maxInt64Factors: the fast path takes at most 18 digits.
_MAX_INT64_FACTORS: Final = 18

_BINARY_SUFFIXES: Final[dict[str, int]] = {
    "Ki": 10,
    "Mi": 20,
    "Gi": 30,
    "Ti": 40,
    "Pi": 50,
    "Ei": 60,
}
_DECIMAL_SUFFIXES: Final[dict[str, int]] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_DECIMAL_BY_EXPONENT: Final[dict[int, str]] = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER: Final[tuple[str, ...]] = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")
_SUFFIX_HELP: Final = (
    "use a binary suffix (Ki, Mi, Gi, Ti, Pi, Ei), a decimal one (n, u, m, k, M, G, T, P, E) "
    'or an exponent such as "e3"'
)


class QuantityError(ValueError):
    """A text that is not a Kubernetes quantity; the message names the text and what is wrong."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(f"invalid quantity {quoted(text)}: {reason}")
        self.text = text
        self.reason = reason


def quoted(text: str) -> str:
    """`text` in double quotes with escapes, as Go's %q writes it in Kubernetes messages."""
    return json.dumps(text, ensure_ascii=False)


def _ceil_div(numerator: int, denominator: int) -> int:
    """Ceiling of a non-negative fraction (magnitudes round away from zero, as upstream)."""
    return -(-numerator // denominator)


def _scan(text: str) -> tuple[bool, str, str, str]:
    """Split `text` into sign, integer digits, fraction digits and suffix.

    Mirrors apimachinery's `parseQuantityString`, including its leniencies, so that what the API
    server accepts is accepted here; the reasons it gives are ours.
    """
    end = len(text)
    pos = 0
    positive = True
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos].lstrip("0") or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        rest = text[suffix_start:]
        if any(ch.isspace() for ch in text):
            raise QuantityError(text, "spaces are not allowed in a quantity")
        if suffix_start == 0 or (suffix_start == 1 and text[0] in "+-"):
            raise QuantityError(text, 'a quantity starts with a number, e.g. "40Gi" or "500m"')
        raise QuantityError(text, f"unknown suffix {quoted(rest)}; {_SUFFIX_HELP}")
    return positive, num, denom, text[suffix_start:]


def _interpret(text: str, suffix: str) -> tuple[int, int, QuantityFormat]:
    """Base, exponent and format of a suffix (upstream `suffixHandler.interpret`)."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[0] in "+-" else digits
        if not body or not all(ch in _DIGITS for ch in body):
            raise QuantityError(text, f"unknown suffix {quoted(suffix)}; {_SUFFIX_HELP}")
        exponent = int(digits)
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(
                text, f"exponent {exponent} is out of range (-{_MAX_EXPONENT}..{_MAX_EXPONENT})"
            )
        return 10, exponent, DECIMAL_EXPONENT
    raise QuantityError(text, f"unknown suffix {quoted(suffix)}; {_SUFFIX_HELP}")


# Suffixes that a number counted in a unit of its own (MiB, GiB, percent, cards) never carries
# on purpose: the binary ones, and the decimal ones from M up. `k` stands as written: the API
# server writes a plain 8000 as 8k.
_MISTAKEN_SUFFIXES: Final = frozenset({"Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "M", "G", "T", "P",
                                       "E"})


def mistaken_suffix(text: str) -> str | None:
    """The suffix of a quantity text when a resource counted in a unit of its own cannot mean it
    (`8Gi` of HAMi's MiB would be 8Pi), None otherwise, or when `text` is no quantity."""
    try:
        suffix = _scan(text.strip())[3]
    except QuantityError:
        return None
    return suffix if suffix in _MISTAKEN_SUFFIXES else None


@total_ordering
class Quantity:
    """An exact amount with the suffix kind it was written in; immutable and hashable.

    Equality, hashing and ordering are by value ("1Gi" == "1073741824"), as upstream's `Cmp`;
    the format only decides how `str()` writes the value.
    """

    __slots__ = ("_format", "_nanos", "_text")

    _nanos: int
    _format: QuantityFormat
    _text: str | None

    def __init__(
        self, nanos: int, fmt: QuantityFormat = DECIMAL_SI, text: str | None = None
    ) -> None:
        """A quantity of `nanos` billionths; prefer `parse`, `from_bytes` or `from_int`.

        `text`, when given, is what `str()` returns (upstream's cached input text).
        """
        object.__setattr__(self, "_nanos", nanos)
        object.__setattr__(self, "_format", fmt)
        object.__setattr__(self, "_text", text)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Quantity is immutable")

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Parse a Kubernetes quantity text; raises `QuantityError` naming the text."""
        if not isinstance(text, str):
            raise QuantityError(str(text), 'a quantity must be a string such as "40Gi"')
        if not text:
            raise QuantityError(text, 'empty; write a number with an optional suffix, e.g. "40Gi"')
        if text == "0":
            return _ZERO_DECIMAL
        positive, num, denom, suffix = _scan(text)
        if len(num) + len(denom) > _MAX_DIGITS:
            raise QuantityError(text, f"more than {_MAX_DIGITS} digits")
        base, exponent, fmt = _interpret(text, suffix)
        if not any(ch in _DIGITS for ch in text[:len(text) - len(suffix)]) \
                and not _fast_path(num, denom, exponent, fmt):
            # Upstream reads a missing number as 0 on its fast path ("Ki"), and refuses it on
            # the slow one, which parses the text before the suffix ("Ei", "+Pi", "e-12").
            raise QuantityError(text, f'no number before the suffix {quoted(suffix)}; write '
                                      f'one, e.g. "1{suffix}"')
        kept = text if _kept_as_written(num, denom, exponent, fmt) else None
        mantissa = int(num + denom) if (num != "0" or denom) else 0
        if base == 10:
            shift = exponent + 9 - len(denom)
            nanos = mantissa * 10**shift if shift >= 0 else _ceil_div(mantissa, 10**-shift)
        else:
            nanos = _ceil_div(mantissa * (_NANO << exponent), 10 ** len(denom))
        if fmt == BINARY_SI:
            nanos = min(nanos, _MAX_BINARY_NANOS)
            if 0 < nanos < _NANO:
                # Upstream: a binary value below one unit is shown in decimal.
                fmt = DECIMAL_SI
        return cls(nanos if positive else -nanos, fmt, kept)

    @classmethod
    def from_bytes(cls, n: int) -> Quantity:
        """An integer amount written with binary suffixes (85899345920 -> "80Gi")."""
        return cls(_checked_int(n) * _NANO, BINARY_SI)

    @classmethod
    def from_int(cls, n: int, fmt: QuantityFormat = DECIMAL_SI) -> Quantity:
        """An integer amount in the given format (upstream `NewQuantity`)."""
        return cls(_checked_int(n) * _NANO, fmt)

    # --- accessors ----------------------------------------------------------------------------

    @property
    def format(self) -> QuantityFormat:
        return self._format

    @property
    def nanos(self) -> int:
        """The exact value in billionths (every quantity is a whole number of them)."""
        return self._nanos

    def as_fraction(self) -> Fraction:
        return Fraction(self._nanos, _NANO)

    def is_integer(self) -> bool:
        return self._nanos % _NANO == 0

    def sign(self) -> int:
        return (self._nanos > 0) - (self._nanos < 0)

    def is_zero(self) -> bool:
        return self._nanos == 0

    def value(self) -> int:
        """The value rounded away from zero to an integer (upstream `Value()`)."""
        return self.scaled_value(0)

    def milli_value(self) -> int:
        """The value in thousandths rounded away from zero (upstream `MilliValue()`)."""
        return self.scaled_value(-3)

    def scaled_value(self, scale: int) -> int:
        """The value in units of 10^scale, rounded away from zero (upstream `ScaledValue`)."""
        shift = 9 + scale
        if shift <= 0:
            factor: int = 10**-shift
            return self._nanos * factor
        magnitude = _ceil_div(abs(self._nanos), 10**shift)
        return magnitude if self._nanos >= 0 else -magnitude

    def as_approximate_float(self) -> float:
        """The nearest float; infinite when out of range (upstream `AsApproximateFloat64`)."""
        try:
            return self._nanos / _NANO
        except OverflowError:
            return float("inf") if self._nanos > 0 else float("-inf")

    # --- arithmetic (format rules of upstream Add/Sub: a zero left side takes the right's) ----

    def __add__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity(self._nanos + other._nanos, fmt)

    def __sub__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        fmt = other._format if self._nanos == 0 else self._format
        return Quantity(self._nanos - other._nanos, fmt)

    def __neg__(self) -> Quantity:
        return Quantity(-self._nanos, self._format)

    def __abs__(self) -> Quantity:
        return Quantity(abs(self._nanos), self._format)

    # --- comparison ---------------------------------------------------------------------------

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1 as upstream `Cmp`."""
        return (self._nanos > other._nanos) - (self._nanos < other._nanos)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos == other._nanos

    def __lt__(self, other: Quantity) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self._nanos < other._nanos

    def __hash__(self) -> int:
        return hash(("Quantity", self._nanos))

    def __bool__(self) -> bool:
        return self._nanos != 0

    # --- text ---------------------------------------------------------------------------------

    def __str__(self) -> str:
        if self._text is not None:
            return self._text
        return _canonical(self._nanos, self._format)

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"

    def __reduce__(self) -> tuple[type[Quantity], tuple[int, QuantityFormat, str | None]]:
        return (Quantity, (self._nanos, self._format, self._text))


def _fast_path(num: str, denom: str, exponent: int, fmt: QuantityFormat) -> bool:
    """Whether upstream's `ParseQuantity` takes its int64 fast path for these parts (at most
    18 digits, or 15 less the binary exponent's decimal digits; a scale down to nano; no
    int64 overflow)."""
    if fmt == BINARY_SI:
        # upstream: 15 - len(num) - int(float32(exponent)*3/10) - 1, exact for 10..60
        return (not denom and 15 - len(num) - exponent * 3 // 10 - 1 >= 0
                and int(num) << exponent <= _INT64_MAX)
    return (_MAX_INT64_FACTORS - (len(num) + len(denom)) >= 0
            and exponent - len(denom) >= -9)


def _kept_as_written(num: str, denom: str, exponent: int, fmt: QuantityFormat) -> bool:
    """Whether upstream's `ParseQuantity` fast path keeps the input as the quantity's text.

    Mirrors the "if the number is in canonical form, reuse the string" branch: the value must
    fit the fast path (`_fast_path`), then a decimal value needs a scale that is a multiple of
    3 and digits that neither start with 0 nor end in 000, a binary one a number that is not a
    multiple of 8.
    """
    if not _fast_path(num, denom, exponent, fmt):
        return False
    if fmt == BINARY_SI:
        return int(num) & 0x07 != 0
    shifted = num + denom
    return (exponent - len(denom)) % 3 == 0 and not shifted.endswith("000") \
        and shifted[0] != "0"


def _checked_int(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"expected an integer, got {type(n).__name__} {n!r}")
    return n


def _canonical(nanos: int, fmt: QuantityFormat) -> str:
    """Upstream `CanonicalizeBytes`: largest suffix of the same kind that loses nothing."""
    if nanos == 0:
        return "0"
    sign = "-" if nanos < 0 else ""
    magnitude = abs(nanos)
    if fmt == BINARY_SI:
        if magnitude < 1024 * _NANO or magnitude % _NANO:
            fmt = DECIMAL_SI
        else:
            whole = magnitude // _NANO
            power = 0
            # Stops at "Ei", the largest binary suffix; upstream would print no suffix at all.
            while power < 6 and whole >= 1024 and whole % 1024 == 0:
                whole //= 1024
                power += 1
            return f"{sign}{whole}{_BINARY_BY_POWER[power]}"
    mantissa, exponent = magnitude, -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    down = exponent % 3
    mantissa *= 10**down
    exponent -= down
    if fmt == DECIMAL_SI and exponent in _DECIMAL_BY_EXPONENT:
        return f"{sign}{mantissa}{_DECIMAL_BY_EXPONENT[exponent]}"
    # Decimal exponent form, and upstream's fallback for decimal values beyond "E".
    return f"{sign}{mantissa}" + (f"e{exponent}" if exponent else "")


_ZERO_DECIMAL: Final = Quantity(0, DECIMAL_SI)


# Texts recur: every pod of a Deployment asks for the same "4" CPUs and "16Gi", every card of a
# model publishes the same memory. A Quantity is immutable, so one parse serves them all.
_parse_text = lru_cache(maxsize=4096)(Quantity.parse)


def parse_quantity(value: str | int | Quantity) -> Quantity:
    """A quantity from its text, from an integer (as a JSON number would be), or itself."""
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, Quantity):
        return value
    if isinstance(value, bool):
        raise QuantityError(str(value), "a boolean is not a quantity")
    if isinstance(value, int):
        return Quantity.from_int(value)
    raise QuantityError(
        str(value),
        f'a quantity is a string such as "40Gi" or an integer, not {type(value).__name__}',
    )


def bytes_of(value: str | int | Quantity) -> int:
    """An amount of bytes as an integer; refuses a fractional amount such as "0.5"."""
    quantity = parse_quantity(value)
    if not quantity.is_integer():
        raise QuantityError(str(value), "not a whole number of bytes")
    return quantity.nanos // _NANO


def is_quantity(text: str) -> bool:
    """Whether `text` parses (Kubernetes CEL `isQuantity`)."""
    try:
        Quantity.parse(text)
    except QuantityError:
        return False
    return True


_UNIT_NAMES: Final = {2**10: "KiB", 2**20: "MiB", 2**30: "GiB", 2**40: "TiB"}


def mistaken_unit_message(resource: str, raw: str, factor: int) -> str:
    """`nvidia.com/gpumem counts MiB: 8Gi would mean 8Pi; write 8192`: a suffix on a resource
    counted in a unit of its own, what it would mean and what to write."""
    quantity = Quantity.parse(raw)
    if factor == 1:
        return (f"{resource} counts plain numbers (whole units, or percent): {raw} would mean "
                f"{quantity.value()}; write a plain number (a rule that reads bytes under this "
                f"name says so: suffixes: true)")
    unit = _UNIT_NAMES.get(factor) or f"units of {Quantity.from_bytes(factor)}"
    meant = math.floor(quantity.as_fraction() / factor)
    bytes_text = str(Quantity.from_bytes(math.floor(quantity.as_fraction() * factor)))
    fix = f"write {meant}" if meant > 0 else f"write a number of {unit}"
    return f"{resource} counts {unit}: {raw} would mean {bytes_text}; {fix}"
