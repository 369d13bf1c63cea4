"""A ResourceClaim's spec compiled for planning: requests, alternatives, constraints, configs.

Compiled once per distinct spec (claims made from one template share it) and cached by the
state. A spec the planner cannot read (a bad quantity, a CEL expression that does not compile)
compiles to a demand carrying the error, so that the claim is reported unallocatable with the
message instead of raising. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner.devices import MIB_NANOS, NANO
from dra_gateway.gpu.memory_percent import share_bytes_in_whole_mib
from dra_gateway.kube import names
from dra_gateway.kube.api_rules import capacity_problems
from dra_gateway.kube.cel.devices import IDENTITY_ATTRIBUTES, may_read_identity
from dra_gateway.kube.models import read_share_config
from dra_gateway.kube.quantity import parse_quantity


@dataclass(frozen=True, slots=True)
class Share:
    """A share of one card from GpuShareConfig (and capacity.requests): None means unset."""

    memory: int | None = None  # bytes
    memory_percent: int | None = None
    cores: int | None = None  # percent


@dataclass(slots=True)
class Alternative:
    """One way to satisfy a request: the request itself (`exactly`) or a subrequest."""

    result_name: str  # "req" or "req/sub", as written in results and constraints
    class_name: str
    selectors: tuple[Any, ...]  # compiled CEL selectors
    expressions: tuple[str, ...]
    all_devices: bool  # allocationMode All
    count: int
    tolerations: tuple[Mapping[str, Any], ...]
    capacity: dict[str, int]  # capacity.requests in nanos
    share: Share
    whole: bool  # no amount asked: whole devices, never shared
    admin_access: bool
    identity_sensitive: bool
    # Verdicts of the static match per device content, filled by the search.
    static: dict[tuple[int, object], bool | str] = field(default_factory=dict)


@dataclass(slots=True)
class Request:
    name: str
    alternatives: list[Alternative]


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: frozenset[str]  # empty: every request
    attribute: str  # fully qualified
    distinct: bool

    def applies(self, result_name: str) -> bool:
        if not self.requests:
            return True
        return result_name in self.requests or result_name.split("/", 1)[0] in self.requests


@dataclass(slots=True)
class ClaimDemand:
    requests: list[Request] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    configs: list[Mapping[str, Any]] = field(default_factory=list)
    error: str | None = None
    identity_sensitive: bool = False


def _share_config(configs: Sequence[Mapping[str, Any]], result_name: str) -> Share:
    """The share of a card the GpuShareConfig for a request asks, read as the node plugin reads
    it (`read_share_config`: the configs that apply merged key by key, later entries winning,
    then validated), so that a claim the plugin would refuse is refused here, naming why."""
    try:
        config = read_share_config(configs, result_name)
    except ValueError as exc:
        raise ValueError(f"spec.devices.config: {exc}") from exc
    return Share(memory=config.memory, memory_percent=config.memory_percent,
                 cores=config.cores)


def share_strategy(configs: Sequence[Mapping[str, Any]]) -> str | None:
    """The packing strategy a claim's GpuShareConfig names in its `policy` field, if any."""
    strategy: str | None = None
    for config in configs:
        opaque = config.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") == names.DRIVER and params.get("policy"):
            strategy = str(params["policy"])
    return strategy


def _alternative(path: str, result_name: str, body: Mapping[str, Any],
                 configs: Sequence[Mapping[str, Any]]) -> Alternative:
    from dra_gateway.kube import cel

    expressions: list[str] = []
    selectors: list[Any] = []
    for i, selector in enumerate(body.get("selectors") or ()):
        expression = ((selector or {}).get("cel") or {}).get("expression", "")
        try:
            selectors.append(cel.compile_selector(expression))
        except cel.CelError as exc:
            raise ValueError(f"{path}.selectors[{i}].cel.expression: {exc}") from exc
        expressions.append(expression)
    mode = body.get("allocationMode") or "ExactCount"
    count = int(body.get("count") or 1) if mode == "ExactCount" else 0
    requests = (body.get("capacity") or {}).get("requests") or {}
    # What 1.38 refuses (a negative amount, a name that is not a qualified name) is refused
    # here too, whichever release stored the claim.
    problems = capacity_problems(requests, f"{path}.capacity.requests")
    if problems:
        raise ValueError("; ".join(problems))
    capacity = {cap_name: parse_quantity(value).nanos for cap_name, value in requests.items()}
    share = _share_config(configs, result_name)
    whole = not capacity and share.memory is None and share.memory_percent is None and (
        share.cores is None or share.cores >= names.CORES_PER_CARD
    )
    return Alternative(
        result_name=result_name,
        class_name=body.get("deviceClassName", ""),
        selectors=tuple(selectors),
        expressions=tuple(expressions),
        all_devices=mode == "All",
        count=count,
        tolerations=tuple(body.get("tolerations") or ()),
        capacity=capacity,
        share=share,
        whole=whole,
        admin_access=bool(body.get("adminAccess")),
        identity_sensitive=any(may_read_identity(e) for e in expressions),
    )


def compile_claim(spec: Mapping[str, Any]) -> ClaimDemand:
    """Compile `claim.spec`; errors are kept on the demand, naming the field."""
    devices = spec.get("devices") or {}
    configs = list(devices.get("config") or ())
    demand = ClaimDemand(configs=configs)
    try:
        for i, raw in enumerate(devices.get("requests") or ()):
            name = raw.get("name", "")
            path = f"spec.devices.requests[{i}]"
            if raw.get("firstAvailable"):
                alternatives = [
                    _alternative(f"{path}.firstAvailable[{j}]", f"{name}/{sub.get('name', '')}",
                                 sub, configs)
                    for j, sub in enumerate(raw["firstAvailable"])
                ]
            else:
                alternatives = [_alternative(f"{path}.exactly", name, raw.get("exactly") or {},
                                             configs)]
            demand.requests.append(Request(name, alternatives))
        for raw in devices.get("constraints") or ():
            distinct = raw.get("distinctAttribute")
            attribute = distinct or raw.get("matchAttribute") or ""
            demand.constraints.append(Constraint(frozenset(raw.get("requests") or ()),
                                                 attribute, bool(distinct)))
    except ValueError as exc:
        demand.error = str(exc)
    demand.identity_sensitive = any(
        a.identity_sensitive for r in demand.requests for a in r.alternatives
    ) or any(c.attribute.rsplit("/", 1)[-1] in IDENTITY_ATTRIBUTES for c in demand.constraints)
    return demand


def memory_for(share: Share, card_memory_bytes: int) -> int | None:
    """Bytes of card memory a share asks on a card of `card_memory_bytes`, or None if unset.

    Relative memory is resolved per candidate card and rounded down to whole MiB, so that what
    the node plugin enforces never exceeds the percentage (`gpu/memory_percent.py`).
    """
    if share.memory is not None:
        return share.memory
    if share.memory_percent is not None:
        return share_bytes_in_whole_mib(card_memory_bytes, share.memory_percent)
    return None


__all__ = ["MIB_NANOS", "NANO", "Alternative", "ClaimDemand", "Constraint", "Request", "Share",
           "compile_claim", "memory_for", "share_strategy"]
