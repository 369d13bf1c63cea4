"""Kubernetes quantities: the tables mirror apimachinery's quantity_test.go."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest

from dra_gateway.kube.quantity import (
    BINARY_SI,
    DECIMAL_EXPONENT,
    DECIMAL_SI,
    Quantity,
    QuantityError,
    QuantityFormat,
    bytes_of,
    is_quantity,
    parse_quantity,
)

B: QuantityFormat = BINARY_SI
D: QuantityFormat = DECIMAL_SI
X: QuantityFormat = DECIMAL_EXPONENT


def dec(mantissa: int, exponent: int) -> Fraction:
    return Fraction(mantissa) * Fraction(10) ** exponent


def q(mantissa: int, exponent: int, fmt: QuantityFormat) -> Quantity:
    """A quantity built from its value, as upstream's `decQuantity` helper."""
    nanos = dec(mantissa, exponent) * 10**9
    assert nanos.denominator == 1
    return Quantity(int(nanos), fmt)


# upstream TestQuantityParse: input, exact value, format
PARSE_TABLE: list[tuple[str, Fraction, QuantityFormat]] = [
    ("0", dec(0, 0), D),
    ("0n", dec(0, 0), D),
    ("0u", dec(0, 0), D),
    ("0m", dec(0, 0), D),
    ("0Ki", dec(0, 0), B),
    ("0k", dec(0, 0), D),
    ("0Mi", dec(0, 0), B),
    ("0M", dec(0, 0), D),
    ("0Gi", dec(0, 0), B),
    ("0G", dec(0, 0), D),
    ("0Ti", dec(0, 0), B),
    ("0T", dec(0, 0), D),
    ("1", dec(1, 0), D),
    ("1Ki", dec(1024, 0), B),
    ("8Ki", dec(8 * 1024, 0), B),
    ("7Mi", dec(7 * 1024**2, 0), B),
    ("6Gi", dec(6 * 1024**3, 0), B),
    ("5Ti", dec(5 * 1024**4, 0), B),
    ("4Pi", dec(4 * 1024**5, 0), B),
    ("3Ei", dec(3 * 1024**6, 0), B),
    ("10Ti", dec(10 * 1024**4, 0), B),
    ("100Ti", dec(100 * 1024**4, 0), B),
    ("5n", dec(5, -9), D),
    ("4u", dec(4, -6), D),
    ("3m", dec(3, -3), D),
    ("9", dec(9, 0), D),
    ("8k", dec(8, 3), D),
    ("50k", dec(5, 4), D),
    ("7M", dec(7, 6), D),
    ("6G", dec(6, 9), D),
    ("5T", dec(5, 12), D),
    ("40T", dec(4, 13), D),
    ("300T", dec(3, 14), D),
    ("2P", dec(2, 15), D),
    ("1E", dec(1, 18), D),
    ("1E-3", dec(1, -3), X),
    ("1e3", dec(1, 3), X),
    ("1E6", dec(1, 6), X),
    ("1e9", dec(1, 9), X),
    ("1E12", dec(1, 12), X),
    ("1e15", dec(1, 15), X),
    ("1E18", dec(1, 18), X),
    ("1e14", dec(1, 14), X),
    ("1e13", dec(1, 13), X),
    ("100.035k", dec(100035, 0), D),
    ("0.001", dec(1, -3), D),
    ("0.0005k", dec(5, -1), D),
    ("0.005", dec(5, -3), D),
    ("0.05", dec(5, -2), D),
    ("0.5", dec(5, -1), D),
    ("0.00050k", dec(5, -1), D),
    ("0.00500", dec(5, -3), D),
    ("0.05000", dec(5, -2), D),
    ("0.50000", dec(5, -1), D),
    ("0.5e0", dec(5, -1), X),
    ("0.5e-1", dec(5, -2), X),
    ("0.5e-2", dec(5, -3), X),
    ("10.035M", dec(10035, 3), D),
    ("1.2e3", dec(12, 2), X),
    ("1.3E+6", dec(13, 5), X),
    ("1.40e9", dec(14, 8), X),
    ("1.53E12", dec(153, 10), X),
    ("1.6e15", dec(16, 14), X),
    ("1.7E18", dec(17, 17), X),
    ("9.01", dec(901, -2), D),
    ("8.1k", dec(81, 2), D),
    ("7.123456M", dec(7123456, 0), D),
    ("6.987654321G", dec(6987654321, 0), D),
    ("5.444T", dec(5444, 9), D),
    ("40.1T", dec(401, 11), D),
    ("300.2T", dec(3002, 11), D),
    ("2.5P", dec(25, 14), D),
    ("1.01E", dec(101, 16), D),
    # things that saturate or round
    ("3.001n", dec(4, -9), D),
    ("1.1E-9", dec(2, -9), X),
    ("0.0000000001", dec(1, -9), D),
    ("0.0000000005", dec(1, -9), D),
    ("0.00000000050", dec(1, -9), D),
    ("0.5e-9", dec(1, -9), X),
    ("0.9n", dec(1, -9), D),
    ("0.00000012345", dec(124, -9), D),
    ("0.00000012354", dec(124, -9), D),
    ("9Ei", dec(2**63 - 1, 0), B),
    ("9223372036854775807Ki", dec(2**63 - 1, 0), B),
    ("12E", dec(12, 18), D),
    # fractional binary amounts
    ("100.035Ki", dec(10243584, -2), B),
    ("0.5Mi", dec(524288, 0), B),
    ("0.05Gi", dec(536870912, -1), B),
    ("0.025Ti", dec(274877906944, -1), B),
    # "written by trolls"
    ("0.000000000001Ki", dec(2, -9), D),
    (".001", dec(1, -3), D),
    (".0001k", dec(100, -3), D),
    ("1.", dec(1, 0), D),
    ("1.G", dec(1, 9), D),
]


@pytest.mark.parametrize(("text", "value", "fmt"), PARSE_TABLE)
def test_parsing_matches_the_upstream_table(text: str, value: Fraction, fmt: str) -> None:
    parsed = Quantity.parse(text)
    assert parsed.as_fraction() == value
    assert parsed.format == fmt


@pytest.mark.parametrize(("text", "value", "fmt"), PARSE_TABLE)
def test_a_sign_negates_or_keeps_the_value(text: str, value: Fraction, fmt: str) -> None:
    negative = Quantity.parse("-" + text)
    assert negative.as_fraction() == -value
    assert negative.format == fmt
    assert Quantity.parse("+" + text) == Quantity.parse(text)


@pytest.mark.parametrize(
    "text",
    ["1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-", " 1", "1 ", ""],
)
def test_upstream_invalid_texts_are_refused(text: str) -> None:
    with pytest.raises(QuantityError) as caught:
        Quantity.parse(text)
    assert str(caught.value).startswith(f'invalid quantity "{text}": ')
    assert not is_quantity(text)


def test_an_unknown_suffix_is_named_in_the_message() -> None:
    with pytest.raises(QuantityError) as caught:
        Quantity.parse("12Gb")
    assert str(caught.value) == (
        'invalid quantity "12Gb": unknown suffix "Gb"; use a binary suffix (Ki, Mi, Gi, Ti, Pi, '
        'Ei), a decimal one (n, u, m, k, M, G, T, P, E) or an exponent such as "e3"'
    )
    assert caught.value.text == "12Gb"


def test_a_known_letter_that_is_no_suffix_is_refused() -> None:
    with pytest.raises(QuantityError, match='unknown suffix "K"'):
        Quantity.parse("200K")
    with pytest.raises(QuantityError, match='unknown suffix "e"'):
        Quantity.parse("1e")


def test_spaces_are_refused_with_a_reason() -> None:
    with pytest.raises(QuantityError, match="spaces are not allowed"):
        Quantity.parse("1 Gi")


def test_absurd_exponents_are_refused_instead_of_allocating() -> None:
    with pytest.raises(QuantityError, match="exponent 100000 is out of range"):
        Quantity.parse("1e100000")


def test_upstream_leniencies_are_kept_so_the_api_server_and_we_agree() -> None:
    # apimachinery parses a bare sign, a bare dot and a bare suffix as zero.
    for text in ("-", "+", ".", "-.", "Mi", "m"):
        assert Quantity.parse(text).is_zero(), text


# upstream TestQuantityString: value, canonical text, an alternate text with the same canonical
STRING_TABLE: list[tuple[Quantity, str, str]] = [
    (q(1024**3, 0, B), "1Gi", "1024Mi"),
    (q(300 * 1024**2, 0, B), "300Mi", "307200Ki"),
    (q(6 * 1024, 0, B), "6Ki", ""),
    (q(1001 * 1024**3, 0, B), "1001Gi", "1025024Mi"),
    (q(1024**4, 0, B), "1Ti", "1024Gi"),
    (q(5, 0, B), "5", "5000m"),
    (q(500, -3, B), "500m", "0.5"),
    (q(1, 9, D), "1G", "1000M"),
    (q(1000, 6, D), "1G", "0.001T"),
    (q(1000000, 3, D), "1G", ""),
    (q(1000000000, 0, D), "1G", ""),
    (q(1, -3, D), "1m", "1000u"),
    (q(80, -3, D), "80m", ""),
    (q(1080, -3, D), "1080m", "1.08"),
    (q(108, -2, D), "1080m", "1080000000n"),
    (q(10800, -4, D), "1080m", ""),
    (q(300, 6, D), "300M", ""),
    (q(1, 12, D), "1T", ""),
    (q(1, 18, D), "1E", ""),
    (q(1, 21, D), "1e21", "1000E"),
    (q(5, 21, D), "5e21", "5000E"),
    (q(1, 24, D), "1e24", "1000000E"),
    (q(1234567, 6, D), "1234567M", ""),
    (q(1234567, -3, B), "1234567m", ""),
    (q(3, 3, D), "3k", ""),
    (q(1025, 0, B), "1025", ""),
    (q(0, 0, D), "0", ""),
    (q(0, 0, B), "0", ""),
    (q(1, 9, X), "1e9", ".001e12"),
    (q(1, -3, X), "1e-3", "0.001e0"),
    (q(1, -9, X), "1e-9", "1000e-12"),
    (q(80, -3, X), "80e-3", ""),
    (q(300, 6, X), "300e6", ""),
    (q(1, 12, X), "1e12", ""),
    (q(1, 3, X), "1e3", ""),
    (q(3, 3, X), "3e3", ""),
    (q(3, 3, D), "3k", ""),
    (q(0, 0, X), "0", "00"),
    (q(1, -9, D), "1n", ""),
    (q(80, -9, D), "80n", ""),
    (q(1080, -9, D), "1080n", ""),
    (q(108, -8, D), "1080n", ""),
    (q(10800, -10, D), "1080n", ""),
    (q(1, -6, D), "1u", ""),
    (q(80, -6, D), "80u", ""),
    (q(1080, -6, D), "1080u", ""),
]


@pytest.mark.parametrize(("value", "canonical", "alternate"), STRING_TABLE)
def test_canonical_text_matches_the_upstream_table(
    value: Quantity, canonical: str, alternate: str
) -> None:
    assert str(value) == canonical
    assert str(Quantity.parse(canonical)) == canonical
    if alternate:
        assert str(Quantity.parse(alternate)) == canonical
    if not value.is_zero():
        assert str(-value) == "-" + canonical


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        # upstream TestQuantityParseEmit
        ("1Ki", "1Ki"),
        ("1Mi", "1Mi"),
        ("1Gi", "1Gi"),
        ("1024Mi", "1Gi"),
        ("1000M", "1G"),
        (".001Ki", "1024m"),
        (".000001Ki", "1024u"),
        (".000000001Ki", "1024n"),
        (".000000000001Ki", "2n"),
        # the kind of suffix is kept
        ("1500m", "1500m"),
        ("0.5", "500m"),
        ("1e3", "1e3"),
        ("1000", "1k"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("100M", "100M"),
        ("80Gi", "80Gi"),
        ("0.5Ki", "512"),
        ("100.035Ki", "102435840m"),
        ("9Ei", "9223372036854775807"),
    ],
)
def test_parse_then_emit_gives_the_canonical_text(text: str, canonical: str) -> None:
    assert str(Quantity.parse(text)) == canonical
    negative = Quantity.parse("-" + text)
    assert str(negative) == "-" + canonical


def test_comparison_is_by_value_across_suffix_kinds() -> None:
    assert Quantity.parse("40Gi") == Quantity.parse("42949672960")
    assert hash(Quantity.parse("40Gi")) == hash(Quantity.parse("42949672960"))
    assert Quantity.parse("10000T") > Quantity.parse("100Gi")
    assert Quantity.parse("50M") < Quantity.parse("50Mi")
    assert Quantity.parse("200M") == Quantity.parse("0.2G")
    assert Quantity.parse("100m").compare(Quantity.parse("50m")) == 1
    assert Quantity.parse("50m").compare(Quantity.parse("100m")) == -1
    assert Quantity.parse("0").compare(Quantity.parse("0Gi")) == 0
    assert sorted(map(Quantity.parse, ["1Gi", "1G", "1", "-1Ki"])) == [
        Quantity.parse(t) for t in ["-1Ki", "1", "1G", "1Gi"]
    ]


def test_adding_zero_keeps_the_suffix_on_either_side() -> None:
    zero = Quantity.parse("0")
    for text in ("100m", "1Gi"):
        value = Quantity.parse(text)
        assert str(value + zero) == text
        assert str(zero + value) == text
        assert str(value - zero) == text
        assert str(zero - value) == str(-value)


def test_arithmetic_is_exact_and_keeps_the_left_format() -> None:
    total = Quantity.parse("1Gi") + Quantity.parse("512Mi")
    assert str(total) == "1536Mi"
    assert str(Quantity.parse("1") - Quantity.parse("0.1")) == "900m"
    assert str(Quantity.parse("0.1") + Quantity.parse("0.2")) == "300m"
    assert str(Quantity.parse("40Gi") - Quantity.parse("40G")) == "2880540Ki"
    assert str(-Quantity.parse("9.01")) == "-9010m"


def test_value_rounds_away_from_zero_like_upstream() -> None:
    assert Quantity.parse("9.01").value() == 10
    assert Quantity.parse("-9.01").value() == -10
    assert Quantity.parse("1500m").value() == 2
    assert Quantity.parse("1Gi").value() == 1073741824
    assert Quantity.parse("1.5").milli_value() == 1500
    assert Quantity.parse("1n").milli_value() == 1
    assert Quantity.parse("-1n").milli_value() == -1
    assert Quantity.parse("9.01").scaled_value(-1) == 91


def test_accessors() -> None:
    half = Quantity.parse("500m")
    assert half.as_fraction() == Fraction(1, 2)
    assert not half.is_integer()
    assert Quantity.parse("50k").is_integer()
    assert Quantity.parse("-3").sign() == -1
    assert Quantity.parse("0Gi").sign() == 0
    assert Quantity.parse("1m").sign() == 1
    assert Quantity.parse("1.5Gi").as_approximate_float() == 1610612736.0


def test_from_bytes_writes_binary_suffixes() -> None:
    assert str(Quantity.from_bytes(85899345920)) == "80Gi"
    assert str(Quantity.from_bytes(1000)) == "1k"  # under 1Ki: decimal, as upstream
    assert str(Quantity.from_int(1234000)) == "1234k"
    with pytest.raises(TypeError):
        Quantity.from_bytes(1.5)  # type: ignore[arg-type]


def test_parse_quantity_accepts_text_integers_and_quantities() -> None:
    forty = Quantity.parse("40Gi")
    assert parse_quantity(forty) is forty
    assert parse_quantity("40Gi") == forty
    assert parse_quantity(42949672960) == forty
    with pytest.raises(QuantityError, match='invalid quantity "True": a boolean'):
        parse_quantity(True)
    with pytest.raises(QuantityError, match="not float"):
        parse_quantity(1.5)  # type: ignore[arg-type]


def test_bytes_of_refuses_a_fraction_of_a_byte() -> None:
    assert bytes_of("80Gi") == 85899345920
    assert bytes_of("1.5Gi") == 1610612736
    assert bytes_of(7) == 7
    with pytest.raises(QuantityError, match=r'"0\.5": not a whole number of bytes'):
        bytes_of("0.5")


def test_quantities_are_immutable_and_picklable() -> None:
    value = Quantity.parse("1Gi")
    with pytest.raises(AttributeError):
        value._nanos = 3
    restored = pickle.loads(pickle.dumps(value))
    assert restored == value
    assert str(restored) == "1Gi"
