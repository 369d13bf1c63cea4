"""The rules in force, reloaded without a restart from `--rules` files and labelled ConfigMaps.

`RuleStore` keeps the last good `RuleSet` and the source documents it was built from. A change
(a file's mtime/inode/size, a ConfigMap event) builds a candidate set from every source with the
change applied; when the translator refuses it, the change is logged, counted and reported as a
Warning Event on the ConfigMap, and the previous set stays in force. Each ConfigMap keeps its
own last good data, so one broken ConfigMap never takes another's rules out of force.

ConfigMaps are read by a list and a watch through the cluster port, in the gateway's namespace,
selected by `dra-gateway.io/rules=true`; an expired watch relists, any other failure relists
after a pause. Files are polled: inotify misses the symlink swaps of mounted volumes.

The last good rules live only in memory, so replicas could disagree: one restarted after a
broken ConfigMap would serve without it while older ones serve the admin's. `problems` lists
every labelled ConfigMap whose rules are not in force as written (refused, or deleted while
others still depend on it); readiness stays false while it is not empty, so no replica serves
rules that differ from the ConfigMaps. `check_config_map` is the same load, asked before a
ConfigMap is written: the validating webhook refuses a broken one with the load error (field
paths included), as Kyverno refuses a broken policy.

Listeners (`on_change`) run after each accepted change; the app uses them to drop cached plans
and to reconcile the webhook configurations' matchConditions. This module must not translate
pods or answer reviews.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import CONFIG_MAPS, EVENTS
from dra_gateway.translator.rules import (
    RulesError,
    RuleSet,
    Source,
    config_map_label,
    load_rules,
)
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.mirroring import mirror
from dra_gateway.webhook.settings import WebhookSettings

log = logging.getLogger(__name__)

Listener = Callable[[RuleSet], Awaitable[None]]
_FileStamp = tuple[tuple[str, int, int, int], ...]
_EVENT_MESSAGE_LIMIT = 1024  # the API server truncates longer Event messages anyway
COMPONENT = "dra-gateway-webhook"


def _stamp(path: Path) -> _FileStamp:
    """What changes when a rules file or folder is rewritten or swapped."""
    try:
        entries = sorted(path.iterdir()) if path.is_dir() else [path]
    except OSError:
        return ()
    out = []
    for entry in entries:
        try:
            st = entry.stat()
        except OSError:
            continue
        out.append((entry.name, st.st_mtime_ns, st.st_ino, st.st_size))
    return tuple(out)


class RuleStore:
    def __init__(self, settings: WebhookSettings, cluster: Cluster, metrics: Metrics) -> None:
        self._settings = settings
        self._cluster = cluster
        self._metrics = metrics
        self.rules: RuleSet | None = None
        self.generation = 0
        self.listeners: list[Listener] = []
        self.on_synced: Callable[[], None] | None = None  # after the first ConfigMap list
        self._config_maps: dict[str, dict[str, str]] = {}  # name -> last good data
        self._refused: dict[str, dict[str, str]] = {}  # name -> data refused (reported once)
        self._errors: dict[str, str] = {}  # name -> why its rules are not in force as written
        # Deleted while others still needed them: in force until a change loads without them.
        self._deleted: set[str] = set()
        self._file_error: str | None = None  # a restarted replica would not even start
        self._stamps: dict[Path, _FileStamp] = {}
        self._lock = asyncio.Lock()

    @property
    def selector(self) -> str:
        return f"{names.RULES_LABEL}={names.RULES_LABEL_VALUE}"

    @property
    def problems(self) -> list[str]:
        """Why the rules in force differ from the labelled ConfigMaps; empty when they do not."""
        ns = self._settings.namespace
        out = [f"rules ConfigMap {ns}/{name} not in force: {self._errors[name]}"
               for name in sorted(self._errors)]
        if self._file_error is not None:
            out.append(f"--rules files refused: {self._file_error}")
        return out

    def check_config_map(self, name: str, data: Mapping[str, str] | None) -> RulesError | None:
        """The error loading the rules would meet with ConfigMap `name` written as `data`
        (None: deleted), the others as they are in force; None when they would load."""
        candidate = {k: v for k, v in self._live().items() if k != name}
        if data is not None:
            candidate[name] = {str(k): str(v) for k, v in data.items()}
        try:
            self._build(candidate)
        except RulesError as exc:
            return exc
        return None

    def _live(self) -> dict[str, dict[str, str]]:
        """The ConfigMaps as they are in the cluster (pending deletions left out)."""
        return {k: v for k, v in self._config_maps.items() if k not in self._deleted}

    def _build(self, config_maps: Mapping[str, Mapping[str, str]]) -> RuleSet:
        # Labelled, so that an error names its ConfigMap: rule ConfigMaps often share key names
        # such as rules.yaml, and a conflict is reported at one ConfigMap about another.
        ns = self._settings.namespace
        sources: list[Source] = [*self._settings.rules_paths,
                                 *((config_map_label(ns, name), config_maps[name])
                                   for name in sorted(config_maps))]
        return load_rules(*sources, builtin=self._settings.builtin_rules)

    def load_files(self) -> RuleSet:
        """The first load from files (and built-ins); raises RulesError, which stops startup."""
        self._stamps = {p: _stamp(p) for p in self._settings.rules_paths}
        rules = self._build(self._config_maps)
        self._commit(rules, "file")
        return rules

    def _commit(self, rules: RuleSet, source: str) -> None:
        self.rules = rules
        self.generation += 1
        self._metrics.rule_reloads.labels(source).inc()
        self._metrics.rules_loaded.set(len(rules.rules))
        log.info("translation rules in force",
                 extra={"rules": list(rules.rule_names), "generation": self.generation,
                        "source": source})

    async def _notify(self) -> None:
        rules = self.rules
        assert rules is not None
        for listener in self.listeners:
            try:
                await listener(rules)
            except Exception:
                log.exception("a rules listener failed", extra={"generation": self.generation})

    # ---- files -------------------------------------------------------------------------------

    async def poll_files(self) -> None:
        """Reload when a `--rules` file or folder changes; runs until cancelled."""
        while True:
            await asyncio.sleep(self._settings.rules_poll_interval)
            await self.check_files()

    async def check_files(self) -> bool:
        stamps = {p: _stamp(p) for p in self._settings.rules_paths}
        if stamps == self._stamps:
            return False
        # Recorded even when the load fails: a broken file is reported once, not every poll.
        self._stamps = stamps
        async with self._lock:
            # Computed once: the pending deletions these rules leave out must stay out of
            # `_config_maps` once `_deleted` is cleared, or the next change brings them back.
            live = self._live()
            try:
                rules = self._build(live)
            except RulesError as exc:
                self._metrics.rule_reload_failures.labels("file").inc()
                log.error("rules files refused, the previous rules stay in force",
                          extra={"error": str(exc), "generation": self.generation})
                self._file_error = str(exc)
                return False
            self._file_error = None
            for gone in self._deleted:
                self._errors.pop(gone, None)
            self._deleted.clear()
            self._config_maps = live
            self._commit(rules, "file")
        await self._notify()
        return True

    # ---- ConfigMaps --------------------------------------------------------------------------

    async def watch_config_maps(self) -> None:
        """List and watch the rule ConfigMaps; runs until cancelled."""
        await mirror(self._cluster, CONFIG_MAPS, what="rules ConfigMap",
                     retry_delay=self._settings.watch_retry_delay, listed=self._listed,
                     changed=self.config_map_changed, deleted=self.config_map_deleted,
                     namespace=self._settings.namespace, label_selector=self.selector)

    async def _listed(self, items: list[Object]) -> None:
        await self.sync(items)
        if self.on_synced is not None:
            self.on_synced()

    async def sync(self, items: list[Object]) -> None:
        """Bring the sources in line with a full list of the rule ConfigMaps."""
        present = {item["metadata"]["name"] for item in items}
        for item in sorted(items, key=lambda i: str(i["metadata"]["name"])):
            await self.config_map_changed(item)
        for name in sorted(set(self._config_maps) - present):
            await self.config_map_deleted({"metadata": {"name": name}})

    async def config_map_changed(self, config_map: Object) -> bool:
        name = config_map["metadata"]["name"]
        data = {str(k): str(v) for k, v in (config_map.get("data") or {}).items()}
        if self._config_maps.get(name) == data or self._refused.get(name) == data:
            return False  # nothing new: already in force, or already refused and reported
        async with self._lock:
            # Without the ConfigMaps deleted meanwhile: the rules a restarted replica would load.
            candidate = {**self._live(), name: data}
            try:
                rules = self._build(candidate)
            except RulesError as exc:
                self._refused[name] = data
                self._errors[name] = "refused, see its Warning Events"
                await self._refuse(config_map, exc)
                return False
            self._refused.pop(name, None)
            self._errors.pop(name, None)
            self._adopt(candidate, rules)
        await self._notify()
        return True

    async def config_map_deleted(self, config_map: Object) -> bool:
        name = config_map["metadata"]["name"]
        self._refused.pop(name, None)
        self._errors.pop(name, None)
        if name not in self._config_maps:
            return False
        async with self._lock:
            candidate = {k: v for k, v in self._live().items() if k != name}
            try:
                rules = self._build(candidate)
            except RulesError as exc:
                # Another ConfigMap depended on this one (an override of its rule, say): the
                # rules in force stay until the dependants are fixed.
                self._metrics.rule_reload_failures.labels("configmap").inc()
                log.error("removing a rules ConfigMap would break the others; the previous rules "
                          "stay in force", extra={"configmap": name, "error": str(exc)})
                self._errors[name] = ("deleted, but the rules in force still hold it: the "
                                      "others fail without it")
                self._deleted.add(name)
                return False
            self._adopt(candidate, rules)
        await self._notify()
        return True

    def _adopt(self, config_maps: dict[str, dict[str, str]], rules: RuleSet) -> None:
        """Put in force the rules loaded from these ConfigMaps: the deletions they leave out
        are done, and so are the errors of those."""
        for gone in self._deleted:
            self._errors.pop(gone, None)
        self._deleted.clear()
        self._config_maps = config_maps
        self._commit(rules, "configmap")

    async def _refuse(self, config_map: Object, exc: RulesError) -> None:
        meta = config_map["metadata"]
        ns = meta.get("namespace") or self._settings.namespace
        message = (f"rules in ConfigMap {ns}/{meta['name']} refused, the previous rules stay in "
                   f"force: {exc}")
        self._metrics.rule_reload_failures.labels("configmap").inc()
        log.error("rules ConfigMap refused, the previous rules stay in force",
                  extra={"configmap": f"{ns}/{meta['name']}", "error": str(exc),
                         "generation": self.generation})
        try:
            await self._cluster.create(EVENTS, rules_refused_event(config_map, message),
                                       namespace=ns)
        except ApiError as err:
            log.warning("cannot record an Event for a refused rules ConfigMap",
                        extra={"configmap": f"{ns}/{meta['name']}", "error": err.message})


def rules_refused_event(config_map: Object, message: str, *,
                        now: datetime | None = None) -> dict[str, Any]:
    """A core/v1 Warning Event about `config_map` (kubectl describe shows it)."""
    meta = config_map["metadata"]
    ns = meta.get("namespace") or ""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns,
                                "name": meta["name"]}
    for key, field in (("uid", "uid"), ("resourceVersion", "resourceVersion")):
        if meta.get(key):
            involved[field] = meta[key]
    if len(message) > _EVENT_MESSAGE_LIMIT:
        message = message[:_EVENT_MESSAGE_LIMIT - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}", "namespace": ns},
        "involvedObject": involved,
        "reason": "RulesRefused",
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
