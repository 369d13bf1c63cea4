"""A rule's expressions evaluated for one container, and the device request its outputs make.

`evaluate` and `evaluate_all` (one batched evaluation) run a rule's CEL on a container's
activation and refuse, naming the expression that failed, when it cannot be computed. The
device outputs are checked (`checked_outputs`: a count a claim can hold, shares of at most a
card), the selectors whose conditions hold are rendered (`rendered_selectors`), and they become
the device request's `exactly` part and, on the gateway's classes, the claim's GpuShareConfig
(`gateway_config`). `containers.py` chooses the rule, builds the activation and assembles the
container's plan from these.

Pure: no I/O, no logging. Each output's checks stay beside the code that reads it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, Final

from pydantic import ValidationError

from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError, Expression
from dra_gateway.kube.models import ENFORCEMENTS, STRATEGIES, GpuShareConfig
from dra_gateway.kube.quantity import Quantity
from dra_gateway.translator.compiling import DEVICE_OUTPUTS
from dra_gateway.translator.errors import (
    Refused,
    format_path,
    pydantic_message,
    quote,
    refuse,
)
from dra_gateway.translator.rules import CompiledRule, render_selector, selector_values

__all__ = [
    "MAX_DEVICES_PER_CLAIM",
    "Outputs",
    "Subject",
    "checked_outputs",
    "evaluate",
    "evaluate_all",
    "exactly",
    "gateway_config",
    "rendered_selectors",
]

# resource.k8s.io/v1 AllocationResult.devices.results holds at most 32 devices: a claim that
# asks for more can never be allocated, by the gateway or by the scheduler.
MAX_DEVICES_PER_CLAIM: Final = 32


@dataclass(frozen=True, slots=True)
class Subject:
    """Whose translation is under way: a refusal or a failed expression names these."""

    rule: CompiledRule
    container: str
    resources: tuple[str, ...]

    def refuse(self, message: str) -> Refused:
        return refuse(message, container=self.container, resource=", ".join(self.resources),
                      rule=self.rule.name)


def evaluate(subject: Subject, what: str, expression: Any,
              activation: dict[str, Any]) -> Any:
    try:
        return expression.evaluate(activation)
    except CelError as exc:
        resources = ", ".join(subject.resources)
        raise subject.refuse(f"{what} could not be computed from {resources}: {exc}") from None


def evaluate_all(subject: Subject, batch: Expression | None,
                  singles: list[tuple[str, Expression | None]],
                  activation: dict[str, Any]) -> list[Any]:
    """Values of `singles` (None where absent) through one batched evaluation.

    On an error the expressions are evaluated one by one so the refusal names the one that
    failed.
    """
    if batch is None:
        return []
    try:
        values = batch.evaluate(activation)
    except CelError:
        for what, expression in singles:
            if expression is not None:
                evaluate(subject, what, expression, activation)
        raise
    if not isinstance(values, list) or len(values) != len(singles):
        raise AssertionError(f"rule {subject.rule.name}: batched expression gave {values!r}")
    return values


def _whole(subject: Subject, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise subject.refuse(f"device.{what} gave {value!r}, not a whole number")
    return value


def _text(subject: Subject, what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise subject.refuse(f"device.{what} gave {value!r}, not a string")
    return value


def rendered_selectors(subject: Subject, enabled: list[Any], activation: dict[str, Any], *,
                       renamed: Mapping[str, str] | None = None) -> list[tuple[int, str]]:
    """The selectors whose conditions hold, rendered, each with its index in the rule; an
    attribute test of an attribute in `renamed` tests the attribute it maps to instead."""
    rule = subject.rule
    out: list[tuple[int, str]] = []
    for index, (selector, on) in enumerate(zip(rule.selectors, enabled, strict=True)):
        if on is not True:
            continue
        if selector.cel is not None:
            out.append((index, selector.cel))
            continue
        value = evaluate(subject, f"device.selectors[{index}].values", selector.values,
                          activation)
        if selector.op == "atLeast":
            if isinstance(value, bool) or not isinstance(value, int):
                raise subject.refuse(f"device.selectors[{index}].values gave {value!r}, not a "
                                     "whole number")
        elif isinstance(value, str):
            value = [value]
        if selector.op != "atLeast" and (
                not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise subject.refuse(f"device.selectors[{index}].values gave {value!r}, not strings")
        if renamed and selector.attribute in renamed:
            selector = replace(selector, attribute=renamed[selector.attribute])
        rendered = render_selector(selector, rule.driver, selector_values(selector, value))
        if rendered is not None:
            out.append((index, rendered))
    return out


@dataclass(frozen=True, slots=True)
class Outputs:
    """A rule's device outputs for one container, checked: per-card amounts and settings."""

    count: int
    memory: int  # bytes per card
    percent: int  # memory as a percent of each card
    cores: int  # percent of each card's compute
    enforcement: str
    policy: str


# The rule's outputs as its output batch lists them (`compiling.DEVICE_OUTPUTS`), worked out
# once: the path that names each one, its expression on a rule, and (position in the batch,
# key) of those giving whole numbers and of those giving text.
_OUTPUT_PATHS: Final = tuple(f"device.{output.key}" for output in DEVICE_OUTPUTS)
_output_expressions: Final = attrgetter(*(output.attribute for output in DEVICE_OUTPUTS))
_WHOLE_OUTPUTS: Final = tuple((index, output.key) for index, output in enumerate(DEVICE_OUTPUTS)
                              if output.gives is int)
_TEXT_OUTPUTS: Final = tuple((index, output.key) for index, output in enumerate(DEVICE_OUTPUTS)
                             if output.gives is str)


def checked_outputs(subject: Subject, activation: dict[str, Any]) -> Outputs:
    rule = subject.rule
    values = evaluate_all(subject, rule.output_batch, list(
        zip(_OUTPUT_PATHS, _output_expressions(rule), strict=True)), activation)
    count, memory, percent, cores = (
        _whole(subject, key, values[index]) for index, key in _WHOLE_OUTPUTS)
    enforcement, policy = (_text(subject, key, values[index]) for index, key in _TEXT_OUTPUTS)
    resource = ", ".join(subject.resources)
    if count < 1:
        raise subject.refuse(f"{resource} gives a device count of {count}; at least 1 is needed")
    if count > MAX_DEVICES_PER_CLAIM:
        raise subject.refuse(
            f"{resource} gives a device count of {count}; a DRA claim holds at most "
            f"{MAX_DEVICES_PER_CLAIM} devices, so it could never be allocated; "
            "split the work over several pods")
    for label, value in (("memory share", percent), ("compute share", cores)):
        if not 0 <= value <= names.CORES_PER_CARD:
            raise subject.refuse(f"{resource} gives a {label} of {value}% of a card; a share "
                                 "is 1 to 100 per card (ask for more cards instead)")
    if memory < 0:
        raise subject.refuse(f"{resource} gives negative memory")
    if memory == 0 and percent in (0, 100) and cores in (0, 100):
        percent = cores = 0  # the whole memory and compute of a card is a whole card
    return Outputs(count=count, memory=memory, percent=percent, cores=cores,
                    enforcement=enforcement, policy=policy)


def exactly(rule: CompiledRule, outputs: Outputs, selectors: list[str]) -> dict[str, Any]:
    """The device request's `exactly` part: class, count, selectors and capacity."""
    exactly: dict[str, Any] = {"deviceClassName": rule.class_name,
                               "allocationMode": "ExactCount", "count": outputs.count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    memory, percent, cores = outputs.memory, outputs.percent, outputs.cores
    capacity: dict[str, str] = {}
    if memory:
        capacity[names.CAPACITY_MEMORY] = str(Quantity.from_bytes(memory))
    if cores:
        capacity[names.CAPACITY_CORES] = str(cores)
    if rule.gateway_class and (memory or percent or cores):
        # A share states every capacity of the card: one it leaves out is consumed at the
        # request policy's default, the whole card, and the share would hold the card alone.
        # The smallest amount accounts for it; the GpuShareConfig (which leaves it out) says
        # what is enforced.
        if not cores:
            capacity[names.CAPACITY_CORES] = "1"
        if not memory and not percent:
            capacity[names.CAPACITY_MEMORY] = str(Quantity.from_bytes(names.MEMORY_STEP))
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return exactly


def gateway_config(subject: Subject, outputs: Outputs, warnings: list[str]) -> dict[str, Any]:
    """The claim's config for the gateway's driver: the GpuShareConfig of the outputs.

    An unknown packing strategy falls back to the cluster default with a warning; an unknown
    enforcement, or a share the config cannot carry, refuses the pod.
    """
    name = subject.container
    enforcement = outputs.enforcement or "none"
    if enforcement not in ENFORCEMENTS:
        raise subject.refuse(f"enforcement {quote(enforcement)} is not one of "
                             f"{', '.join(ENFORCEMENTS)}")
    policy = outputs.policy or None
    if policy is not None and policy not in STRATEGIES:
        warnings.append(f"container {quote(name)}: policy {quote(policy)} is not one of "
                        f"{', '.join(STRATEGIES)}; the cluster default applies")
        policy = None
    try:
        share = GpuShareConfig.model_validate({
            "memory": outputs.memory or None, "memoryPercent": outputs.percent or None,
            "cores": outputs.cores or None, "enforcement": enforcement, "policy": policy})
    except ValidationError as exc:
        # A rule without a refusal for it (both memory and memoryPercent, say) computes
        # from this pod's amounts a share the gateway cannot carry: the pod must change.
        details = "; ".join(
            (f"{format_path(e['loc'])}: " if e["loc"] else "") + pydantic_message(e)
            for e in exc.errors())
        raise subject.refuse(f"the share computed from these amounts is not valid: "
                             f"{details}") from None
    return {"requests": [name],
            "opaque": {"driver": names.DRIVER, "parameters": share.to_parameters()}}


# resource.k8s.io/v1 DeviceRequest.firstAvailable holds at most 8 subrequests.
MAX_SUBREQUESTS: Final = 8


def subrequest_names(items: list[str]) -> list[str]:
    """A DNS label per alternative, from its item (`1g.10gb+me` is `1g-10gb-me`; "" is `any`),
    made unique by a position where two would be alike."""
    out: list[str] = []
    for position, item in enumerate(items):
        label = re.sub(r"[^a-z0-9]+", "-", item.lower()).strip("-")[:50] or "any"
        if label in out:
            label = f"{label}-{position}"
        out.append(label)
    return out
