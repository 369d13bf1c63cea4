"""Kubernetes CEL: compile once, evaluate many times, with Kubernetes' names and meanings.

One place for the two kinds of CEL the project runs:

- DRA device selectors (`compile_selector`, `device_view`, `Selector.matches`): the `device`
  variable has the shape the scheduler gives it (`driver`, `attributes` and `capacity` grouped
  by domain, `allowMultipleAllocations`), an evaluation error such as a missing attribute aborts
  the match with a `CelError` (it is not "no match"), and the result must be a bool;
- rule and admission-style expressions (`compile_expression`, `Expression.evaluate`) over
  variables the caller declares (`pod`, `container`, ...), returning plain Python values.

Engine: the `common-expression-language` package (Rust core). It only parses at compile time, so
compilation adds what Kubernetes' type-checker would catch early (caps, a static check of names,
a dry run on representative inputs; see `compilation`).

Supported subset, with Kubernetes' names and semantics:

- CEL core as the engine has it: operators, `has()`, `in`, `all/exists/exists_one/map/filter`,
  `size`, `contains`, `startsWith`, `endsWith`, `matches`, `int/uint/double/bytes/dyn/type`,
  `timestamp/duration`, `string(x)` (a double is written the engine's way: `string(1e6)` is
  "1000000" where cel-go writes "1e+06");
- `cel.bind(name, value, expr)`, rewritten before compiling into a one-element comprehension
  (`[value].map(name, expr)[0]`), which binds and evaluates `value` once, as `cel.bind` does;
- quantity library: `quantity(s)`, `isQuantity(s)`, `q.sign()`, `q.isInteger()`,
  `q.asInteger()`, `q.asApproximateFloat()`, `q.add(q|int)`, `q.sub(q|int)`, `q.compareTo(q)`,
  `q.isGreaterThan(q)`, `q.isLessThan(q)`; comparisons are exact across suffixes
  ("40Gi" vs "42949672960"). `isInteger`/`asInteger` follow the documented meaning (an exact
  int64) and `asApproximateFloat` is the nearest double; upstream's answers depend on the
  internal form a quantity was parsed into, so it also answers false for some integral values
  (`quantity("1000m")`, `quantity("1.0")`, `quantity("1.5Gi")`) and computes some floats a bit
  off (`quantity("0.3")` is 0.30000000000000004 there). `sign` is accepted in both spellings;
  upstream declares only the global `sign(q)`, so `q.sign()` does not compile there;
- semver library: `semver(s)`, `semver(s, true)`, `isSemver(s[, bool])`, `.major()`,
  `.minor()`, `.patch()`, `.compareTo()`, `.isGreaterThan()`, `.isLessThan()`;
- string extensions: `lowerAscii`, `upperAscii`, `split(sep[, n])`, `join([sep])`, `trim`,
  `replace(old, new[, n])`, `indexOf(sub[, offset])` (also on lists), `lastIndexOf`,
  `substring(start[, end])`, `charAt(i)`.

No type checker: what upstream's checker refuses at compile because the static types do not
fit (`quantity(1)`, `q < quantity("1")`, `device.unknownField`) is refused here when the selector
is matched, and an `==` between mismatched static types (`device.driver == 1`) is false here.
tests/kube/test_oracle.py compares all of this against the upstream Go code.

Not supported (refused at compile as unknown functions): the URL, IP/CIDR, regex-extract,
format, sets and two-variable comprehension libraries, optional syntax (`.?`), and the
quantity `mul`/`div` additions of recent releases.

Cost: the engine has no cost model and cannot be interrupted, so every expression's cost is
estimated before it runs (`cost`, in cel-go's units) and refused over upstream's per-expression
limit of 1,000,000 ("cost limit exceeded"): selectors at compile, rule expressions whose cost
grows with their inputs also on each evaluation's inputs. `cost_budget(limit)` bounds what a
series of selector evaluations may cost together (one pod's planning): over it,
`CostBudgetExceeded`.

Where things are: `compilation` (the compile functions and their checks), `cost` (the estimate),
`evaluation` (every run of a program on the engine, and the budget), `devices` (the `device`
variable and the sample devices), `library` (the functions beyond CEL core), `values`
(quantities and versions as the engine carries them), `source` (literal masking, nesting and
rewrites), `errors` (`CelError` and the reasons read out of engine exceptions). Import from this
package, not from those modules. No part of it may reach the cluster or do I/O.
"""

from dra_gateway.kube.cel.compilation import (
    MAX_EXPRESSION_LENGTH,
    MAX_INPUT_SIZE,
    MAX_NESTING_DEPTH,
    compile_expression,
    compile_selector,
)
from dra_gateway.kube.cel.cost import COST_LIMIT
from dra_gateway.kube.cel.devices import DeviceView, device_view
from dra_gateway.kube.cel.errors import CelError
from dra_gateway.kube.cel.evaluation import (
    CostBudget,
    CostBudgetExceeded,
    Expression,
    Selector,
    cost_budget,
)
from dra_gateway.kube.cel.values import QUANTITY_KEY, SEMVER_KEY, quantity_value, semver_value

__all__ = [
    "COST_LIMIT",
    "MAX_EXPRESSION_LENGTH",
    "MAX_INPUT_SIZE",
    "MAX_NESTING_DEPTH",
    "QUANTITY_KEY",
    "SEMVER_KEY",
    "CelError",
    "CostBudget",
    "CostBudgetExceeded",
    "DeviceView",
    "Expression",
    "Selector",
    "compile_expression",
    "compile_selector",
    "cost_budget",
    "device_view",
    "quantity_value",
    "semver_value",
]
