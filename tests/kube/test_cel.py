"""Kubernetes CEL: the table mirrors dra-api-facts.md §2, then the libraries and the errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.kube.cel import (
    MAX_EXPRESSION_LENGTH,
    MAX_NESTING_DEPTH,
    CelError,
    DeviceView,
    compile_expression,
    compile_selector,
    device_view,
)
from dra_gateway.kube.quantity import Quantity
from dra_gateway.kube.semver import Semver

NVIDIA = "gpu.nvidia.com"


def nvidia_gpu(**overrides: Any) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "550.54.15"},
            "index": {"int": 0},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    device.update(overrides)
    return device


def nvidia_mig() -> dict[str, Any]:
    return {
        "name": "gpu-0-mig-1g10gb-0",
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": "1g.10gb"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "cudaComputeCapability": {"version": "9.0.0"},
        },
        "capacity": {"memory": {"value": "10Gi"}},
    }


@pytest.fixture
def gpu() -> DeviceView:
    return device_view(NVIDIA, nvidia_gpu())


@pytest.fixture
def mig() -> DeviceView:
    return device_view(NVIDIA, nvidia_mig())


A100 = nvidia_gpu(
    name="gpu-1",
    attributes={
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"},
    },
    capacity={"memory": {"value": "40Gi"}},
)
T4 = nvidia_gpu(
    name="gpu-2",
    attributes={
        "type": {"string": "gpu"},
        "productName": {"string": "Tesla T4"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Turing"},
        "cudaComputeCapability": {"version": "7.5.0"},
    },
    capacity={"memory": {"value": "16Gi"}},
)

# dra-api-facts.md §2 examples: expression, verdict on H100, A100, T4, MIG 1g.10gb
FACTS_TABLE: list[tuple[str, tuple[bool, bool, bool, bool]]] = [
    (
        'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu"',
        (True, True, True, False),
    ),
    (
        'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"',
        (True, False, False, True),
    ),
    (
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
        (True, True, False, False),
    ),
    (
        'device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
        (True, True, False, True),
    ),
    (
        'device.attributes["gpu.nvidia.com"].type == "mig" && '
        'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',
        (False, False, False, True),
    ),
    (
        'has(device.attributes["gpu.nvidia.com"].profile) && '
        'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"',
        (False, False, False, True),
    ),
    (
        'cel.bind(g, device.attributes["gpu.nvidia.com"], '
        'has(g.brand) && g.brand == "Nvidia" && g.architecture == "Hopper")',
        (True, False, False, False),
    ),
]


@pytest.mark.parametrize(("expression", "verdicts"), FACTS_TABLE)
def test_the_reference_selectors_match_as_the_scheduler_would(
    expression: str, verdicts: tuple[bool, bool, bool, bool]
) -> None:
    selector = compile_selector(expression)
    devices = [nvidia_gpu(), A100, T4, nvidia_mig()]
    got = tuple(selector.matches(device_view(NVIDIA, d)) for d in devices)
    assert got == verdicts


def test_a_missing_attribute_is_an_error_at_match_time_not_at_compile(gpu: DeviceView) -> None:
    selector = compile_selector('device.attributes["gpu.nvidia.com"].profile == "1g.10gb"')
    with pytest.raises(CelError) as caught:
        selector.matches(gpu)
    assert str(caught.value) == (
        'CEL expression "device.attributes["gpu.nvidia.com"].profile == "1g.10gb"": '
        "no such key: profile"
    )
    assert caught.value.expression == 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    assert caught.value.reason == "no such key: profile"


def test_an_error_is_cached_with_the_verdicts_and_raised_every_time(gpu: DeviceView) -> None:
    selector = compile_selector('device.attributes["gpu.nvidia.com"].missing')
    for _ in range(2):
        with pytest.raises(CelError, match="no such key: missing"):
            selector.matches(gpu)


def test_verdicts_are_cached_per_device_view(gpu: DeviceView) -> None:
    selector = compile_selector('device.attributes["gpu.nvidia.com"].index == 0')
    assert selector.matches(gpu) is True
    assert gpu._verdicts[selector.expression] is True
    assert selector.matches(gpu) is True


def test_compiling_the_same_selector_twice_reuses_it() -> None:
    expression = 'device.driver == "gpu.example.com"'
    assert compile_selector(expression) is compile_selector(expression)


# --- the device variable ------------------------------------------------------------------------


def test_names_are_grouped_by_domain(gpu: DeviceView) -> None:
    assert compile_selector(
        'device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:3a"'
    ).matches(gpu)
    assert compile_selector(
        '!("resource.kubernetes.io/pcieRoot" in device.attributes["gpu.nvidia.com"])'
    ).matches(gpu)
    assert gpu.value["attributes"]["resource.kubernetes.io"] == {"pcieRoot": "pci0000:3a"}


def test_an_unknown_domain_is_an_empty_map(gpu: DeviceView) -> None:
    assert compile_selector('!has(device.attributes["amd.com"].productName)').matches(gpu)
    assert compile_selector('!("memory" in device.capacity["amd.com"])').matches(gpu)
    assert compile_selector('size(device.attributes["amd.com"]) == 0').matches(gpu)
    with pytest.raises(CelError, match="no such key: productName"):
        compile_selector('device.attributes["amd.com"].productName == "MI300X"').matches(gpu)


def test_a_domain_mentioned_only_inside_a_string_is_left_alone(gpu: DeviceView) -> None:
    selector = compile_selector(
        'device.driver != \'device.attributes["x.io"]\' && device.attributes["gpu.nvidia.com"]'
        '.type == "gpu"'
    )
    assert selector.matches(gpu)


def test_allow_multiple_allocations_defaults_to_false() -> None:
    selector = compile_selector("device.allowMultipleAllocations")
    assert not selector.matches(device_view(NVIDIA, nvidia_gpu()))
    assert selector.matches(device_view(NVIDIA, nvidia_gpu(allowMultipleAllocations=True)))


def test_a_device_with_an_invalid_version_is_refused_by_name() -> None:
    bad = nvidia_gpu(attributes={"driverVersion": {"version": "550.54"}})
    with pytest.raises(
        ValueError, match=r"device attribute 'driverVersion' of driver 'gpu\.nvidia"
    ):
        device_view(NVIDIA, bad)


def test_a_device_attribute_with_two_values_is_refused() -> None:
    bad = nvidia_gpu(attributes={"index": {"int": 1, "string": "1"}})
    with pytest.raises(ValueError, match="expected exactly one of int, bool, string, version"):
        device_view(NVIDIA, bad)


# --- quantity library ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("40Gi").compareTo(quantity("42949672960")) == 0',
        'quantity("40Gi") == quantity("42949672960")',
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("50Mi").compareTo(quantity("50M")) == 1',
        'quantity("150Mi").isGreaterThan(quantity("100Mi"))',
        '!quantity("50Mi").isGreaterThan(quantity("100Mi"))',
        'quantity("50M").isLessThan(quantity("100M"))',
        '!quantity("100M").isLessThan(quantity("50M"))',
        'quantity("50k").add(quantity("20k")) == quantity("70k")',
        'quantity("50k").add(20) == quantity("50020")',
        'quantity("50k").sub(quantity("20k")) == quantity("30k")',
        'quantity("50k").sub(20000) == quantity("30k")',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")',
        'quantity("50k").sub(20000).asApproximateFloat() == 30000.0',
        'quantity("50k").asInteger() == 50000',
        'quantity("50000000G").isInteger()',
        '!quantity("9999999999999999999999999999999999999G").isInteger()',
        '!quantity("1500m").isInteger()',
        'quantity("-3").sign() == -1 && quantity("0").sign() == 0 && quantity("1m").sign() == 1',
        'isQuantity("1.3Gi") && isQuantity("10000k")',
        '!isQuantity("200K") && !isQuantity("Three") && !isQuantity("1,3G")',
        'quantity("0.1").add(quantity("0.2")) == quantity("300m")',
    ],
)
def test_quantity_library_follows_kubernetes(expression: str) -> None:
    assert compile_expression(expression, variables={}, what="test").evaluate({}) is True


def test_as_integer_refuses_a_fraction() -> None:
    expression = compile_expression("quantity(s).asInteger()", variables={"s": "2"}, what="x")
    assert expression.evaluate({"s": "3k"}) == 3000
    with pytest.raises(CelError, match="cannot convert value to integer"):
        expression.evaluate({"s": "1500m"})


def test_a_rule_failing_on_its_sample_fails_at_compile() -> None:
    with pytest.raises(CelError, match=r'^r: CEL expression "quantity\("1500m"\)\.asInteger\(\)"'):
        compile_expression('quantity("1500m").asInteger()', variables={}, what="r")


def test_an_invalid_quantity_fails_with_its_parse_message(gpu: DeviceView) -> None:
    selector = compile_selector(
        'device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("4Gb"))'
    )
    with pytest.raises(CelError) as caught:
        selector.matches(gpu)
    assert caught.value.reason.startswith('invalid quantity "4Gb": unknown suffix "Gb"')


def test_ordering_operators_on_quantities_are_errors_as_in_kubernetes(gpu: DeviceView) -> None:
    selector = compile_selector('device.capacity["gpu.nvidia.com"].memory > quantity("1Gi")')
    with pytest.raises(CelError, match="No such overload"):
        selector.matches(gpu)


def test_comparing_a_quantity_with_a_version_is_no_overload() -> None:
    with pytest.raises(CelError) as caught:
        compile_expression('quantity("1").compareTo(semver("1.0.0"))', variables={}, what="x")
    assert caught.value.reason == (
        "found no matching overload for 'compareTo' applied to (quantity, semver)"
    )


def test_capacity_compares_exactly_across_suffixes() -> None:
    view = device_view("x.example.com", {"name": "d", "capacity": {"mem": {"value": "40Gi"}}})
    assert compile_selector(
        'device.capacity["x.example.com"].mem.compareTo(quantity("42949672960")) == 0'
    ).matches(view)
    assert compile_selector(
        'device.capacity["x.example.com"].mem.isGreaterThan(quantity("42949672959"))'
    ).matches(view)
    assert compile_selector(
        'device.capacity["x.example.com"].mem.isLessThan(quantity("40.0000001Gi"))'
    ).matches(view)


# --- semver library -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'semver("1.2.3").compareTo(semver("1.2.3")) == 0',
        'semver("1.2.3").compareTo(semver("2.0.0")) == -1',
        'semver("1.2.3").compareTo(semver("0.1.2")) == 1',
        'semver("1.10.0").isGreaterThan(semver("1.9.0"))',
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0"))',
        'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))',
        'semver("1.0.0+build.1") == semver("1.0.0+build.2")',
        'semver("v1.0", true) == semver("1.0.0")',
        'semver("01.01.01", true) == semver("1.1.1")',
        'semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && '
        'semver("1.2.3").patch() == 3',
        'isSemver("1.0.0") && !isSemver("hello") && !isSemver("v1.0") && isSemver("v1.0", true)',
    ],
)
def test_semver_library_follows_kubernetes(expression: str) -> None:
    assert compile_expression(expression, variables={}, what="test").evaluate({}) is True


def test_an_invalid_version_fails_with_its_parse_message() -> None:
    expression = compile_expression("semver(v)", variables={"v": "1.0.0"}, what="x")
    with pytest.raises(
        CelError, match=r'invalid semantic version "1\.0": expected MAJOR\.MINOR\.PATCH'
    ):
        expression.evaluate({"v": "1.0"})


def test_version_attributes_compare_as_versions(gpu: DeviceView) -> None:
    # As strings "550.54.15" < "6.0.0"; as versions it is greater.
    assert compile_selector(
        'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("6.0.0"))'
    ).matches(gpu)


# --- strings, bind, misc ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('"NVIDIA H100".lowerAscii()', "nvidia h100"),
        ('"Ünicode h100".upperAscii()', "ÜNICODE H100"),
        ('"a,b,c".split(",")', ["a", "b", "c"]),
        ('"a,b,c".split(",", 2)', ["a", "b,c"]),
        ('"a,b,c".split(",", 0)', []),
        ('["a", "b"].join("-")', "a-b"),
        ('["a", "b"].join()', "ab"),
        ('"  x \\t".trim()', "x"),
        ('"aaa".replace("a", "b")', "bbb"),
        ('"aaa".replace("a", "b", 2)', "bba"),
        ('"hello".indexOf("l")', 2),
        ('"hello".indexOf("l", 3)', 3),
        ('"hello".indexOf("z")', -1),
        ('"hello".lastIndexOf("l")', 3),
        ("[1, 2, 3].indexOf(2)", 1),
        ('"hello".substring(1, 3)', "el"),
        ('"hello".charAt(1)', "e"),
        ('"a".contains("a") && "ab".startsWith("a") && "ab".endsWith("b")', True),
        ('"1g.10gb".matches("^[0-9]+g\\\\.[0-9]+gb$")', True),
        ("size([1, 2]) + size('abc')", 5),
        ("string(true) + string(1)", "true1"),
        ("cel.bind(x, 1, cel.bind(y, x + 1, [x, y]))", [1, 2]),
        ("cel.bind(s, 'cel.bind(', s + s)", "cel.bind(cel.bind("),
        ("[1, 2, 3].filter(n, n > 1).map(n, n * 10)", [20, 30]),
        ('{"a": quantity("1Ki")}', {"a": Quantity.parse("1Ki")}),
        ('semver("1.2.3-rc.1+b")', Semver.parse("1.2.3-rc.1")),
    ],
)
def test_expressions_evaluate_to_plain_values(expression: str, expected: Any) -> None:
    result = compile_expression(expression, variables={}, what="test").evaluate({})
    assert result == expected
    assert type(result) is type(expected)


def test_string_index_errors_name_the_index() -> None:
    expression = compile_expression('"abc".substring(2, n)', variables={"n": 3}, what="x")
    with pytest.raises(CelError, match=r"substring: index out of range: 2\.\.9 of 3"):
        expression.evaluate({"n": 9})


def test_variables_and_quantities_cross_into_rules() -> None:
    sample = {"container": {"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "1024"}}}}
    expression = compile_expression(
        'quantity(container.resources.limits["nvidia.com/gpumem"] + "Mi")',
        variables=sample,
        what="rules[0].memory",
    )
    result = expression.evaluate(
        {"container": {"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "2048"}}}}
    )
    assert result == Quantity.parse("2Gi")
    limit = compile_expression(
        "request.isLessThan(limit)",
        variables={"request": Quantity.parse("1Gi"), "limit": Quantity.parse("2Gi")},
        what="r",
    )
    assert limit.evaluate({"request": Quantity.parse("1Gi"), "limit": Quantity.parse("2Gi")})


# --- compile-time refusals ----------------------------------------------------------------------


def test_an_unknown_function_fails_at_compile() -> None:
    with pytest.raises(CelError) as caught:
        compile_selector('device.attributes["gpu.nvidia.com"].productName.toLower() == "h100"')
    assert caught.value.reason == "undeclared function 'toLower'"


def test_an_unknown_function_in_a_branch_never_taken_still_fails_at_compile() -> None:
    with pytest.raises(CelError, match="undeclared function 'frobnicate'"):
        compile_selector("false && frobnicate(device)")


def test_an_unknown_variable_fails_at_compile_with_where_it_comes_from() -> None:
    with pytest.raises(CelError) as caught:
        compile_expression("pod.metadata.name == ''", variables={"container": {}}, what="rules[2]")
    assert str(caught.value) == (
        "rules[2]: CEL expression \"pod.metadata.name == ''\": undeclared reference to 'pod'"
    )


def test_comprehension_variables_are_not_unknown() -> None:
    compile_selector(
        'device.attributes["gpu.nvidia.com"].productName.split(" ").exists(w, w == "H100")'
    )


def test_a_syntax_error_fails_at_compile() -> None:
    with pytest.raises(CelError, match=r'CEL expression "device.driver ==": syntax error: '):
        compile_selector("device.driver ==")


def test_a_syntax_error_is_one_line_naming_each_position() -> None:
    # The engine draws the expression and a caret under each error on lines of their own;
    # rule load errors, Events and Status messages carry one line (found by the rules fuzz
    # target). An expression written as a YAML block scalar is shown on one line too.
    with pytest.raises(CelError) as caught:
        compile_selector('device.driver ==\n  "x" +')
    assert str(caught.value) == (
        'CEL expression "device.driver == "x" +": syntax error: line 2, column 8: mismatched '
        "input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', "
        "NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}")


def test_a_too_long_expression_fails_at_compile() -> None:
    expression = " || ".join(['device.driver == "x"'] * 600)
    assert len(expression) > MAX_EXPRESSION_LENGTH
    with pytest.raises(CelError) as caught:
        compile_selector(expression)
    assert caught.value.reason == f"too long: {len(expression)} characters, at most 10240"
    assert len(str(caught.value)) < 400


def test_deep_nesting_fails_at_compile() -> None:
    depth = MAX_NESTING_DEPTH + 1
    with pytest.raises(CelError, match=f"nested too deeply: {depth} levels"):
        compile_selector("(" * depth + "true" + ")" * depth)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    compile_selector('device.driver != "' + "(" * 100 + '"')


def test_a_non_bool_selector_fails_at_compile() -> None:
    with pytest.raises(CelError) as caught:
        compile_selector('device.attributes["gpu.nvidia.com"].productName')
    assert caught.value.reason == "must evaluate to bool, got string"


def test_a_selector_that_is_not_bool_on_a_real_device_fails_at_match() -> None:
    selector = compile_selector('device.attributes["x.example.com"].flag')
    view = device_view("x.example.com", {"name": "d", "attributes": {"flag": {"int": 1}}})
    with pytest.raises(CelError, match="must evaluate to bool, got int"):
        selector.matches(view)


def test_a_bad_bind_fails_at_compile() -> None:
    with pytest.raises(CelError, match=r"cel\.bind takes 3 arguments"):
        compile_selector("cel.bind(x, true)")
    with pytest.raises(CelError, match=r"cel\.bind needs a variable name"):
        compile_selector("cel.bind(1, true, true)")


def test_a_rule_with_a_type_error_on_its_sample_fails_at_compile() -> None:
    with pytest.raises(
        CelError, match=r"^rules\[1\]\.match: .*Unsupported operation: string \+ int"
    ):
        compile_expression(
            "container.name + 1 == 2", variables={"container": {"name": "c"}}, what="rules[1].match"
        )


def test_a_rule_result_of_the_wrong_type_fails_at_compile() -> None:
    with pytest.raises(CelError, match="must evaluate to bool, got int"):
        compile_expression("1", variables={}, what="rules[0].match", expect=bool)
    with pytest.raises(CelError, match="must evaluate to int, got bool"):
        compile_expression("true", variables={}, what="rules[0].count", expect=int)
    assert compile_expression("2", variables={}, what="r", expect=int).evaluate({}) == 2


def test_evaluating_without_a_declared_variable_is_refused() -> None:
    expression = compile_expression("x > 1", variables={"x": 2}, what="r")
    with pytest.raises(CelError, match=r"no value for variable\(s\) x"):
        expression.evaluate({})


def test_engine_warnings_for_failed_functions_are_not_logged(
    caplog: pytest.LogCaptureFixture, gpu: DeviceView
) -> None:
    selector = compile_selector('quantity("nope").sign() == 1')
    with caplog.at_level(logging.DEBUG), pytest.raises(CelError):
        selector.matches(gpu)
    assert [r for r in caplog.records if r.name == "cel"] == []


def test_the_samples_use_the_gateway_names() -> None:
    view = device_view(
        names.DRIVER, {"name": "d", "attributes": {names.ATTR_TYPE: {"string": "gpu"}}}
    )
    assert compile_selector(
        f'device.attributes["{names.DRIVER}"].{names.ATTR_TYPE} == "gpu"'
    ).matches(view)


def test_an_integer_beyond_64_bits_is_refused_not_rounded() -> None:
    expression = compile_expression("n + 1", variables={"n": 1}, what="r")
    with pytest.raises(CelError, match=r"integer 18446744073709551616 does not fit in a CEL int"):
        expression.evaluate({"n": 2**64})


def test_a_null_variable_resolves_to_null() -> None:
    expression = compile_expression("x == null", variables={"x": None}, what="r")
    assert expression.evaluate({"x": None}) is True
    assert expression.evaluate({"x": 1}) is False


def test_an_expression_evaluates_each_activation_on_its_own() -> None:
    expression = compile_expression("a + b", variables={"a": 1, "b": 2}, what="r")
    assert [expression.evaluate({"a": i, "b": 10}) for i in range(3)] == [10, 11, 12]
    with pytest.raises(CelError, match="No such overload"):
        expression.evaluate({"a": 1, "b": "x"})
    assert expression.evaluate({"a": 5, "b": 5}) == 10
