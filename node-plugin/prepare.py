"""NodePrepareResources and NodeUnprepareResources, independent of gRPC.

Per claim: fetch it through the cluster port, plan it (`claims.plan_claim`), then
checkpoint `PrepareStarted` -> write the CDI spec -> checkpoint `PrepareCompleted`; unprepare
is `UnprepareStarted` -> remove the spec -> drop the entry. Both are idempotent (a completed
claim answers from the checkpoint, an unknown one unprepares as a no-op), failures are per
claim, and `recover()` at start-up repairs whatever a crash left between two states. The gRPC
layer only converts messages; the kubelet's retry does the rest.

MIG on demand (`mig`, a `MigInstances`): a claim allocated devices of a card cut on demand
gets each instance made (journalled, `miginstances.py`) after `PrepareStarted` and before its
CDI spec, which names the new instance's UUID; a prepare that fails anywhere after destroys
what it made and forgets the claim, so the pod is placed again with nothing left behind.
Unprepare destroys them after the spec is gone; `recover()` finishes or undoes both for a claim
a crash left between two states (the journal's own half-made steps first).

A preparer on `hold()` (a node plugin waiting for the state directory's fence, `fence.py`,
while the previous instance still writes the checkpoint) answers every claim with an error
after `HOLD_SECONDS` instead of writing from a checkpoint it read before the other's last
change; `recover()` reads the checkpoint again and lets the calls through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound
from dra_gateway.kube.resources import NODES, RESOURCE_CLAIMS
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.cdi import hami_library_present
from dra_gateway.node_plugin.checkpoint import Checkpoint, ClaimEntry
from dra_gateway.node_plugin.claims import ClaimError, plan_claim
from dra_gateway.node_plugin.devices import DeviceInfo
from dra_gateway.node_plugin.metrics import Metrics
from dra_gateway.node_plugin.miginstances import MigError, MigInstances, Wanted

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
# How long a call waits for a preparer on hold before its claims are answered with an error
# (the kubelet tries again): a rolling update hands over within seconds.
HOLD_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class PrepareResult:
    devices: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


class Preparer:
    def __init__(self, cluster: Cluster, *, node_name: str, cdi_dir: Path, state_dir: Path,
                 devices: Callable[[], Mapping[str, DeviceInfo]], driver: str = names.DRIVER,
                 enforcement: cdi.EnforcementSettings = cdi.DEFAULT_ENFORCEMENT,
                 metrics: Metrics | None = None, mig: MigInstances | None = None,
                 on_mig_failure: Callable[[Sequence[str]], None] | None = None) -> None:
        self._cluster = cluster
        self.node_name = node_name
        self.driver = driver
        self.kind = cdi.cdi_kind(driver)
        self.cdi_dir = cdi_dir
        self.checkpoint = Checkpoint(state_dir / CHECKPOINT_FILE)
        self._devices = devices
        self._enforcement = enforcement
        self._metrics = metrics or Metrics()
        self.mig = mig
        # Told when an instance could not be made: the card may hold what discovery has not
        # seen (an administrator's instance), so the plugin looks again.
        self._on_mig_failure = on_mig_failure
        # One claim at a time: the checkpoint file is rewritten whole on every change.
        self._lock = asyncio.Lock()
        self._open = asyncio.Event()
        self._open.set()

    def hold(self) -> None:
        """Write nothing until `recover()`: another instance may still own the checkpoint."""
        self._open.clear()

    async def _wait_open(self) -> str:
        """"" once calls may go on; else why not, as each claim's error."""
        if self._open.is_set():
            return ""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HOLD_SECONDS):
                await self._open.wait()
        if self._open.is_set():
            return ""
        return (f"another instance of the node plugin still runs on node {self.node_name} "
                "(a rolling update): this one takes over once it stops; try again")

    def recover(self) -> list[str]:
        """Read the checkpoint again (another instance may have written it since this one
        started), finish or roll back what a crash interrupted, and let calls through; returns
        a line per repair. A repair the CDI folder refuses (a read-only or full file system) is
        logged and left for later: the entry stays as it was, so the next start, or the
        kubelet's next prepare of that claim, tries again; the plugin serves meanwhile and says
        on its Node that the folder is not writable (setupreport.py)."""
        self.checkpoint = Checkpoint(self.checkpoint.path)
        repairs: list[str] = []
        if self.mig is not None:
            repairs += self.mig.recover()
        for entry in self.checkpoint.entries():
            ref = f"{entry.namespace}/{entry.name} ({entry.uid})"
            try:
                line = self._repair(entry, ref)
            except MigError as exc:
                log.error("checkpoint: could not destroy the MIG instances of %s: %s; left as "
                          "it was, tried again when the plugin restarts", ref, exc)
                continue
            except OSError as exc:
                log.error("checkpoint: could not repair %s in %s: %s; left as it was, tried "
                          "again when the kubelet prepares the claim or the plugin restarts",
                          ref, self.cdi_dir, exc)
                continue
            if line:
                repairs.append(line)
        for line in repairs:
            log.info("checkpoint: %s", line)
        self._open.set()
        return repairs

    def _repair(self, entry: ClaimEntry, ref: str) -> str:
        """What recovering `entry` did ("" for nothing); OSError where the CDI folder refused,
        before the checkpoint changed."""
        if not objects.is_uid(entry.uid):
            # Never written by prepare, which refuses such UIDs: a tampered checkpoint.
            self.checkpoint.commit(entry.uid, None)
            return f"dropped {ref}: its UID is not in RFC 4122 form"
        if entry.state == "PrepareStarted":
            # The kubelet never got an answer and will prepare again from scratch.
            cdi.remove_spec(self.cdi_dir, self.kind, entry.uid)
            self._destroy_instances(entry.uid)
            self.checkpoint.commit(entry.uid, None)
            return f"rolled back the interrupted prepare of {ref}"
        if entry.state == "UnprepareStarted":
            cdi.remove_spec(self.cdi_dir, self.kind, entry.uid)
            self._destroy_instances(entry.uid)
            self.checkpoint.commit(entry.uid, None)
            return f"finished the interrupted unprepare of {ref}"
        if entry.cdi_spec is not None and not (
                self.cdi_dir / cdi.spec_file_name(self.kind, entry.uid)).exists():
            # /var/run/cdi is a tmpfs: after a reboot the runtime still needs the spec.
            cdi.write_spec(self.cdi_dir, entry.cdi_spec, entry.uid)
            return f"rewrote the missing CDI spec of {ref}"
        return ""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        fetched: list[dict[str, str]] = []
        if held := await self._wait_open():
            self._metrics.prepares.labels("error").inc(len(claims))
            log.warning("prepare deferred: %s", held)
            return {ref.uid: PrepareResult(error=f"ResourceClaim {ref.namespace}/{ref.name}: "
                                                 f"{held}") for ref in claims}

        async def node_labels() -> dict[str, str]:
            # Read once per call, and only for a claim not prepared yet: a kubelet restarting
            # while the API server is unreachable still gets its prepared claims back, and a
            # failed read is that claim's error rather than the whole batch's.
            if not fetched:
                fetched.append(await self._node_labels())
            return fetched[0]

        for ref in claims:
            if not objects.is_uid(ref.uid):
                # It would name the claim's CDI spec file: refuse before anything is read.
                out[ref.uid] = PrepareResult(error=f"ResourceClaim {ref.namespace}/{ref.name}: "
                                             f"{cdi.UnsafeUid(ref.uid)}")
                self._metrics.prepares.labels("error").inc()
                log.warning("prepare refused: %s", out[ref.uid].error)
                continue
            async with self._lock:
                try:
                    out[ref.uid] = PrepareResult(devices=await self._prepare_one(ref, node_labels))
                    self._metrics.prepares.labels("ok").inc()
                except ClaimError as exc:
                    out[ref.uid] = PrepareResult(error=str(exc))
                    self._metrics.prepares.labels("error").inc()
                except MigError as exc:
                    out[ref.uid] = PrepareResult(
                        error=f"ResourceClaim {ref.namespace}/{ref.name}: {exc}")
                    self._metrics.prepares.labels("error").inc()
                except (ApiError, OSError) as exc:
                    message = exc.message if isinstance(exc, ApiError) else str(exc)
                    out[ref.uid] = PrepareResult(
                        error=f"ResourceClaim {ref.namespace}/{ref.name}: {message}")
                    self._metrics.prepares.labels("error").inc()
                except Exception as exc:
                    # A fault with one claim must not fail the kubelet's whole batch (a gRPC
                    # error discards every answer in it): report it on that claim only.
                    log.exception("preparing ResourceClaim %s/%s failed unexpectedly",
                                  ref.namespace, ref.name)
                    out[ref.uid] = PrepareResult(
                        error=f"ResourceClaim {ref.namespace}/{ref.name}: internal error in the "
                              f"node plugin: {exc!r}; see the plugin's log")
                    self._metrics.prepares.labels("error").inc()
            if out[ref.uid].error:
                log.warning("prepare failed: %s", out[ref.uid].error)
        return out

    async def _node_labels(self) -> dict[str, str]:
        try:
            node = await self._cluster.get(NODES, self.node_name)
        except NotFound:
            return {}
        return dict(objects.labels(node))

    async def _prepare_one(self, ref: ClaimRef,
                           node_labels: Callable[[], Awaitable[Mapping[str, str]]]) -> list[
            dict[str, Any]]:
        entry = self.checkpoint.get(ref.uid)
        if entry is not None and entry.state == "PrepareCompleted":
            if entry.cdi_spec is not None and not (
                    self.cdi_dir / cdi.spec_file_name(self.kind, ref.uid)).exists():
                cdi.write_spec(self.cdi_dir, entry.cdi_spec, ref.uid)
            return entry.devices
        try:
            claim = await self._cluster.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)
        except NotFound:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} not found") from None
        table = self._devices()
        to_make = self._to_make(claim, ref, table)
        labels = await node_labels()
        if to_make:
            # Journalled before anything is made: a crash from here on is undone at start.
            self.checkpoint.commit(ref.uid, ClaimEntry(
                uid=ref.uid, namespace=ref.namespace, name=ref.name, state="PrepareStarted"))
        try:
            table = await self._make_instances(ref, table, to_make)
            plan = plan_claim(claim, uid=ref.uid, node_name=self.node_name, node_labels=labels,
                              driver=self.driver, kind=self.kind, devices=table,
                              enforcement=replace(self._enforcement,
                                                  hami_library_present=hami_library_present(
                                                      self._enforcement.hami_library)))
            devices = plan.response_devices(self.kind)
            started = ClaimEntry(uid=ref.uid, namespace=ref.namespace, name=ref.name,
                                 state="PrepareStarted", cdi_spec=plan.cdi_spec)
            self.checkpoint.commit(ref.uid, started)
            if plan.cdi_spec is not None:
                cdi.write_spec(self.cdi_dir, plan.cdi_spec, ref.uid)
        except Exception as exc:
            if to_make:
                # Nothing is left behind: what this prepare made goes, and the claim with it.
                with contextlib.suppress(OSError):
                    cdi.remove_spec(self.cdi_dir, self.kind, ref.uid)
                self._destroy_instances(ref.uid)
                self.checkpoint.commit(ref.uid, None)
                if isinstance(exc, MigError) and self._on_mig_failure is not None:
                    self._on_mig_failure([name for _, name, _ in to_make])
            raise
        self.checkpoint.commit(ref.uid, ClaimEntry(
            uid=ref.uid, namespace=ref.namespace, name=ref.name, state="PrepareCompleted",
            cdi_spec=plan.cdi_spec, devices=devices))
        log.info("prepared ResourceClaim %s/%s: %s", ref.namespace, ref.name,
                 ", ".join(d["device_name"] for d in devices) or "no devices of this driver")
        return devices

    def _to_make(self, claim: Mapping[str, Any], ref: ClaimRef,
                 table: Mapping[str, DeviceInfo]) -> list[tuple[str, str, Wanted]]:
        """(journal key, device, instance) for each device of this node's pool allocated to
        the claim that is made on demand."""
        allocation = (claim.get("status") or {}).get("allocation") or {}
        out = []
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") != self.driver or result.get("pool") != self.node_name:
                continue
            name = str(result.get("device", ""))
            info = table.get(name)
            if info is not None and info.make is not None:
                out.append((f"{ref.uid}/{name}", name, info.make))
        if out and self.mig is None:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: device {out[0][1]} is a "
                             "MIG instance made on demand, and this node plugin makes none "
                             "(its MIG on demand is off)")
        return out

    async def _make_instances(self, ref: ClaimRef, table: Mapping[str, DeviceInfo],
                              to_make: Sequence[tuple[str, str, Wanted]]
                              ) -> Mapping[str, DeviceInfo]:
        """The device table with each instance made and its UUID in place."""
        if not to_make or self.mig is None:
            return table
        made = dict(table)
        for key, name, wanted in to_make:
            instance = await asyncio.to_thread(self.mig.make, key, wanted)
            made[name] = replace(made[name], uuid=instance.uuid,
                                 gpu_instance_id=instance.gi_id,
                                 compute_instance_id=instance.ci_id)
        return made

    def _destroy_instances(self, uid: str) -> None:
        """Destroy every instance made for the claim `uid` (MigError: some stay, journalled)."""
        if self.mig is None:
            return
        for key in self.mig.keys_of(f"{uid}/"):
            self.mig.destroy(key)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID to error ("" on success)."""
        out: dict[str, str] = {}
        if held := await self._wait_open():
            self._metrics.unprepares.labels("error").inc(len(claims))
            log.warning("unprepare deferred: %s", held)
            return {ref.uid: f"ResourceClaim {ref.namespace}/{ref.name}: {held}"
                    for ref in claims}
        for ref in claims:
            async with self._lock:
                try:
                    self._unprepare_one(ref)
                    out[ref.uid] = ""
                    self._metrics.unprepares.labels("ok").inc()
                except cdi.UnsafeUid as exc:
                    out[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name}: {exc}"
                    self._metrics.unprepares.labels("error").inc()
                    log.warning("unprepare refused: %s", out[ref.uid])
                except MigError as exc:
                    out[ref.uid] = f"ResourceClaim {ref.namespace}/{ref.name}: {exc}"
                    self._metrics.unprepares.labels("error").inc()
                    log.warning("unprepare failed: %s", out[ref.uid])
                except OSError as exc:
                    out[ref.uid] = (f"ResourceClaim {ref.namespace}/{ref.name}: removing its "
                                    f"CDI spec failed: {exc}")
                    self._metrics.unprepares.labels("error").inc()
                    log.warning("unprepare failed: %s", out[ref.uid])
        return out

    def _unprepare_one(self, ref: ClaimRef) -> None:
        entry = self.checkpoint.get(ref.uid)
        if entry is None:
            # Never prepared here, or already unprepared: nothing to undo. A stray spec (or
            # MIG instance) from a lost checkpoint is still removed.
            cdi.remove_spec(self.cdi_dir, self.kind, ref.uid)
            self._destroy_instances(ref.uid)
            return
        self.checkpoint.commit(ref.uid, ClaimEntry(
            uid=entry.uid, namespace=entry.namespace, name=entry.name, state="UnprepareStarted",
            cdi_spec=entry.cdi_spec, devices=entry.devices))
        cdi.remove_spec(self.cdi_dir, self.kind, ref.uid)
        self._destroy_instances(ref.uid)
        self.checkpoint.commit(ref.uid, None)
        log.info("unprepared ResourceClaim %s/%s", ref.namespace, ref.name)
