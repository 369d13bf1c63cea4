"""Progress of a long command on standard error, for a person watching a terminal.

One line, rewritten in place at most a few times a second ("translate: reading big.yaml: 42%"),
and erased when the command is done, so that what the command prints after it reads as if
there had been none. Off when standard error is not a terminal: a pipe, a file or a CI log gets
nothing, and standard output is never touched.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

ERASE = "\r\x1b[K"  # back to the line's start, then clear it


class Progress:
    """`update` the line while a step runs; `done` erases it. `every`: the fewest seconds
    between two writes."""

    def __init__(self, command: str, stream: TextIO | None = None, *, every: float = 0.2,
                 enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.every = every
        self.clock = clock
        self._last = -every
        self._shown = False

    def update(self, text: str, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if not force and now - self._last < self.every:
            return
        self._last = now
        self.stream.write(f"{ERASE}{self.command}: {text}")
        self.stream.flush()
        self._shown = True

    def done(self) -> None:
        if self._shown:
            self.stream.write(ERASE)
            self.stream.flush()
            self._shown = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.done()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


__all__ = ["ERASE", "Progress"]
