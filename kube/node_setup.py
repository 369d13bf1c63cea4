"""What a node plugin found on its node that the gateway needs from the node itself, and what
that means: one home for the format, written by the node plugin, read by `dra-gateway
preflight`.

The node plugin's condition `DraGatewayNodeSetup` (True when nothing is missing) says it in its
message, for people and for the gateway alike:

    cdi /var/run/cdi: writable; hami-core /usr/local/vgpu/libvgpu.so: present

`cdi DIR:` is the folder the plugin writes CDI specs into, then `writable` or `not writable
(WHY)`; `hami-core PATH:` is HAMi-core's library, then `present`, `missing`, or `from images`
(the plugin does not mount it: the containers' images bring their own).

Whether the container runtime reads that folder is not something the plugin can see from its
pod (the runtime's configuration is not mounted): `runtime_reads_cdi` judges it from the Node's
`status.nodeInfo.containerRuntimeVersion` and the runtimes' documented defaults.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

CONDITION_TYPE: Final = "DraGatewayNodeSetup"
REASON_COMPLETE: Final = "SetupComplete"
REASON_INCOMPLETE: Final = "SetupIncomplete"

HamiCore = Literal["present", "missing", "from images"]
# The folders containerd 2 and CRI-O read CDI specs from by default (and containerd 1.7 once
# enable_cdi is on).
DEFAULT_CDI_DIRS: Final = ("/etc/cdi", "/var/run/cdi")

_MESSAGE = re.compile(r"^cdi (?P<cdi_dir>\S+): (?P<cdi>writable|not writable(?: \((?P<why>.*)\))?)"
                      r"; hami-core (?P<hami_path>\S+): (?P<hami>present|missing|from images)$")
_VERSION = re.compile(r"^(?P<name>[a-z-]+)://v?(?P<major>\d+)\.(?P<minor>\d+)")


@dataclass(frozen=True, slots=True)
class NodeSetup:
    """What one node plugin found on its node."""

    cdi_dir: str
    cdi_writable: bool
    hami_library: str
    hami_core: HamiCore
    cdi_problem: str = ""  # why the folder is not writable

    @property
    def complete(self) -> bool:
        return self.cdi_writable and self.hami_core != "missing"

    def message(self) -> str:
        cdi = "writable" if self.cdi_writable else (
            f"not writable ({self.cdi_problem})" if self.cdi_problem else "not writable")
        return f"cdi {self.cdi_dir}: {cdi}; hami-core {self.hami_library}: {self.hami_core}"

    def condition(self, now: str) -> dict[str, str]:
        """The Node condition saying it (`now`: RFC 3339, its heartbeat and transition)."""
        return {"type": CONDITION_TYPE, "status": "True" if self.complete else "False",
                "reason": REASON_COMPLETE if self.complete else REASON_INCOMPLETE,
                "message": self.message(), "lastHeartbeatTime": now,
                "lastTransitionTime": now}


def parse_setup(message: str) -> NodeSetup | None:
    """The setup a condition's message says; None when it cannot be read (another version's)."""
    match = _MESSAGE.match(message.replace("\n", " ").strip())
    if match is None:
        return None
    hami: HamiCore = "present"
    if match["hami"] == "missing":
        hami = "missing"
    elif match["hami"] == "from images":
        hami = "from images"
    return NodeSetup(cdi_dir=match["cdi_dir"], cdi_writable=match["cdi"] == "writable",
                     cdi_problem=match["why"] or "", hami_library=match["hami_path"],
                     hami_core=hami)


def node_setup(node: Mapping[str, object]) -> NodeSetup | None:
    """The setup a Node's condition reports; None when no node plugin reported it."""
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, Mapping) and condition.get("type") == CONDITION_TYPE:
            return parse_setup(str(condition.get("message") or ""))
    return None


def runtime_reads_cdi(runtime_version: str, cdi_dir: str) -> tuple[bool | None, str]:
    """Whether a runtime (`containerd://2.0.4`, `cri-o://1.31.1`) reads CDI specs from
    `cdi_dir` by default: True, False, or None when it depends on its configuration; and why."""
    match = _VERSION.match(runtime_version.strip())
    if match is None:
        return None, (f"runtime {runtime_version or 'unknown'}: check that it reads CDI specs "
                      f"from {cdi_dir}")
    name, version = match["name"], (int(match["major"]), int(match["minor"]))
    in_defaults = cdi_dir.rstrip("/") in DEFAULT_CDI_DIRS
    if name == "containerd":
        if version >= (2, 0):
            if in_defaults:
                return True, f"{runtime_version} reads {cdi_dir} by default"
            return None, (f"{runtime_version} reads {', '.join(DEFAULT_CDI_DIRS)} by default: "
                          f"{cdi_dir} only if its cdi_spec_dirs name it")
        if version >= (1, 7):
            return None, (f"{runtime_version} reads CDI specs only with enable_cdi = true in "
                          f"its CRI plugin's configuration (and {cdi_dir} in cdi_spec_dirs)")
        return False, f"{runtime_version} predates CDI support (containerd 1.7 or later)"
    if name == "cri-o":
        if version >= (1, 23):
            if in_defaults:
                return True, f"{runtime_version} reads {cdi_dir} by default"
            return None, (f"{runtime_version} reads {', '.join(DEFAULT_CDI_DIRS)} by default: "
                          f"{cdi_dir} only if its cdi_spec_dirs name it")
        return False, f"{runtime_version} predates CDI support (CRI-O 1.23 or later)"
    return None, f"runtime {runtime_version}: check that it reads CDI specs from {cdi_dir}"
