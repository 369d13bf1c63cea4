"""The webhook app's background work: loading the rules, polling rule files, watching rule
ConfigMaps, DeviceClasses, GPU policies and the gateway's ResourceSlices, reloading the serving
certificate, posting Events on pods left gated while no allocator leads, and keeping the webhook
configurations in line with the rules (`config.reconcile`).

It answers no review; `app` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from dra_gateway.translator.rules import RuleSet
from dra_gateway.webhook import config
from dra_gateway.webhook.state import STATE, WebhookState

log = logging.getLogger(__name__)


async def _reconcile(state: WebhookState, rules: RuleSet) -> None:
    if not state.settings.reconcile_webhooks:
        return
    try:
        # Read at every reconcile (the CA rotates); a file gone for a moment must not end the
        # background task, whose error would otherwise surface only at shutdown.
        ca_bundle = state.settings.ca_file.read_bytes() if state.settings.ca_file else None
        updated = await config.reconcile(
            state.cluster, rules, mutating_name=state.settings.mutating_configuration,
            validating_name=state.settings.validating_configuration, ca_bundle=ca_bundle)
    except Exception:
        state.metrics.config_reconciles.labels("failed").inc()
        log.exception("webhook configurations not reconciled")
        return
    for _ in updated:
        state.metrics.config_reconciles.labels("updated").inc()


async def background(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context: start every background task, and end them with the app."""
    state = app[STATE]
    rules = state.store.load_files()
    state.store.listeners.append(functools.partial(_reconcile, state))
    tasks = state.tasks
    if state.settings.rules_paths:
        tasks.append(asyncio.create_task(state.store.poll_files(), name="rules-files"))
    if state.settings.watch_config_maps:
        state.store.on_synced = lambda: setattr(state, "config_maps_synced", True)
        tasks.append(asyncio.create_task(state.store.watch_config_maps(),
                                         name="rules-configmaps"))
    if state.settings.watch_device_classes:
        tasks.append(asyncio.create_task(state.device_classes.run(), name="device-classes"))
    if state.settings.watch_policies:
        tasks.append(asyncio.create_task(state.policies.run(), name="gpu-policies"))
        tasks.append(asyncio.create_task(state.device_profiles.run(), name="device-profiles"))
    if state.tls is not None:
        tasks.append(asyncio.create_task(state.tls.run(), name="certificate-reload"))
    if state.gated_events is not None:
        tasks.append(asyncio.create_task(state.gated_events.run(), name="gated-pod-events"))
    tasks.append(asyncio.create_task(_reconcile(state, rules), name="webhook-configurations"))
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        tasks.clear()
