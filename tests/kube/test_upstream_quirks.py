"""Behaviours found by the differential tests (test_oracle.py), pinned without Go.

Each case here was a mismatch against the upstream Go code and is now fixed; test_oracle.py
checks the same against the real implementation where `go` is available.
"""

from __future__ import annotations

import pickle

import pytest

from dra_gateway.kube.cel import compile_expression
from dra_gateway.kube.quantity import Quantity

# upstream's ParseQuantity keeps the input as String() when its fast path takes it for canonical
KEPT_AS_WRITTEN = ["+1", "007", "1E3", "1e+3", "1E-3", "1E+3", "1.", "1.G", "1.500", "+1Ki",
                   "01Ki", "-1Ki", "7Ki", "1e3", "100m", "12e-3"]
CANONICALISED = [("1.5", "1500m"), ("1000m", "1"), ("1.0", "1"), ("8Ki", "8Ki"),
                 ("16Ki", "16Ki"), ("1024Ki", "1Mi"), ("00", "0"), ("-0", "0"), ("+0", "0"),
                 ("0.1", "100m"), (".5", "500m"), ("1.5Gi", "1536Mi"),
                 ("1234567890123456789", "1234567890123456789"), ("1e-10", "1e-9")]


@pytest.mark.parametrize("text", KEPT_AS_WRITTEN)
def test_a_text_upstream_keeps_is_written_back_as_given(text: str) -> None:
    assert str(Quantity.parse(text)) == text


@pytest.mark.parametrize(("text", "canonical"), CANONICALISED)
def test_other_texts_are_written_canonically(text: str, canonical: str) -> None:
    assert str(Quantity.parse(text)) == canonical


def test_arithmetic_and_negation_write_canonically() -> None:
    one = Quantity.parse("+1")
    assert str(one + Quantity.parse("0")) == "1"
    assert str(-one) == "-1"
    assert str(Quantity.parse("1E3") - Quantity.parse("0")) == "1e3"


def test_the_kept_text_survives_pickling_and_does_not_change_equality() -> None:
    kept = Quantity.parse("1E3")
    again = pickle.loads(pickle.dumps(kept))
    assert str(again) == "1E3"
    assert again == Quantity.parse("1e3") == Quantity.parse("1k")
    assert hash(again) == hash(Quantity.parse("1k"))


# cel-go's strings extension: an offset at or past the end finds nothing; it is no error
@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('"abc".indexOf("c", 3)', -1),
        ('"abc".indexOf("c", 4)', -1),
        ('"abc".indexOf("", 3)', 3),
        ('"abc".indexOf("", 7)', 7),
        ('"".indexOf("a")', -1),
        ('"abc".lastIndexOf("c", 5)', -1),
        ('"abc".lastIndexOf("c", 2)', 2),
        ('"abcabc".lastIndexOf("bc", 3)', 1),
        ('"abc".lastIndexOf("abcd")', -1),
        ('"abc".lastIndexOf("")', 3),
        ('"aaa".lastIndexOf("a", 1)', 1),
    ],
)
def test_index_offsets_follow_cel_go(expression: str, expected: int) -> None:
    assert compile_expression(expression, variables={}, what="t").evaluate({}) == expected
