"""Classes of GPU fault and what each does to a device: drained, kept from new work, or noted.

NVIDIA's XID catalogue sorts errors by what they leave of the card; the node plugin follows it:

- **fatal**: the card must be drained and reset (double-bit ECC, uncontained ECC, row-remapping
  failure, fallen off the bus, GSP and NVLink failures, a lost GPU). Its devices get a
  `NoExecute` taint: kube-controller-manager (or the gateway) evicts the pods using them.
- **degraded**: the card still works but should take no new work until it proves itself (a
  contained ECC error, a high single-bit error rate, row remapping pending, an NVML outage, any
  XID this table does not name). Its devices get a `NoSchedule` taint.
- **informational**: the application's own fault (a graphics engine exception, an MMU fault of
  a bad pointer, a preempted or killed channel): counted and logged, the device stays healthy.

Recovery differs too: a degraded device is healthy again once no fault hit it for the recovery
period; a fatal one only after a sign that the card came back (NVML sees a lost GPU again, an
operator or a fault file says `recovered`) and then the recovery period without a fault.

Pure: tables and functions, no I/O.
"""

from __future__ import annotations

from typing import Final, Literal

Severity = Literal["fatal", "degraded", "informational"]
FATAL: Final = "fatal"
DEGRADED: Final = "degraded"
INFORMATIONAL: Final = "informational"

# The taint effect of each class that taints; the more severe wins on one device.
EFFECTS: Final[dict[str, str]] = {FATAL: "NoExecute", DEGRADED: "NoSchedule"}
_RANK: Final[dict[str, int]] = {INFORMATIONAL: 0, DEGRADED: 1, FATAL: 2}

# XIDs caused by the application, not the card (NVIDIA's device plugin skips them too).
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
# XIDs after which the card must be reset before it runs anything again.
FATAL_XIDS: Final = frozenset({
    48,   # double-bit ECC error
    64,   # row remapping failure
    74,   # NVLink error
    79,   # GPU has fallen off the bus
    95,   # uncontained ECC error
    119,  # GSP RPC timeout
    120,  # GSP error
    140,  # unrecovered ECC error
})
# Reasons that are not XIDs, as the health watcher names them.
GPU_LOST: Final = "gpu-lost"
NVML_UNAVAILABLE: Final = "nvml-unavailable"
# MIG on demand: a placement allocated to a claim that an instance made by hand now overlaps
# (made after the plugin's discovery): its instance cannot be made, so the pod holding it must
# go (fatal: evicted) and is placed again elsewhere; lifts once the slices are free again.
MIG_PLACEMENT_TAKEN: Final = "mig-placement-taken"


def xid_severity(xid: int) -> Severity:
    """The class of an XID; one this table does not name is `degraded` (no new work until it
    proves itself), never ignored."""
    if xid in APPLICATION_XIDS:
        return INFORMATIONAL
    if xid in FATAL_XIDS:
        return FATAL
    return DEGRADED


def severity_of(reason: str) -> Severity:
    """The class of a health reason: `xid-<n>`, `gpu-lost`, `nvml-unavailable`, or a fault
    file's event name."""
    if reason in (GPU_LOST, MIG_PLACEMENT_TAKEN):
        return FATAL
    if reason.startswith("xid-") and reason[4:].isdigit():
        return xid_severity(int(reason[4:]))
    return DEGRADED


def worse(a: Severity, b: Severity) -> Severity:
    """The more severe of two classes."""
    return a if _RANK[a] >= _RANK[b] else b


__all__ = ["APPLICATION_XIDS", "DEGRADED", "EFFECTS", "FATAL", "FATAL_XIDS", "GPU_LOST",
           "INFORMATIONAL", "MIG_PLACEMENT_TAKEN", "NVML_UNAVAILABLE", "Severity",
           "severity_of", "worse", "xid_severity"]
