"""How CEL failures reach callers: `CelError`, and the reasons read out of engine exceptions.

`CelError` is the one exception the package raises to its callers, for compile and evaluation
failures alike. `Failure` is what library functions, value conversion and source rewrites raise
inside the package; `reason_of` turns whatever the engine raised (its wrapping of a `Failure`
included) into a short, stable reason, in cel-go's wording where there is one. This module only
words errors: it must not compile or evaluate anything.
"""

from __future__ import annotations

import logging
import re
from typing import Final

_SHOWN_EXPRESSION: Final = 200


class CelError(ValueError):
    """A CEL expression that does not compile or fails to evaluate.

    The message names the expression (and, when given, where it comes from) and the reason;
    `expression` holds the full text, `reason` the reason alone.
    """

    def __init__(self, expression: str, reason: str, *, what: str = "") -> None:
        # On one line: the message lands in Status messages, Events and conditions, and
        # expressions written as YAML block scalars span lines.
        shown = " ".join(expression.split())
        if len(shown) > _SHOWN_EXPRESSION:
            shown = shown[:_SHOWN_EXPRESSION] + "..."
        prefix = f"{what}: " if what else ""
        # Quoted without escaping: selectors are full of quotes and the message is for people.
        super().__init__(f'{prefix}CEL expression "{shown}": {reason}')
        self.expression = expression
        self.reason = reason
        self.what = what


class Failure(Exception):
    """Raised by library functions, value conversion and source rewrites.

    The engine wraps one raised by a function it calls; `reason_of` unwraps the message.
    """


# The engine logs a warning for every exception a Python function raises before re-raising it
# as RuntimeError. Those failures reach callers as CelError with the same message, so the
# warning only duplicates them (on a hot path); drop exactly those records.
class _DropCallbackFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Python function '")


logging.getLogger("cel").addFilter(_DropCallbackFailures())


_CALLBACK_FAILURE: Final = re.compile(
    r"Function '[^']*' error: Python function call failed: (?:[\w.]+: )?(.*?)\.? Check function "
    r"arguments and their types\.$",
    re.S,
)
_UNDEFINED: Final = re.compile(r"Undefined variable or function: '([^']*)'")


def reason_of(exc: BaseException) -> str:
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


_PARSE_ERROR: Final = re.compile(r"^ERROR: <input>:(\d+):(\d+): (?:Syntax error: )?(.*)$")


def syntax_reason_of(exc: BaseException) -> str:
    """The reason for a parse error, on one line: each of the engine's "ERROR: " lines with its
    position, without the excerpt and caret lines it draws under them."""
    message = str(exc)
    # The engine names the expression first ("Failed to parse expression '...': "), which
    # may itself span lines; the errors follow.
    at = message.find("ERROR: ")
    errors = [_PARSE_ERROR.sub(r"line \1, column \2: \3", line)
              for line in message[max(at, 0):].splitlines() if line.startswith("ERROR: ")]
    return "syntax error: " + ("; ".join(errors) if errors else " ".join(message.split()))
