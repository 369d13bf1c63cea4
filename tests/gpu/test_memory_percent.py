"""Relative memory turned into bytes in one place: exact for the node plugin's limit, whole MiB
for what the planner charges and the quotas count, a fraction for defrag's estimate."""

from __future__ import annotations

import pytest

from dra_gateway.gpu.memory_percent import share_bytes, share_bytes_in_whole_mib, share_fraction

MiB = 1 << 20
GiB = 1 << 30
# An A100 80GB as NVML reports it, and a card whose memory is not a whole number of MiB.
A100 = 81920 * MiB
ODD = 15 * GiB + 12345


def test_exact_bytes_round_down_to_the_byte() -> None:
    assert share_bytes(A100, 10) == 8192 * MiB
    assert share_bytes(ODD, 10) == (15 * GiB + 12345) // 10
    assert share_bytes(1001, 50) == 500


def test_a_whole_card_is_the_card_exactly() -> None:
    # The node plugin reads a share of the card's full memory as no limit at all.
    assert share_bytes(ODD, 100) == ODD
    assert share_bytes_in_whole_mib(ODD, 100) < ODD


def test_whole_mib_round_down_and_never_exceed_the_exact_amount() -> None:
    assert share_bytes_in_whole_mib(A100, 10) == 8192 * MiB
    assert share_bytes_in_whole_mib(3 * MiB, 50) == MiB
    assert share_bytes_in_whole_mib(MiB, 50) == 0


@pytest.mark.parametrize("card", [A100, ODD, 24 * GiB, 3 * MiB + 7, 0])
@pytest.mark.parametrize("percent", [1, 7, 33, 50, 99, 100])
def test_the_forms_agree_with_the_arithmetic_they_replace(card: int, percent: int) -> None:
    assert share_bytes(card, percent) == card * percent // 100
    mib = share_bytes_in_whole_mib(card, percent)
    assert mib == card * percent // 100 // MiB * MiB
    assert mib % MiB == 0
    assert mib <= share_bytes(card, percent)


def test_fraction_of_a_card() -> None:
    assert share_fraction(25) == 0.25
    assert share_fraction(100) == 1.0
    assert share_fraction(1) == 1 / 100
