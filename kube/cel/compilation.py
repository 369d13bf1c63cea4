"""Compilation: `compile_selector` and `compile_expression`, and what is refused before any
expression is evaluated for real.

The engine only parses at compile time, so compilation here adds what Kubernetes' type-checker
would catch early: a length cap (`MAX_EXPRESSION_LENGTH`, as DRA's 10 KiB), a nesting cap
(`MAX_NESTING_DEPTH`), a static check of every function and variable the expression names, and
a dry run against representative inputs (sample devices, or the sample variables given), which
refuses a non-bool selector, and a cost estimate (`cost`): an expression whose estimated cost
exceeds `COST_LIMIT` (upstream's 1,000,000) is refused with "cost limit exceeded". A selector's
estimate is fixed by the API's limits on a device; a rule expression's depends on the size of
its inputs, so it is estimated on the samples here and, when the largest input the API server
accepts could take it over the limit, again on each evaluation's inputs (`Expression`). A
missing attribute on a sample is not a compile error: it is an evaluation error at match time,
as upstream. Compiled selectors are cached by their text.
The dry runs go through `evaluation`: this module must not run programs itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

import cel as _engine

from dra_gateway.kube.cel import cost
from dra_gateway.kube.cel.errors import CelError, Failure, syntax_reason_of
from dra_gateway.kube.cel.evaluation import Expression, Selector, check_on_samples
from dra_gateway.kube.cel.library import KNOWN_FUNCTIONS
from dra_gateway.kube.cel.source import (
    bound_names,
    mask,
    nesting_depth,
    rewrite_binds,
    rewrite_domains,
)
from dra_gateway.kube.cel.values import type_name

MAX_EXPRESSION_LENGTH: Final = 10240
MAX_NESTING_DEPTH: Final = 32
# The largest input an expression may see: the API server's request size limit (3 MiB), also
# what upstream's estimator assumes of a list without maxItems.
MAX_INPUT_SIZE: Final = 3 * 1024 * 1024


def _estimated(expression: str, variables: Mapping[str, cost.Shape], *, what: str,
               default: cost.Shape = cost.SCALAR) -> tuple[cost.Node, int]:
    """The syntax tree and estimated cost; CelError when it is over the limit."""
    try:
        # Estimated on the source as written (binds rewritten): the domain rewrite only makes
        # a missing domain an empty map, which costs what the plain lookup costs upstream.
        tree = cost.parse(rewrite_binds(expression))
        estimate = cost.estimate(tree, variables, default=default)
    except Failure as exc:
        raise CelError(expression, str(exc), what=what) from None
    reason = cost.over_limit(estimate)
    if reason is not None:
        raise CelError(expression, reason, what=what)
    return tree, estimate


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
    depth = nesting_depth(mask(expression))
    if depth > MAX_NESTING_DEPTH:
        raise CelError(
            expression, f"nested too deeply: {depth} levels, at most {MAX_NESTING_DEPTH}", what=what
        )
    try:
        source = rewrite_binds(expression)
        if device_domains:
            source = rewrite_domains(source)
    except Failure as exc:
        raise CelError(expression, str(exc), what=what) from None
    try:
        program = _engine.compile(source)
    except Exception as exc:  # the engine raises ValueError, or RuntimeError on odd input
        raise CelError(expression, syntax_reason_of(exc), what=what) from None
    unknown_functions = sorted(
        f for f in program.functions() if f[:1] not in "_@!-" and f not in KNOWN_FUNCTIONS
    )
    if unknown_functions:
        listed = ", ".join(f"'{f}'" for f in unknown_functions)
        raise CelError(expression, f"undeclared function {listed}", what=what)
    allowed = set(declared) | bound_names(mask(source))
    unknown_variables = sorted(v for v in program.variables() if v not in allowed)
    if unknown_variables:
        listed = ", ".join(f"'{v}'" for v in unknown_variables)
        raise CelError(expression, f"undeclared reference to {listed}", what=what)
    return program


@lru_cache(maxsize=1024)
def compile_selector(expression: str) -> Selector:
    """Compile a DRA device selector; raises CelError for what can be known before matching.

    Refused: syntax errors, an expression over MAX_EXPRESSION_LENGTH or nested over
    MAX_NESTING_DEPTH, unknown functions or variables, an estimated cost over COST_LIMIT, and a
    result that is not a bool on a sample device. Errors that depend on the device (a missing
    attribute) surface in `matches`.
    """
    program = _prepare(expression, ("device",), what="", device_domains=True)
    _, estimate = _estimated(expression, {"device": cost.DEVICE_SHAPE}, what="")
    check_on_samples(expression, program)
    return Selector(expression, program, cost=estimate)


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
    index is a compile error, and so is a result that is not an instance of `expect`, and an
    estimated cost over COST_LIMIT for inputs the size of the samples.
    """
    program = _prepare(expression, variables.keys(), what=what, device_domains=False)
    samples = {name: cost.shape_of(cost.depth_sizes(value)) for name, value in variables.items()}
    tree, _ = _estimated(expression, samples, what=what)
    worst = cost.estimate(tree, dict.fromkeys(variables, cost.Unbounded(MAX_INPUT_SIZE)))
    # Bounded whatever the input: evaluations skip measuring theirs.
    sized = None if worst <= cost.COST_LIMIT else tree
    compiled = Expression(expression, program, frozenset(variables), what, cost_tree=sized)
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
                expression, f"must evaluate to {names_}, got {type_name(result)}", what=what
            )
    return compiled


def _as_tuple(expect: type | tuple[type, ...] | None) -> tuple[type, ...]:
    if expect is None:
        return ()
    return expect if isinstance(expect, tuple) else (expect,)
