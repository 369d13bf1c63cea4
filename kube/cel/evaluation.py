"""Evaluation: every run of a compiled program on the engine happens here.

`Selector.matches` is the allocator's hot path: a DRA device selector on a `DeviceView`, its
verdict (or error) cached on the view. An evaluation error such as a missing attribute aborts
the match with a `CelError` (it is not "no match"), and the result must be a bool.
`Expression.evaluate` runs a rule or admission-style expression over the variables its caller
declared and returns plain Python values. `check_on_samples` is compilation's dry run of a
selector on the sample devices.

What an evaluation may cost is bounded here, around the engine's `execute`, which cannot be
interrupted once started: a selector's estimated cost (at most `cost.COST_LIMIT`, checked at
compile) is charged, before it runs, to the `CostBudget` in force (`cost_budget`), and a caller
that evaluates many selectors for one purpose (the allocator planning one pod) sets one so that
a single tenant cannot spend the process's time: over it, `CostBudgetExceeded` is raised and
nothing more is evaluated. A rule expression whose estimate depends on the size of its inputs
is estimated again on each evaluation's inputs and refused, without running, over the limit.
Programs arrive compiled: this module must not parse or check source.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

import cel as _engine

from dra_gateway.kube.cel import cost
from dra_gateway.kube.cel.devices import DeviceView, sample_views
from dra_gateway.kube.cel.errors import CelError, reason_of
from dra_gateway.kube.cel.library import FUNCTIONS
from dra_gateway.kube.cel.values import from_engine, to_engine, type_name

_MISSING_DATA: Final = (KeyError, IndexError)


_SAMPLES_LOCK: Final = threading.Lock()


class CostBudgetExceeded(Exception):
    """The `CostBudget` in force would be overspent by the next evaluation.

    Not a `CelError`: the selector is fine, the caller's budget is spent, so no verdict may be
    cached for it.
    """

    def __init__(self, *, limit: int, spent: int, expression: str) -> None:
        shown = expression if len(expression) <= 80 else expression[:80] + "..."
        super().__init__(
            f"CEL cost budget exceeded: evaluating the selectors would cost more than {limit} "
            f"(at least {spent}); the last was \"{shown}\"")
        self.limit = limit
        self.spent = spent
        self.expression = expression


class CostBudget:
    """What a series of evaluations may cost together, in the units of `cost`."""

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    def charge(self, amount: int, expression: str) -> None:
        """Count `amount`; CostBudgetExceeded (nothing counted) when it would overspend."""
        if self.spent + amount > self.limit:
            raise CostBudgetExceeded(limit=self.limit, spent=self.spent + amount,
                                     expression=expression)
        self.spent += amount


_BUDGET: ContextVar[CostBudget | None] = ContextVar("cel_cost_budget", default=None)


@contextmanager
def cost_budget(limit: int) -> Iterator[CostBudget]:
    """Charge every selector evaluated inside (in this context) to one budget of `limit`.

    Verdicts already cached on a device view cost nothing. A context variable rather than an
    argument: the evaluations happen deep in the planner, which must not carry it through.
    """
    budget = CostBudget(limit)
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


class Selector:
    """A compiled DRA device selector; `matches` is the allocator's hot path.

    `cost` is the estimated cost of one evaluation, charged to the budget in force.
    """

    __slots__ = ("_program", "cost", "expression")

    def __init__(self, expression: str, program: _engine.Program, *, cost: int = 0) -> None:
        self.expression = expression
        self._program = program
        self.cost = cost

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
        budget = _BUDGET.get()
        if budget is not None:
            budget.charge(self.cost, self.expression)
        try:
            result = self._program.execute(device.context())
        except Exception as exc:  # every engine failure becomes the claim's error message
            return reason_of(exc)
        if result is True or result is False:
            return result
        return f"must evaluate to bool, got {type_name(result)}"

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


def check_on_samples(expression: str, program: _engine.Program) -> None:
    """Dry-run a selector's program on the sample devices; CelError for what no device could
    change: a reference to an undeclared variable, or a result that is not a bool.

    Other failures (a missing attribute, a type or overload error) may depend on the device's
    values, so they are left to `Selector.matches`.
    """
    for view in sample_views():
        try:
            # The sample contexts are shared by every compilation; engine contexts are not
            # thread-safe.
            with _SAMPLES_LOCK:
                result = program.execute(view.context())
        except _MISSING_DATA:
            continue
        except RuntimeError as exc:
            reason = reason_of(exc)
            if reason.startswith("undeclared reference"):
                raise CelError(expression, reason) from None
            continue
        except Exception:  # type and overload errors may depend on the device's values
            continue
        if not isinstance(result, bool):
            raise CelError(expression, f"must evaluate to bool, got {type_name(result)}")

class Expression:
    """A compiled rule or admission-style expression over declared variables.

    Safe to share between threads: evaluations of one expression take turns on its engine
    context. `cost_tree`, when given, is the syntax tree of an expression whose cost depends on
    the size of its inputs beyond the limit: each evaluation estimates it on its own inputs.
    """

    __slots__ = ("_context", "_cost_tree", "_costs", "_current", "_lock", "_program",
                 "expression", "variables", "what")

    def __init__(
        self, expression: str, program: _engine.Program, variables: frozenset[str], what: str,
        *, cost_tree: cost.Node | None = None,
    ) -> None:
        self.expression = expression
        self._program = program
        self.variables = variables
        self.what = what
        self._context: _engine.Context | None = None
        self._current: Mapping[str, Any] = {}
        self._lock = threading.Lock()
        self._cost_tree = cost_tree
        # The variables' sizes per depth, each rounded up to a power of two -> cost
        self._costs: dict[tuple[tuple[int, ...], ...], int] = {}

    def _check_cost(self, activation: Mapping[str, Any]) -> None:
        if self._cost_tree is None:
            return
        names = sorted(self.variables)
        measured = [cost.depth_sizes(activation[name]) for name in names]
        bucket = tuple(tuple(1 << max(0, s - 1).bit_length() for s in sizes)
                       for sizes in measured)
        estimate = self._costs.get(bucket)
        if estimate is None:
            estimate = cost.estimate(self._cost_tree, {
                name: cost.shape_of(sizes) for name, sizes in zip(names, bucket, strict=True)})
            if len(self._costs) < 64:
                self._costs[bucket] = estimate
        reason = cost.over_limit(estimate)
        if reason is not None:
            largest = max((max(sizes, default=0) for sizes in measured), default=0)
            raise CelError(self.expression, f"{reason} for inputs of up to {largest} elements",
                           what=self.what)

    def _resolve(self, name: str) -> Any:
        return self._current.get(name)

    def _engine_context(self) -> _engine.Context:
        # One context per expression, its functions wrapped once; the activation of the
        # evaluation in progress is handed over through the resolver. Building a context per
        # evaluation costs about a third more. Declared variables are also added as null so
        # that a variable whose value is null resolves (the resolver's None means "not mine").
        if self._context is None:
            context = _engine.Context(variables=dict.fromkeys(self.variables), functions=FUNCTIONS)
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
        self._check_cost(activation)
        try:
            converted = {name: to_engine(activation[name]) for name in self.variables}
            with self._lock:
                context = self._engine_context()
                self._current = converted
                try:
                    result = self._program.execute(context)
                finally:
                    self._current = {}
        except Exception as exc:  # every engine failure becomes a CelError with its reason
            raise CelError(self.expression, reason_of(exc), what=self.what) from None
        return from_engine(result)

    def __repr__(self) -> str:
        return f"Expression({self.expression!r})"


