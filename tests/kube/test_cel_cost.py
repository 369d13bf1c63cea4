"""Every CEL evaluation has a cost bound: upstream's 1,000,000 per expression, and a budget for
a series of evaluations (one pod's planning), counted in estimated cost units, not time."""

from __future__ import annotations

import pytest

from dra_gateway.kube import cel, names
from dra_gateway.kube.cel import COST_LIMIT, CelError, CostBudgetExceeded, cost_budget

FORTY = ",".join(str(i) for i in range(40))
# The attack: nested all/exists over a bound 40-element list; upstream's estimator
# accepts it (about 650k of 1M) and each evaluation ran 17 ms here.
ATTACK = f"cel.bind(l, [{FORTY}], l.all(a, l.all(b, l.exists(c, a * b * c == 7919))))"


def match_all(selectors: list[cel.Selector], views: list[cel.DeviceView]) -> None:
    for selector in selectors:
        for view in views:
            selector.matches(view)


def devices(count: int) -> list[cel.DeviceView]:
    return [cel.device_view(names.DRIVER, {"name": f"gpu-{i}", "attributes": {
        names.ATTR_TYPE: {"string": "gpu"}, names.ATTR_INDEX: {"int": i}}})
        for i in range(count)]


def test_a_selector_under_the_limit_compiles_with_its_estimated_cost() -> None:
    selector = cel.compile_selector(ATTACK)
    assert 500_000 < selector.cost < COST_LIMIT  # the same order as upstream's ~650k


def test_plain_selectors_cost_little() -> None:
    selector = cel.compile_selector(
        'device.driver == "gpu.dra-gateway.io" && device.attributes["gpu.dra-gateway.io"]'
        '.type == "gpu"')
    assert selector.cost < 200


def test_one_more_level_of_nesting_is_refused_with_upstreams_words_and_the_limit() -> None:
    deeper = (f"cel.bind(l, [{FORTY}], l.all(a, l.all(b, l.all(c, l.exists(d, "
              "a * b * c * d == 7919)))))")
    with pytest.raises(CelError) as caught:
        cel.compile_selector(deeper)
    assert caught.value.reason.startswith("cost limit exceeded: estimated cost ")
    assert "exceeds the limit of 1000000" in caught.value.reason


def test_lists_grown_inside_the_expression_count_at_their_grown_size() -> None:
    grown = (f"cel.bind(l, [{FORTY}].map(x, [{FORTY}]), "
             "l.all(a, a.all(b, l.all(c, c.exists(d, b == d)))))")
    with pytest.raises(CelError, match="cost limit exceeded"):
        cel.compile_selector(grown)
    split = 'cel.bind(s, "' + "a," * 600 + '".split(","), s.all(x, s.all(y, x == y)))'
    with pytest.raises(CelError, match="cost limit exceeded"):
        cel.compile_selector(split)


def test_a_budget_stops_a_series_of_evaluations_at_the_first_that_would_overspend() -> None:
    views = devices(80)  # 10 nodes x 8 GPUs, as in the issue
    selector = cel.compile_selector(ATTACK)
    with cost_budget(10 * COST_LIMIT) as budget, pytest.raises(CostBudgetExceeded) as caught:
        match_all([selector], views)
    evaluated = 10 * COST_LIMIT // selector.cost
    assert budget.spent == evaluated * selector.cost
    assert sum(1 for v in views if v._verdicts) == evaluated  # 17 of 80 devices, then refused
    assert str(caught.value).startswith(
        f"CEL cost budget exceeded: evaluating the selectors would cost more than "
        f"{10 * COST_LIMIT} (at least {(evaluated + 1) * selector.cost})")


def test_varying_a_constant_does_not_escape_the_budget() -> None:
    views = devices(8)
    selectors = [cel.compile_selector(ATTACK.replace("7919", str(c))) for c in range(100)]
    with cost_budget(3 * COST_LIMIT) as budget, pytest.raises(CostBudgetExceeded):
        match_all(selectors, views)
    assert budget.spent <= 3 * COST_LIMIT


def test_cached_verdicts_cost_nothing_and_no_budget_means_none_is_charged() -> None:
    (view,) = devices(1)
    selector = cel.compile_selector('device.attributes["gpu.dra-gateway.io"].index >= 0')
    assert selector.matches(view)
    with cost_budget(1) as budget:
        assert selector.matches(view)
    assert budget.spent == 0


def test_a_rule_expression_is_refused_on_inputs_that_would_take_it_over_the_limit() -> None:
    expression = cel.compile_expression("xs.all(a, xs.all(b, xs.exists(c, a == b + c)))",
                                        variables={"xs": [1, 2, 3]}, what="rules[0].match")
    assert expression.evaluate({"xs": [1, 2, 3]}) is False
    with pytest.raises(CelError) as caught:
        expression.evaluate({"xs": list(range(200))})
    assert str(caught.value).startswith("rules[0].match: CEL expression")
    assert caught.value.reason.startswith("cost limit exceeded: estimated cost ")
    assert caught.value.reason.endswith("for inputs of up to 200 elements")


def test_a_rule_expression_over_the_limit_on_its_samples_does_not_compile() -> None:
    with pytest.raises(CelError, match="cost limit exceeded"):
        cel.compile_expression("xs.all(a, xs.all(b, xs.all(c, a != b + c)))",
                               variables={"xs": list(range(200))}, what="rules[0].match")


def test_sizes_are_measured_per_depth_so_a_long_inner_list_does_not_lengthen_the_outer() -> None:
    expression = cel.compile_expression(
        "pod.containers.all(c, pod.containers.exists(d, c.name == d.name))",
        variables={"pod": {"containers": [{"name": "a", "env": []}]}}, what="match")
    long_env = [{"name": f"V{i}", "value": "x" * 200} for i in range(2000)]
    few = {"containers": [{"name": str(i), "env": long_env} for i in range(3)]}
    assert expression.evaluate({"pod": few}) is True
    many = {"containers": [{"name": str(i), "env": []} for i in range(1000)]}
    with pytest.raises(CelError, match="cost limit exceeded"):
        expression.evaluate({"pod": many})
