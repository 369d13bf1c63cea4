"""MIG instances made on demand: a GPU instance and its compute instance created through NVML
at an allocated placement, destroyed when their claim is unprepared, with a journal on disk so
that a crash half-way is finished or undone at the next start.

Each instance the plugin makes is journalled under a key (the claim's UID and the device) before
every NVML step, rewritten atomically (`kube.files.atomic_write`):

    creating -> gpu-instance (its GI id) -> made (its CI id and MIG UUID) -> destroying -> gone

A step that fails rolls back what the earlier ones made (compute instance, then GPU instance)
and raises `MigError` naming the card, the profile, the placement and NVML's error; the entry
goes only once nothing is left on the card. `recover()` at start undoes every entry left in
`creating` or `gpu-instance` (a crash during a prepare: the kubelet prepares again), finishes
every `destroying`, and drops a `made` one whose instance is gone (a reboot destroys dynamic
instances). It finds a GPU instance left in `creating` by its placement: the plugin checks the
placement is free before creating, so an instance there is its own (the one exception: an
administrator making an instance on that very placement by hand while the plugin is down after
a crash inside that step).

The plugin never destroys an instance it did not make: only journalled ones are touched, and
instances made by hand are left as they are (they are published as fixed devices). No gRPC, no
cluster, no CDI: the caller writes the spec with the UUID it gets.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from dra_gateway.kube.files import atomic_write

log = logging.getLogger(__name__)

T = TypeVar("T")
Stage = Literal["creating", "gpu-instance", "made", "destroying"]
STAGES: tuple[Stage, ...] = ("creating", "gpu-instance", "made", "destroying")
FORMAT_VERSION = 1
# The journal's file in the plugin's state directory.
MIG_JOURNAL_FILE = "mig-instances.json"
_NOT_FOUND = 6
# GPU and compute instance ids NVML hands out on one card (A100 to B200 stay well under).
_GPU_INSTANCE_IDS = range(32)
_COMPUTE_INSTANCE_IDS = range(8)
# NVML_COMPUTE_INSTANCE_PROFILE_* giving a GPU instance's compute slices to one compute
# instance (nvml.h).
COMPUTE_PROFILE_OF_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


class MigError(Exception):
    """A MIG instance could not be made or destroyed; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Wanted:
    """An instance to make: on the card `card_uuid`, NVML's GPU instance profile `profile`
    (`NVML_GPU_INSTANCE_PROFILE_*`) at memory slice `start`, `size` slices long."""

    card_uuid: str
    profile: int
    start: int
    size: int
    name: str = ""  # the profile's name, for messages ("1g.10gb")

    def where(self) -> str:
        return (f"MIG {self.name or f'profile {self.profile}'} at memory slice {self.start} "
                f"of card {self.card_uuid}")


@dataclass(frozen=True, slots=True)
class Instance:
    key: str
    wanted: Wanted
    stage: Stage
    gi_id: int | None = None
    ci_id: int | None = None
    uuid: str = ""


class Journal:
    """Key to instance, in one JSON file; every change persisted before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, Instance] = {}
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw)
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            for key, entry in data["instances"].items():
                if entry.get("stage") not in STAGES:
                    raise ValueError(f"instances.{key}.stage: unknown {entry.get('stage')!r}")
                self._entries[key] = Instance(**{**entry, "wanted": Wanted(**entry["wanted"])})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Unlike the claims' checkpoint, this file is the only record of which instances
            # are the plugin's: never start over from nothing, or they would leak for ever.
            raise MigError(f"MIG journal {path} is unreadable ({exc}): the plugin does not "
                           "know which MIG instances it made; fix or remove the file (then "
                           "destroy the plugin's instances by hand with nvidia-smi mig "
                           "-dci/-dgi)") from None

    def get(self, key: str) -> Instance | None:
        return self._entries.get(key)

    def entries(self) -> list[Instance]:
        return [self._entries[k] for k in sorted(self._entries)]

    def commit(self, key: str, entry: Instance | None) -> None:
        entries = dict(self._entries)
        if entry is None:
            entries.pop(key, None)
        else:
            entries[key] = entry
        data = {"version": FORMAT_VERSION,
                "instances": {k: asdict(v) for k, v in sorted(entries.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n")
        self._entries = entries


class MigInstances:
    """Makes and destroys the plugin's MIG instances through `lib` (`pynvml`), journalled in
    `journal`. With `session`, NVML is initialised at the first call that needs it (a failure
    is a `MigError`, and the next call tries again) and kept open until `close()`; without,
    the caller has initialised it."""

    def __init__(self, lib: Any, journal: Path, *, session: bool = False) -> None:
        self._lib = lib
        self.journal = Journal(journal)
        self._session = session
        self._open = not session

    def _opened(self) -> None:
        if self._open:
            return
        try:
            self._lib.nvmlInit()
        except self._lib.NVMLError as err:
            raise MigError(f"NVML nvmlInit failed: {err}") from None
        self._open = True

    def close(self) -> None:
        """End the NVML session this object opened (if any)."""
        if self._session and self._open:
            self._open = False
            try:
                self._lib.nvmlShutdown()
            except self._lib.NVMLError as err:
                log.warning("nvmlShutdown failed: %s", err)

    # --- make -----------------------------------------------------------------------------

    def make(self, key: str, wanted: Wanted) -> Instance:
        """The instance of `key`, made at `wanted` (or the one already made: idempotent)."""
        done = self.journal.get(key)
        if done is not None and done.stage == "made":
            if done.wanted != wanted:
                raise MigError(f"{key}: already holds {done.wanted.where()}, not "
                               f"{wanted.where()}")
            return done
        self._opened()
        if done is not None:
            self._undo(done)  # a half-made one of an earlier try
        dev = self._device(wanted)
        info = self._nvml(wanted, "nvmlDeviceGetGpuInstanceProfileInfo",
                          self._lib.nvmlDeviceGetGpuInstanceProfileInfo, dev, wanted.profile)
        if (taken := self._gi_at(dev, info.id, wanted.start)) is not None:
            raise MigError(f"{wanted.where()}: an instance the plugin did not make holds it "
                           f"(GPU instance {taken}); it is left as it is")
        entry = Instance(key, wanted, "creating")
        self.journal.commit(key, entry)
        gi = None
        try:
            placement = self._lib.c_nvmlGpuInstancePlacement_t(wanted.start, wanted.size)
            gi = self._nvml(wanted, "nvmlDeviceCreateGpuInstanceWithPlacement",
                            self._lib.nvmlDeviceCreateGpuInstanceWithPlacement, dev, info.id,
                            placement)
            gi_id = int(self._nvml(wanted, "nvmlGpuInstanceGetInfo",
                                   self._lib.nvmlGpuInstanceGetInfo, gi).id)
            entry = replace(entry, stage="gpu-instance", gi_id=gi_id)
            self.journal.commit(key, entry)
            profile = COMPUTE_PROFILE_OF_SLICES.get(int(info.sliceCount))
            if profile is None:
                raise MigError(f"{wanted.where()}: no compute instance profile of "
                               f"{info.sliceCount} slices")
            ci_info = self._nvml(wanted, "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                                 self._lib.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                                 profile, self._lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            ci = self._nvml(wanted, "nvmlGpuInstanceCreateComputeInstance",
                            self._lib.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id)
            ci_id = int(self._nvml(wanted, "nvmlComputeInstanceGetInfo",
                                   self._lib.nvmlComputeInstanceGetInfo, ci).id)
            entry = replace(entry, ci_id=ci_id)
            uuid = self._uuid(dev, wanted, gi_id, ci_id)
        except MigError as exc:
            try:
                if gi is None:  # NVML refused the GPU instance: nothing was made
                    self.journal.commit(key, None)
                else:
                    self._undo(entry)
            except MigError as undo:
                raise MigError(f"{exc}; rolling back failed too ({undo}): retried at the "
                               "next prepare or start") from None
            raise
        made = replace(entry, stage="made", uuid=uuid)
        self.journal.commit(key, made)
        log.info("made %s: %s", wanted.where(), uuid)
        return made

    # --- destroy --------------------------------------------------------------------------

    def destroy(self, key: str) -> bool:
        """Destroy what `key` made; False when it made nothing (idempotent)."""
        entry = self.journal.get(key)
        if entry is None:
            return False
        self._opened()
        if entry.stage == "made":
            entry = replace(entry, stage="destroying")
            self.journal.commit(key, entry)
        self._undo(entry)
        log.info("destroyed %s", entry.wanted.where())
        return True

    def recover(self) -> list[str]:
        """Finish or undo what a crash left half-done; a line per repair. An entry NVML
        refuses to repair stays for the next start, and its error is logged."""
        repairs: list[str] = []
        if not self.journal.entries():
            return repairs
        try:
            self._opened()
        except MigError as exc:
            log.error("MIG journal: %s; its %d entries are repaired at the next start or "
                      "prepare", exc, len(self.journal.entries()))
            return repairs
        for entry in self.journal.entries():
            where = f"{entry.key}: {entry.wanted.where()}"
            try:
                if entry.stage == "made":
                    if self._instance_gone(entry):
                        self.journal.commit(entry.key, None)
                        repairs.append(f"forgot {where}: the instance is gone (a reboot)")
                    continue
                self._undo(entry)
            except MigError as exc:
                log.error("MIG journal: could not repair %s: %s; tried again at the next "
                          "start", where, exc)
                continue
            verb = "finished destroying" if entry.stage == "destroying" else "undid the half-made"
            repairs.append(f"{verb} {where}")
        for line in repairs:
            log.info("MIG journal: %s", line)
        return repairs

    def placements(self) -> frozenset[tuple[str, int, int]]:
        """Where the instances the plugin makes or made sit, whatever their stage: (card UUID,
        first memory slice, memory slices). Discovery sees them as any instance; these are not
        an administrator's."""
        return frozenset((e.wanted.card_uuid, e.wanted.start, e.wanted.size)
                         for e in self.journal.entries())

    def keys_of(self, prefix: str) -> list[str]:
        """The journal's keys that start with `prefix` (a claim's UID and '/')."""
        return [e.key for e in self.journal.entries() if e.key.startswith(prefix)]

    # --- helpers --------------------------------------------------------------------------

    def _undo(self, entry: Instance) -> None:
        """Destroy whatever of `entry` exists (compute instances, then the GPU instance) and
        drop it from the journal; MigError leaves the entry for a later try."""
        wanted = entry.wanted
        dev = self._device(wanted)
        gi_id = entry.gi_id
        if gi_id is None:  # `creating`: made at most at its placement, which was free
            info = self._nvml(wanted, "nvmlDeviceGetGpuInstanceProfileInfo",
                              self._lib.nvmlDeviceGetGpuInstanceProfileInfo, dev, wanted.profile)
            gi_id = self._gi_at(dev, info.id, wanted.start)
        if gi_id is not None:
            gi = self._found(wanted, "nvmlDeviceGetGpuInstanceById",
                             self._lib.nvmlDeviceGetGpuInstanceById, dev, gi_id)
            if gi is not None:
                for ci_id in _COMPUTE_INSTANCE_IDS:
                    ci = self._found(wanted, "nvmlGpuInstanceGetComputeInstanceById",
                                     self._lib.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id)
                    if ci is not None:
                        self._nvml(wanted, "nvmlComputeInstanceDestroy",
                                   self._lib.nvmlComputeInstanceDestroy, ci)
                self._nvml(wanted, "nvmlGpuInstanceDestroy", self._lib.nvmlGpuInstanceDestroy,
                           gi)
        self.journal.commit(entry.key, None)

    def _device(self, wanted: Wanted) -> Any:
        return self._nvml(wanted, "nvmlDeviceGetHandleByUUID",
                          self._lib.nvmlDeviceGetHandleByUUID, wanted.card_uuid.encode())

    def _gi_at(self, dev: Any, profile_id: int, start: int) -> int | None:
        """The id of the GPU instance of `profile_id` starting at `start`, if any."""
        for gi_id in _GPU_INSTANCE_IDS:
            try:
                gi = self._lib.nvmlDeviceGetGpuInstanceById(dev, gi_id)
                info = self._lib.nvmlGpuInstanceGetInfo(gi)
            except self._lib.NVMLError:
                continue  # NotFound, or an id NVML does not hand out
            if int(info.profileId) == profile_id and int(info.placement.start) == start:
                return gi_id
        return None

    def _uuid(self, dev: Any, wanted: Wanted, gi_id: int, ci_id: int) -> str:
        slots = int(self._nvml(wanted, "nvmlDeviceGetMaxMigDeviceCount",
                               self._lib.nvmlDeviceGetMaxMigDeviceCount, dev))
        for slot in range(slots):
            handle = self._found(wanted, "nvmlDeviceGetMigDeviceHandleByIndex",
                                 self._lib.nvmlDeviceGetMigDeviceHandleByIndex, dev, slot)
            if handle is None:
                continue
            if (int(self._lib.nvmlDeviceGetGpuInstanceId(handle)) == gi_id
                    and int(self._lib.nvmlDeviceGetComputeInstanceId(handle)) == ci_id):
                uuid = self._lib.nvmlDeviceGetUUID(handle)
                return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        raise MigError(f"{wanted.where()}: NVML lists no MIG device for GPU instance {gi_id}, "
                       f"compute instance {ci_id}")

    def _instance_gone(self, entry: Instance) -> bool:
        wanted = entry.wanted
        dev = self._device(wanted)
        assert entry.gi_id is not None
        return self._found(wanted, "nvmlDeviceGetGpuInstanceById",
                           self._lib.nvmlDeviceGetGpuInstanceById, dev, entry.gi_id) is None

    def _nvml(self, wanted: Wanted, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._lib.NVMLError as err:
            raise MigError(f"{wanted.where()}: NVML {what} failed: {err}") from None

    def _found(self, wanted: Wanted, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn`'s answer, or None where NVML says NotFound."""
        try:
            return fn(*args)
        except self._lib.NVMLError as err:
            if getattr(err, "value", None) == _NOT_FOUND:
                return None
            raise MigError(f"{wanted.where()}: NVML {what} failed: {err}") from None
