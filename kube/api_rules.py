"""What the API server refuses in the DRA fields the gateway writes, as Kubernetes 1.38 checks them.

Kubernetes 1.38 validates fields earlier releases stored as given: the names and values of a
result's `consumedCapacity` and of a request's `capacity.requests` (qualified names, at most 32
entries, never negative), one node selector term per device of a ResourceSlice, and `version`
attributes of at most 18 digits per number. The gateway checks what it writes against the same
rules before it writes (a write the API refuses would leave a pod gated with an error it cannot
fix), and names what others wrote that breaks them: one negative `consumedCapacity` in any claim
makes kube-scheduler 1.38 fail every DRA pod of the cluster until that claim is gone.

Each check returns the problems as `field.path: what is wrong` texts, empty when the API accepts
the object; the paths are the API's own (`status.allocation.devices.results[0].consumedCapacity`).
The rules follow `pkg/apis/resource/validation` and the declarative tags of `resource.k8s.io/v1`
in Kubernetes 1.38.0. Pure: standard library and `kube.quantity` only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from dra_gateway.kube.quantity import Quantity, QuantityError

# resource.k8s.io/v1 limits.
MAX_ID_LENGTH: Final = 32  # DeviceMaxIDLength: a C identifier in a qualified name
MAX_DOMAIN_LENGTH: Final = 63  # DeviceMaxDomainLength: a driver name, a qualified name's domain
MAX_CAPACITY_ENTRIES: Final = 32  # consumedCapacity, capacity.requests
MAX_RESULTS: Final = 32  # AllocationResultsMaxSize
MAX_ALLOCATION_CONFIGS: Final = 64  # 2 * DeviceConfigMaxSize: the class's and the claim's
MAX_ATTRIBUTE_VALUE_LENGTH: Final = 64  # DeviceAttributeMaxValueLength

C_IDENTIFIER_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A driver name, and a qualified name's domain: a DNS subdomain in any case (the API lowers it
# before checking, as for CSI driver names).
_DNS_LABEL = r"[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?"
DNS_SUBDOMAIN_RE: Final = re.compile(rf"^{_DNS_LABEL}(?:\.{_DNS_LABEL})*$")
# A DRA QualifiedName in one expression: a C identifier (the driver's own name), or
# `<DNS subdomain>/<C identifier>` (another domain's, such as resource.kubernetes.io/pcieRoot).
QUALIFIED_NAME_RE: Final = re.compile(
    rf"^(?:(?=[A-Za-z0-9.-]{{1,{MAX_DOMAIN_LENGTH}}}/){_DNS_LABEL}(?:\.{_DNS_LABEL})*/)?"
    rf"[A-Za-z_][A-Za-z0-9_]{{0,{MAX_ID_LENGTH - 1}}}$")

# A `version` attribute: semver 2.0 whose numbers (and numeric pre-release identifiers) have at
# most 18 digits, so that each fits an int64 in CEL.
_NUMBER = r"(?:0|[1-9][0-9]{0,17})"
_PRERELEASE_ID = rf"(?:{_NUMBER}|[0-9]*[A-Za-z-][0-9A-Za-z-]*)"
_BUILD_ID = r"[0-9A-Za-z-]+"
VERSION_RE: Final = re.compile(
    rf"^{_NUMBER}\.{_NUMBER}\.{_NUMBER}"
    rf"(?:-{_PRERELEASE_ID}(?:\.{_PRERELEASE_ID})*)?"
    rf"(?:\+{_BUILD_ID}(?:\.{_BUILD_ID})*)?$")


def qualified_name_problem(name: object) -> str | None:
    """Why `name` is not a DRA QualifiedName, or None when it is one."""
    if not isinstance(name, str) or not name:
        return "must be a name such as \"memory\" or \"example.com/memory\""
    parts = name.split("/")
    if len(parts) > 2:
        return "must not contain more than one slash"
    if len(parts) == 2:
        domain, ident = parts
        if not domain:
            return "the domain before the slash must not be empty"
        if len(domain) > MAX_DOMAIN_LENGTH:
            return f"the domain {domain!r} must be at most {MAX_DOMAIN_LENGTH} characters"
        if not DNS_SUBDOMAIN_RE.match(domain):
            return (f"the domain {domain!r} must be a DNS subdomain (letters, digits, '-' and "
                    "'.', starting and ending with a letter or digit)")
    else:
        ident = parts[0]
    if not ident:
        return "the name after the slash must not be empty"
    if len(ident) > MAX_ID_LENGTH:
        return f"the name {ident!r} must be at most {MAX_ID_LENGTH} characters"
    if not C_IDENTIFIER_RE.match(ident):
        return (f"the name {ident!r} must be a C identifier (letters, digits and '_', not "
                "starting with a digit)")
    return None


def capacity_problems(capacities: object, path: str) -> list[str]:
    """The problems of a `consumedCapacity` or `capacity.requests` map at `path`."""
    if capacities is None:
        return []
    if not isinstance(capacities, Mapping):
        return [f"{path}: must be a map of capacity names to quantities"]
    problems: list[str] = []
    if len(capacities) > MAX_CAPACITY_ENTRIES:
        problems.append(f"{path}: has {len(capacities)} entries, at most "
                        f"{MAX_CAPACITY_ENTRIES} are allowed")
    for name, value in capacities.items():
        where = f"{path}[{name}]"
        why = qualified_name_problem(name)
        if why is not None:
            problems.append(f"{where}: {why}")
        try:
            quantity = Quantity.parse(value)
        except QuantityError as err:
            problems.append(f"{where}: {err}")
            continue
        if quantity.sign() < 0:
            problems.append(f"{where}: {value} must be greater than or equal to 0")
    return problems


def allocation_problems(allocation: object, path: str = "status.allocation") -> list[str]:
    """The problems 1.38 finds in a claim's `status.allocation` (results, configs, node
    selector), which the API refuses to store and kube-scheduler refuses to read."""
    if not isinstance(allocation, Mapping):
        return []
    devices = allocation.get("devices") or {}
    if not isinstance(devices, Mapping):
        return [f"{path}.devices: must be an object"]
    problems: list[str] = []
    results = devices.get("results") or ()
    config = devices.get("config") or ()
    if isinstance(results, Sequence) and len(results) > MAX_RESULTS:
        problems.append(f"{path}.devices.results: has {len(results)} entries, at most "
                        f"{MAX_RESULTS} are allowed")
    if isinstance(config, Sequence) and len(config) > MAX_ALLOCATION_CONFIGS:
        problems.append(f"{path}.devices.config: has {len(config)} entries, at most "
                        f"{MAX_ALLOCATION_CONFIGS} are allowed")
    for index, result in enumerate(results if isinstance(results, Sequence) else ()):
        if isinstance(result, Mapping):
            problems.extend(capacity_problems(
                result.get("consumedCapacity"),
                f"{path}.devices.results[{index}].consumedCapacity"))
    return problems


def _requests_of(request: Mapping[str, Any], path: str) -> list[tuple[Mapping[str, Any], str]]:
    """A device request's concrete requests: `exactly`, or each `firstAvailable` choice."""
    found: list[tuple[Mapping[str, Any], str]] = []
    exactly = request.get("exactly")
    if isinstance(exactly, Mapping):
        found.append((exactly, f"{path}.exactly"))
    for index, sub in enumerate(request.get("firstAvailable") or ()):
        if isinstance(sub, Mapping):
            found.append((sub, f"{path}.firstAvailable[{index}]"))
    return found


def claim_spec_problems(spec: object, path: str = "spec") -> list[str]:
    """The problems 1.38 finds in a ResourceClaim's spec (a template's `spec.spec`): the
    capacity requests of each device request."""
    if not isinstance(spec, Mapping):
        return []
    problems: list[str] = []
    requests = (spec.get("devices") or {}).get("requests") or ()
    for index, request in enumerate(requests):
        if not isinstance(request, Mapping):
            continue
        for concrete, where in _requests_of(request, f"{path}.devices.requests[{index}]"):
            capacity = concrete.get("capacity")
            if isinstance(capacity, Mapping):
                problems.extend(capacity_problems(capacity.get("requests"),
                                                  f"{where}.capacity.requests"))
    return problems


def version_problem(value: object) -> str | None:
    """Why `value` is not a `version` attribute 1.38 accepts, or None."""
    if not isinstance(value, str) or not VERSION_RE.match(value):
        return (f"{value!r} must be a semantic version such as \"1.2.3\" with at most 18 digits "
                "in each number")
    if len(value) > MAX_ATTRIBUTE_VALUE_LENGTH:
        return f"{value!r} must be at most {MAX_ATTRIBUTE_VALUE_LENGTH} characters"
    return None


def slice_device_problems(device: Mapping[str, Any], path: str) -> list[str]:
    """The problems 1.38 finds in one device of a ResourceSlice's `spec.devices`: its own node
    selector (exactly one term), `version` attributes, capacity names."""
    problems: list[str] = []
    selector = device.get("nodeSelector")
    if isinstance(selector, Mapping):
        terms = selector.get("nodeSelectorTerms") or ()
        if len(terms) != 1:
            problems.append(f"{path}.nodeSelector.nodeSelectorTerms: has {len(terms)} terms, "
                            "must have exactly one")
    for name, attribute in (device.get("attributes") or {}).items():
        why = qualified_name_problem(name)
        if why is not None:
            problems.append(f"{path}.attributes[{name}]: {why}")
        if isinstance(attribute, Mapping) and "version" in attribute:
            why = version_problem(attribute["version"])
            if why is not None:
                problems.append(f"{path}.attributes[{name}].version: {why}")
    for name in device.get("capacity") or {}:
        why = qualified_name_problem(name)
        if why is not None:
            problems.append(f"{path}.capacity[{name}]: {why}")
    return problems


def slice_problems(resource_slice: Mapping[str, Any]) -> list[str]:
    """The problems of a ResourceSlice's devices (`slice_device_problems`), and of the
    slice's own node selector (exactly one term)."""
    spec = resource_slice.get("spec") or {}
    problems: list[str] = []
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and len(selector.get("nodeSelectorTerms") or ()) != 1:
        problems.append("spec.nodeSelector.nodeSelectorTerms: must have exactly one term")
    for index, device in enumerate(spec.get("devices") or ()):
        if isinstance(device, Mapping):
            problems.extend(slice_device_problems(device, f"spec.devices[{index}]"))
    return problems


__all__ = [
    "MAX_ALLOCATION_CONFIGS",
    "MAX_CAPACITY_ENTRIES",
    "MAX_RESULTS",
    "QUALIFIED_NAME_RE",
    "VERSION_RE",
    "allocation_problems",
    "capacity_problems",
    "claim_spec_problems",
    "qualified_name_problem",
    "slice_device_problems",
    "slice_problems",
    "version_problem",
]
