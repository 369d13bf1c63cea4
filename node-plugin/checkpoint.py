"""The node plugin's memory of prepared claims, on disk, so a restart repairs half-done work.

Each claim moves through `PrepareStarted` -> `PrepareCompleted` -> `UnprepareStarted` -> gone.
Every change goes through `Checkpoint.commit`, which rewrites the whole file atomically (temp
file, fsync, rename), so a crash leaves either the old or the new state, never a torn file; on
restart the plugin finishes or rolls back whatever was started. This module knows nothing of
gRPC, CDI contents or the cluster: entries carry opaque JSON for the callers.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dra_gateway.kube.files import atomic_write

log = logging.getLogger(__name__)

State = Literal["PrepareStarted", "PrepareCompleted", "UnprepareStarted"]
STATES: tuple[State, ...] = ("PrepareStarted", "PrepareCompleted", "UnprepareStarted")
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: State
    # The CDI spec that is (or is being) written, so a lost file can be rewritten and a
    # half-prepared claim cleaned up.
    cdi_spec: dict[str, Any] | None = None
    # The kubelet's answer for a completed prepare: returned again on a repeated call.
    devices: list[dict[str, Any]] = field(default_factory=list)


class CheckpointError(Exception):
    pass


class Checkpoint:
    """Claim UID to entry, persisted in one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: dict[str, ClaimEntry] = {}
        self._load()

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw)
            if data.get("version") != FORMAT_VERSION:
                raise ValueError(f"unsupported checkpoint version {data.get('version')!r}")
            entries = {}
            for uid, entry in data["claims"].items():
                if entry.get("state") not in STATES:
                    raise ValueError(f"claims.{uid}.state: unknown state {entry.get('state')!r}")
                entries[uid] = ClaimEntry(**entry)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # A checkpoint that cannot be read must not keep the plugin down (the kubelet
            # prepares again what it needs); keep the file for a post-mortem.
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            self.path.rename(aside)
            log.error("checkpoint %s is unreadable (%s): moved to %s, starting empty",
                      self.path, exc, aside.name)
            return
        self._entries = entries

    def get(self, uid: str) -> ClaimEntry | None:
        return self._entries.get(uid)

    def entries(self) -> list[ClaimEntry]:
        return [self._entries[uid] for uid in sorted(self._entries)]

    def commit(self, uid: str, entry: ClaimEntry | None) -> None:
        """Set (or with None, drop) one claim's entry and persist before returning.

        The one place the state changes, so the file and memory never disagree: memory is
        updated only after the file is safely replaced.
        """
        entries = dict(self._entries)
        if entry is None:
            entries.pop(uid, None)
        else:
            if entry.uid != uid:
                raise CheckpointError(f"entry for {uid} carries uid {entry.uid}")
            entries[uid] = entry
        data = {"version": FORMAT_VERSION,
                "claims": {k: asdict(v) for k, v in sorted(entries.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n")
        self._entries = entries
