"""Relative memory: a share's `memoryPercent` of a card turned into bytes, or into a fraction.

A `GpuShareConfig` may ask for memory relative to the card (`memoryPercent`, 1..100) instead of
in bytes; the card is known only where the share lands, so each component resolves it there.
This module is the one place that does, for all of them:

- `share_bytes`: the exact amount, rounded down to the byte. The node plugin sizes a
  container's limit with it, where the card is known to the byte: a share of 100 percent is then
  the card's memory exactly, which the node plugin reads as "the whole card, no limit" (a
  rounded amount would fall short of the card and become a limit). Its enforcement writes the
  limit in whole MiB, rounded down, itself.
- `share_bytes_in_whole_mib`: the same amount rounded down to whole MiB, built on the exact
  one. The planner charges a card with it and the quotas count it (a legacy pod's charges
  too): what they charge is then what the node plugin enforces, never more than the
  percentage.
- `share_fraction`: the part of a card the percentage is (0.25 for 25), for estimates that
  count cards rather than bytes (defrag's).

Pure and standard library only: the planner calls it on hot paths.
"""

from __future__ import annotations

from typing import Final

_MIB: Final = 1 << 20
_WHOLE: Final = 100  # percent of a card


def share_bytes(card_memory: int, percent: int) -> int:
    """`percent` of `card_memory` bytes, rounded down to the byte (the node plugin's limit)."""
    return card_memory * percent // _WHOLE


def share_bytes_in_whole_mib(card_memory: int, percent: int) -> int:
    """`percent` of `card_memory` bytes, rounded down to whole MiB (what the planner charges
    and the quotas count: never above what the node plugin enforces)."""
    # `share_bytes` written out: the planner calls this once per card it tries.
    return card_memory * percent // _WHOLE // _MIB * _MIB


def share_fraction(percent: int) -> float:
    """The part of a card `percent` is, 0 to 1."""
    return percent / _WHOLE


__all__ = ["share_bytes", "share_bytes_in_whole_mib", "share_fraction"]
