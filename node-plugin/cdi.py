"""CDI specs for prepared claims: built as data, checked against the CDI rules, written atomically.

One spec file per claim, kind `k8s.<driver>/claim`, one CDI device per allocated device named
`<claimUID>-<device>`; the container runtime reads the file when it creates the container, so a
half-written file must never be visible (temp file, fsync, rename). The environment for card
visibility and share limits follows the in-container conventions of HAMi-core and CUDA MPS
(vendor-protocols.md). Nothing here fetches claims or decides what a claim gets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gateway.kube import objects
from dra_gateway.kube.files import atomic_write, fsync_dir
from dra_gateway.kube.models import Enforcement

CDI_VERSION = "0.6.0"  # the first version with spec annotations, which name the claim
MIB = 1 << 20
DEFAULT_HAMI_LIBRARY = "/usr/local/vgpu/libvgpu.so"

_VENDOR = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
_KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


def cdi_kind(driver: str) -> str:
    """`k8s.gpu.dra-gateway.io/claim`: the driver's domain as vendor, as NVIDIA's driver does."""
    return f"k8s.{driver}/claim"


def qualified_name(kind: str, device: str) -> str:
    """The fully qualified CDI device name the kubelet passes to the runtime."""
    return f"{kind}={device}"


class UnsafeUid(ValueError):
    """A claim UID that is not in RFC 4122 form, so must not become part of a file name."""

    def __init__(self, claim_uid: str) -> None:
        super().__init__(f"claim UID {claim_uid[:80]!r} is not an RFC 4122 UID "
                         "(8-4-4-4-12 hexadecimal digits); it is not used in a file name")


def spec_file_name(kind: str, claim_uid: str) -> str:
    """The claim's spec file name; UnsafeUid for a UID that could leave the CDI folder."""
    if not objects.is_uid(claim_uid):
        raise UnsafeUid(claim_uid)
    vendor, _, klass = kind.partition("/")
    return f"{vendor}-{klass}_{claim_uid}.json"


@dataclass(frozen=True, slots=True)
class CardShare:
    """What one container-visible card gets: its UUID and, for a share, the limits."""

    uuid: str
    memory: int | None = None  # bytes; None: the whole card's memory
    cores: int | None = None  # percent of the card's SMs; None: all


@dataclass(frozen=True, slots=True)
class EnforcementSettings:
    hami_library: str = DEFAULT_HAMI_LIBRARY
    # Bind-mount the HAMi-core library from the host into the container at the same path.
    mount_hami_library: bool = True
    # Whether that library is on the node (the preparer looks before each prepare): a spec that
    # bind-mounts a missing file makes every start of the container fail in the runtime.
    hami_library_present: bool = True


DEFAULT_ENFORCEMENT = EnforcementSettings()


def hami_library_present(path: str) -> bool:
    """Whether HAMi-core's library is on this node: a file (a link to one counts)."""
    return Path(path).is_file()


def container_env(cards: Sequence[CardShare], enforcement: Enforcement,
                  settings: EnforcementSettings = DEFAULT_ENFORCEMENT) -> list[str]:
    """`K=V` entries for a container that sees `cards`, in order.

    Visibility always; limits only for cards that are shares, in the variables the chosen
    enforcement reads. HAMi-core counts cards by their position in the visible list, hence
    `CUDA_DEVICE_MEMORY_LIMIT_<i>` when there is more than one.
    """
    uuids = ",".join(c.uuid for c in cards)
    env = [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"CUDA_VISIBLE_DEVICES={uuids}"]
    limited = [c for c in cards if c.memory is not None or c.cores is not None]
    if enforcement == "none" or not limited:
        return env
    cores = sorted({c.cores for c in cards if c.cores is not None})
    if enforcement == "hami-core":
        if len(cards) == 1 and cards[0].memory is not None:
            env.append(f"CUDA_DEVICE_MEMORY_LIMIT={_mib(cards[0].memory)}m")
        else:
            env += [f"CUDA_DEVICE_MEMORY_LIMIT_{i}={_mib(c.memory)}m"
                    for i, c in enumerate(cards) if c.memory is not None]
        if cores:
            # HAMi-core has one SM limit for all cards: the strictest share applies.
            env.append(f"CUDA_DEVICE_SM_LIMIT={cores[0]}")
        env.append(f"LD_PRELOAD={settings.hami_library}")
        return env
    if cores:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={cores[0]}")
    pinned = [f"{c.uuid}={_mib(c.memory)}M" for c in cards if c.memory is not None]
    if pinned:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(pinned)}")
    return env


def _mib(memory: int) -> int:
    # Rounded down: a limit above the share would let the container take a neighbour's memory.
    return max(1, memory // MIB)


@dataclass(frozen=True, slots=True)
class CdiDevice:
    name: str
    env: tuple[str, ...]
    mounts: tuple[Mapping[str, Any], ...] = ()


def hami_mounts(enforcement: Enforcement, settings: EnforcementSettings,
                cards: Sequence[CardShare]) -> tuple[dict[str, Any], ...]:
    if enforcement != "hami-core" or not settings.mount_hami_library or not any(
            c.memory is not None or c.cores is not None for c in cards):
        return ()
    return ({"hostPath": settings.hami_library, "containerPath": settings.hami_library,
             "options": ["ro", "nosuid", "nodev", "bind"]},)


def build_spec(*, kind: str, claim_uid: str, claim_namespace: str, claim_name: str,
               devices: Sequence[CdiDevice]) -> dict[str, Any]:
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "annotations": {"claim.dra-gateway.io/uid": claim_uid,
                        "claim.dra-gateway.io/name": f"{claim_namespace}/{claim_name}"},
        "devices": [
            {"name": d.name,
             "containerEdits": {"env": list(d.env),
                                **({"mounts": [dict(m) for m in d.mounts]} if d.mounts else {})}}
            for d in devices
        ],
    }
    problems = validate_spec(spec)
    if problems:
        raise ValueError("invalid CDI spec: " + "; ".join(problems))
    return spec


def validate_spec(spec: Mapping[str, Any]) -> list[str]:
    """Violations of the CDI spec rules (version, kind, device names, edits), empty if none."""
    problems: list[str] = []
    allowed = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
    problems += [f"{k}: unknown field" for k in spec if k not in allowed]
    version = spec.get("cdiVersion")
    if not isinstance(version, str) or not _SEMVER.match(version):
        problems.append(f"cdiVersion: {version!r} is not a semantic version")
    elif version not in _KNOWN_VERSIONS:
        problems.append(f"cdiVersion: {version} is not a released CDI version")
    elif spec.get("annotations") and _KNOWN_VERSIONS.index(version) < _KNOWN_VERSIONS.index(
            "0.6.0"):
        problems.append(f"cdiVersion: annotations need 0.6.0, the spec says {version}")
    kind = spec.get("kind")
    vendor, sep, klass = str(kind).partition("/")
    if not isinstance(kind, str) or not sep or not _VENDOR.match(vendor) or not (
            _CLASS.match(klass)) or len(klass) > 63:
        problems.append(f'kind: "{kind}" is not "vendor.com/class"')
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        problems.append("devices: at least one device is required")
        return problems
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = device.get("name") if isinstance(device, Mapping) else None
        if not isinstance(name, str) or not _DEVICE.match(name):
            problems.append(f"devices[{i}].name: {name!r} must start and end with a letter or "
                            "digit and contain only letters, digits, '-', '_' and '.'")
        elif name in seen:
            problems.append(f"devices[{i}].name: {name} is used twice")
        else:
            seen.add(name)
        edits = device.get("containerEdits", {}) if isinstance(device, Mapping) else {}
        for j, entry in enumerate(edits.get("env", [])):
            if not isinstance(entry, str) or "=" not in entry or entry.startswith("="):
                problems.append(f"devices[{i}].containerEdits.env[{j}]: {entry!r} is not K=V")
        for j, mount in enumerate(edits.get("mounts", [])):
            if not mount.get("hostPath") or not str(mount.get("containerPath", "")).startswith("/"):
                problems.append(f"devices[{i}].containerEdits.mounts[{j}]: hostPath and an "
                                "absolute containerPath are required")
    return problems


def write_spec(cdi_dir: Path, spec: Mapping[str, Any], claim_uid: str) -> Path:
    """Write atomically; the runtime sees either no file or the whole file."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / spec_file_name(str(spec["kind"]), claim_uid)
    data = json.dumps(spec, indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(path, data)
    return path


def remove_spec(cdi_dir: Path, kind: str, claim_uid: str) -> bool:
    """Remove the claim's spec; False when there was none (already removed)."""
    path = cdi_dir / spec_file_name(kind, claim_uid)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fsync_dir(cdi_dir)
    return True
