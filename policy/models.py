"""The policy documents `GPUQuota` and `GPUSharingPolicy` (dra-gateway.io/v1alpha1), as models.

These are the CRDs the chart ships (`helm/dra-gateway/crds/`); the models validate what the API
server's schema cannot (a CEL selector that does not compile, a quantity that is not bytes) and
turn a document into the compiled, plain structures the hot paths use (`compile.py`). Typed
models are for loading only; this module must not do I/O.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError, compile_selector
from dra_gateway.kube.models import ENFORCEMENTS, Enforcement
from dra_gateway.kube.quantity import Quantity, QuantityError, parse_quantity

KIND_QUOTA = "GPUQuota"
KIND_SHARING = "GPUSharingPolicy"
PLURAL_QUOTA = "gpuquotas"
PLURAL_SHARING = "gpusharingpolicies"

Admission = Literal["Queue", "Refuse"]
IsolationMode = Literal["None", "Namespace", "Label"]
SharesServedBy = Literal["Software", "MIG"]

# A label key as Kubernetes accepts it: optional DNS-subdomain prefix, a name of at most 63.
_LABEL_KEY = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}"
    r"[A-Za-z0-9])?$")


class PolicyError(ValueError):
    """A policy document that cannot be used; the message names the object and field paths."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _bytes(value: Any, what: str) -> int:
    try:
        quantity = parse_quantity(value)
    except (QuantityError, TypeError) as exc:
        raise ValueError(f"{what} {value!r} is not a quantity: {exc}") from None
    if quantity.sign() < 0:
        raise ValueError(f"{what} must not be negative, got {value}")
    if not quantity.is_integer():
        raise ValueError(f"{what} must be a whole number of bytes, got {value}")
    return quantity.value()


class QuotaLimits(_Strict):
    """Amounts of a quota: memory in bytes (a quantity such as "120Gi"), cores in percent of a
    card (100 = one card's compute), devices (cards touched, whole or shared), claims."""

    memory: int | None = None
    cores: int | None = Field(default=None, ge=0)
    devices: int | None = Field(default=None, ge=0)
    claims: int | None = Field(default=None, ge=0)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int | None:
        return None if value is None else _bytes(value, "memory")

    @model_validator(mode="after")
    def _one_limit(self) -> QuotaLimits:
        if not self.items():
            raise ValueError("hard names no limit: set at least one of memory, cores, devices, "
                             "claims")
        return self

    def items(self) -> list[tuple[str, int]]:
        return [(k, v) for k, v in (("memory", self.memory), ("cores", self.cores),
                                    ("devices", self.devices), ("claims", self.claims))
                if v is not None]


class QuotaScope(_Strict):
    device_class_names: tuple[str, ...] = Field(default=(), alias="deviceClassNames")
    selector: str | None = None

    @field_validator("device_class_names")
    @classmethod
    def _classes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        outside = [c for c in value if c not in names.GATEWAY_CLASSES]
        if outside:
            raise ValueError(f"{', '.join(outside)} is not a dra-gateway device class (one of "
                             f"{', '.join(sorted(names.GATEWAY_CLASSES))}): quotas count what "
                             f"the gateway allocates")
        return value

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_selector(value)
            except CelError as exc:
                raise ValueError(str(exc)) from None
        return value


# A cohort's name: a DNS label, as Kueue's cohorts and Kubernetes names are.
_COHORT = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class QuotaSpec(_Strict):
    """`hard` is the ceiling. `min` with `cohort`: what the namespace is always entitled to, and
    the namespaces it lends its unused guarantee to and borrows theirs from (up to `hard`)."""

    hard: QuotaLimits
    min: QuotaLimits | None = None
    cohort: str | None = None
    scope: QuotaScope | None = None
    admission: Admission = "Queue"

    @field_validator("cohort")
    @classmethod
    def _cohort(cls, value: str | None) -> str | None:
        if value is not None and not _COHORT.match(value):
            raise ValueError(f"{value!r} is not a cohort name (a DNS label: lower-case "
                             "letters, digits and '-', at most 63)")
        return value

    @model_validator(mode="after")
    def _guarantee(self) -> QuotaSpec:
        if (self.min is None) != (self.cohort is None):
            given, missing = ("min", "cohort") if self.cohort is None else ("cohort", "min")
            raise ValueError(f"{given} needs {missing}: a guarantee is lent to and borrowed "
                             "from the quotas of its cohort (set both, or neither for a plain "
                             "ceiling)")
        if self.min is not None:
            hard = dict(self.hard.items())
            for field_, amount in self.min.items():
                if field_ not in hard:
                    raise ValueError(f"min.{field_} needs hard.{field_}: the ceiling that "
                                     "borrowing stops at")
                if amount > hard[field_]:
                    raise ValueError(
                        f"min.{field_} ({_shown(field_, amount)}) is above hard.{field_} "
                        f"({_shown(field_, hard[field_])}): the guarantee is at most the "
                        "ceiling")
        return self


def _shown(field_: str, amount: int) -> str:
    return str(Quantity.from_bytes(amount)) if field_ == "memory" else str(amount)


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class _PolicyObject(_Strict):
    """A GPU policy object of the gateway's API; each kind narrows `kind` and `spec`."""

    api_version: Literal["dra-gateway.io/v1alpha1"] = Field(alias="apiVersion")
    kind: str
    metadata: ObjectMeta
    spec: _Strict
    status: dict[str, Any] | None = None


class GPUQuota(_PolicyObject):
    kind: Literal["GPUQuota"]
    spec: QuotaSpec


class MinShare(_Strict):
    memory: int | None = None
    cores: int | None = Field(default=None, ge=1, le=names.CORES_PER_CARD)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> int | None:
        return None if value is None else _bytes(value, "memory")


class Isolation(_Strict):
    mode: IsolationMode = "None"
    label_key: str | None = Field(default=None, alias="labelKey")

    @field_validator("label_key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        if value is not None and not _LABEL_KEY.match(value):
            raise ValueError(f"{value!r} is not a label key (an optional DNS prefix and a name "
                             "of at most 63 characters)")
        return value

    @model_validator(mode="after")
    def _key_with_label_mode(self) -> Isolation:
        if self.mode == "Label" and not self.label_key:
            raise ValueError("mode Label needs labelKey (e.g. team)")
        if self.mode != "Label" and self.label_key:
            raise ValueError(f"labelKey is only read with mode Label, not {self.mode}")
        return self


class Shares(_Strict):
    """How the namespace's shares of a card are served: `Software` (the share's enforcement,
    HAMi-core or MPS, in a card others share) or `MIG` (a MIG instance per share, which the
    hardware isolates: translation asks for one, and a claim for a share is refused)."""

    served_by: SharesServedBy = Field(default="Software", alias="servedBy")


class LabelSelectorRequirement(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class LabelSelector(_Strict):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(
        default=(), alias="matchExpressions")


class SharingSpec(_Strict):
    namespace_selector: LabelSelector = Field(default_factory=LabelSelector,
                                              alias="namespaceSelector")
    exclusive: bool = False
    max_claims_per_device: int | None = Field(default=None, ge=1, alias="maxClaimsPerDevice")
    min_share: MinShare | None = Field(default=None, alias="minShare")
    require_cores: bool = Field(default=False, alias="requireCores")
    allowed_enforcement: tuple[Enforcement, ...] = Field(default=(), alias="allowedEnforcement")
    allowed_models: tuple[str, ...] = Field(default=(), alias="allowedModels")
    isolation: Isolation = Field(default_factory=Isolation)
    shares: Shares = Field(default_factory=Shares)


class GPUSharingPolicy(_PolicyObject):
    kind: Literal["GPUSharingPolicy"]
    spec: SharingSpec


def _describe(kind: str, obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{kind} {where}{meta.get('name', '<unnamed>')}"


def _errors(kind: str, obj: Any, exc: ValidationError) -> PolicyError:
    parts = []
    for error in exc.errors():
        path = ".".join(str(p) for p in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{path}: {message}" if path else message)
    count = len(parts)
    return PolicyError(f"{_describe(kind, obj)}: {count} error{'s' if count > 1 else ''}: "
                       + "; ".join(parts))


def parse_quota(obj: Any) -> GPUQuota:
    """A GPUQuota from its JSON object; PolicyError names the object and every field."""
    try:
        quota = GPUQuota.model_validate(obj)
    except ValidationError as exc:
        raise _errors(KIND_QUOTA, obj, exc) from None
    if not quota.metadata.namespace:
        raise PolicyError(f"{_describe(KIND_QUOTA, obj)}: metadata.namespace is required "
                          "(a GPUQuota limits one namespace)")
    return quota


def parse_sharing(obj: Any) -> GPUSharingPolicy:
    """A GPUSharingPolicy from its JSON object; PolicyError names the object and every field."""
    try:
        return GPUSharingPolicy.model_validate(obj)
    except ValidationError as exc:
        raise _errors(KIND_SHARING, obj, exc) from None


__all__ = [
    "ENFORCEMENTS", "KIND_QUOTA", "KIND_SHARING", "PLURAL_QUOTA", "PLURAL_SHARING", "GPUQuota",
    "GPUSharingPolicy", "PolicyError", "parse_quota", "parse_sharing",
]
