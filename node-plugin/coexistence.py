"""Following a legacy device plugin on the node: poll the kubelet, withhold what it may hand out.

`LegacyCoexistence` asks the kubelet's pod-resources API every few seconds (`--legacy-poll-
interval`), lets `legacy.decide` judge, and on any change calls `on_change`, through which the
plugin republishes its slices via the one `Publisher` (so slices stay deterministic), and sets the
metrics; the Node condition `DraGatewayMigration` follows once the slices show the verdict
(`published`), so a node never says DRA before its freed cards can be allocated. Until the first
answer it withholds every card: publishing first and asking after would offer cards a legacy pod
holds.

The Node's status.allocatable and status.capacity are read beside (see `legacy`: the capacity
counts a legacy plugin's Unhealthy devices). A failed read of the Node keeps the status last
read, and is tried again at the next poll: forgetting it would make a legacy plugin whose cards
are all Unhealthy (or names no plugin serves) look absent, and every card would be published
beside it. When the socket cannot be read the Node's status decides alone, and the plugin logs
why once per distinct failure rather than every poll. It
never stops the plugin: every failure is a verdict that withholds enough. It decides nothing
itself and writes nothing but the Node's condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Cluster
from dra_gateway.kube.resources import NODES
from dra_gateway.node_plugin.legacy import Card, KubeletView, Verdict, decide
from dra_gateway.node_plugin.metrics import Metrics
from dra_gateway.node_plugin.podresources import (
    DEFAULT_POD_RESOURCES_SOCKET,
    PodResourcesClient,
    PodResourcesError,
)

log = logging.getLogger(__name__)

STATES = (names.NODE_STATE_LEGACY, names.NODE_STATE_CUTTING_OVER, names.NODE_STATE_DRA)


@dataclass(frozen=True, slots=True)
class CoexistenceSettings:
    # Off only for nodes that never ran a legacy GPU device plugin: every card is then
    # published without asking the kubelet, and no migration condition is written.
    enabled: bool = True
    socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    # Cards come back within this long after their last legacy holder ends.
    poll_seconds: float = 2.0
    timeout_seconds: float = 5.0
    # How often the Node's status.allocatable is read: it shows the legacy names no device
    # plugin serves (Koordinator's, HAMi's memory), which the kubelet's device lists never
    # carry. Slower than the kubelet's polls, which cost the API server nothing.
    node_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.poll_seconds <= 0:
            raise ValueError(f"the legacy poll interval must be positive, not "
                             f"{self.poll_seconds}: use --no-legacy-coexistence to turn it off")


class LegacyCoexistence:
    """The current verdict on legacy devices, kept up to date by `run()`."""

    def __init__(self, settings: CoexistenceSettings, cluster: Cluster, *, node_name: str,
                 cards: Callable[[], Sequence[Card]], on_change: Callable[[], None],
                 published: Callable[[], Awaitable[object]] | None = None,
                 metrics: Metrics | None = None, client: PodResourcesClient | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        """`published` returns once the slices show the devices `on_change` last set (None: the
        condition is written as the verdict changes, for callers that publish nothing)."""
        self.settings = settings
        self._cluster = cluster
        self._node_name = node_name
        self._cards = cards
        self._on_change = on_change
        self._published = published
        self._metrics = metrics or Metrics()
        self._client = client or PodResourcesClient(settings.socket,
                                                    timeout_seconds=settings.timeout_seconds)
        self._clock = clock
        # What the last poll learnt, so that new facts (a rediscovery) are judged at once.
        self._view: KubeletView | None = None
        self._node_allocatable: Mapping[str, str] | None = None
        self._node_capacity: Mapping[str, str] | None = None
        self._node_read_at: float | None = None
        self._error = ""
        self._asked = False
        self.verdict: Verdict | None = None
        self._reported: tuple[str, str] | None = None  # (state, message) on the Node
        self._unreported = asyncio.Event()  # a verdict waits to be written on the Node
        self._transition = ""
        self._logged_error = ""

    def withheld(self) -> frozenset[str]:
        """Devices not to publish (and not to prepare): every one until the first answer."""
        if not self.settings.enabled:
            return frozenset()
        if self.verdict is None:
            return frozenset(d for card in self._cards() for d in card.devices)
        return self.verdict.withheld

    def refresh(self) -> bool:
        """Judge the last answers again against the node's cards now; True when that changed
        the verdict (the caller republishes)."""
        if not self.settings.enabled or not self._asked:
            return False
        verdict = decide(cards=self._cards(), kubelet=self._view,
                         node_allocatable=self._node_allocatable,
                         node_capacity=self._node_capacity, kubelet_error=self._error)
        changed = verdict != self.verdict
        self.verdict = verdict
        if changed:
            self._metrics_of(verdict)
            if self._published is not None:
                # Written even when the Node says it already: a write of the verdict before
                # may still be on its way, and would land after.
                self._unreported.set()
        return changed

    async def check(self) -> Verdict | None:
        """One poll: ask the kubelet (or the Node), judge, and apply a changed verdict."""
        if not self.settings.enabled:
            return None
        try:
            self._view, self._error = await self._client.read(), ""
            self._metrics.pod_resources_up.set(1)
        except PodResourcesError as exc:
            self._view, self._error = None, str(exc)
            self._metrics.pod_resources_up.set(0)
        now = asyncio.get_running_loop().time()
        if self._node_read_at is None or self._node_allocatable is None or (
                now - self._node_read_at >= self.settings.node_seconds):
            status = await self._read_node()
            if status is not None:
                self._node_allocatable, self._node_capacity = status
                self._node_read_at = now
            # Else the last status read stands (none before the first read: every card held
            # back where the kubelet cannot say either), and the next poll reads again.
        self._asked = True
        before = self.verdict
        self.refresh()
        verdict = self.verdict
        assert verdict is not None
        if self._error and self._error != self._logged_error:
            self._logged_error = self._error
            log.warning("%s; deciding from the Node's status instead: %s", self._error,
                        verdict.message, extra={"migrationState": verdict.state})
        elif not self._error and self._logged_error:
            self._logged_error = ""
            log.info("the kubelet's pod-resources API at %s answers again",
                     self.settings.socket)
        if before is None or before.state != verdict.state or (
                before.withheld != verdict.withheld):
            log.info("node %s is in state %s: %s", self._node_name, verdict.state,
                     verdict.message,
                     extra={"migrationState": verdict.state,
                            "withheldDevices": len(verdict.withheld)})
            self._on_change()
        if self._published is None:
            await self._report(verdict)
        elif self._reported != (verdict.state, verdict.message):
            self._unreported.set()  # for `run()`'s reporter, once the slices show it
        return verdict

    async def _read_node(self) -> tuple[Mapping[str, str], Mapping[str, str]] | None:
        """The Node's status.allocatable and status.capacity; None when it cannot be read."""
        try:
            node = await self._cluster.get(NODES, self._node_name)
        except ApiError as exc:
            log.warning("could not read Node %s to judge legacy GPU devices: %s (%s)",
                        self._node_name, exc.message, exc.reason)
            return None
        except (OSError, TimeoutError) as exc:
            log.warning("could not read Node %s to judge legacy GPU devices: %r",
                        self._node_name, exc)
            return None
        status = node.get("status") or {}
        return ({str(k): str(v) for k, v in (status.get("allocatable") or {}).items()},
                {str(k): str(v) for k, v in (status.get("capacity") or {}).items()})

    def _metrics_of(self, verdict: Verdict) -> None:
        for state in STATES:
            self._metrics.migration_state.labels(state).set(1 if state == verdict.state else 0)
        self._metrics.legacy_held_cards.set(len(verdict.held_cards))
        self._metrics.legacy_withheld_devices.set(len(verdict.withheld))

    def _condition(self, verdict: Verdict) -> dict[str, Any]:
        now = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        if self._reported is None or self._reported[0] != verdict.state or not self._transition:
            self._transition = now
        return {"type": names.NODE_MIGRATION_CONDITION, "status": "True",
                "reason": verdict.state, "message": verdict.message,
                "lastHeartbeatTime": now, "lastTransitionTime": self._transition}

    async def _report(self, verdict: Verdict) -> None:
        # Written on change only: a poll every two seconds must not become a Node write.
        if self._reported == (verdict.state, verdict.message):
            return
        condition = self._condition(verdict)
        try:
            await self._cluster.patch(NODES, self._node_name,
                                      {"status": {"conditions": [condition]}},
                                      patch_type="strategic", subresource="status")
        except (ApiError, OSError, TimeoutError) as exc:
            # Tried again at the next poll; the metric says the state meanwhile.
            log.warning("could not set condition %s on Node %s: %s",
                        names.NODE_MIGRATION_CONDITION, self._node_name,
                        f"{exc.message} ({exc.reason})" if isinstance(exc, ApiError)
                        else repr(exc))
            return
        self._reported = (verdict.state, verdict.message)

    async def run(self) -> None:
        """Poll until cancelled; the first poll is the caller's (`check`), before publishing.
        With `published`, the condition is written beside the polls, once the slices show the
        verdict: the polls go on meanwhile (a legacy pod that starts is withheld at once)."""
        reporter = (asyncio.create_task(self._report_published(), name="migration-condition")
                    if self._published is not None else None)
        try:
            while True:
                await asyncio.sleep(self.settings.poll_seconds)
                try:
                    await self.check()
                except Exception:  # a bug here must not end the following, nor the plugin
                    log.exception("checking legacy GPU devices failed unexpectedly; the last "
                                  "verdict stands and the next poll tries again")
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reporter
            await self._client.close()

    async def _report_published(self) -> None:
        """Write each verdict on the Node once the slices show it; one overtaken by a newer
        verdict while its slices were being written is skipped for the newer one."""
        assert self._published is not None
        while True:
            await self._unreported.wait()
            self._unreported.clear()
            verdict = self.verdict
            try:
                await self._published()
                if verdict is not None and verdict == self.verdict:
                    await self._report(verdict)
            except Exception:  # a bug here must not end the reporting, nor the plugin
                log.exception("writing the migration condition failed unexpectedly; the next "
                              "poll tries again")
