"""One home per default: each component's flags default to its settings' values, and the
chart's values, which become those flags, say the same (a chart value equal to the default is
what a user reads as "the default")."""

from __future__ import annotations

import argparse
from typing import Any

import yaml
from testkit import REPOSITORY

from dra_gateway.allocator import cli as allocator_cli
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.kube import arguments
from dra_gateway.node_plugin import cli as node_plugin_cli
from dra_gateway.node_plugin.coexistence import CoexistenceSettings
from dra_gateway.node_plugin.plugin import PluginSettings
from dra_gateway.webhook import cli as webhook_cli
from dra_gateway.webhook.settings import WebhookSettings

VALUES = yaml.safe_load((REPOSITORY / "helm" / "dra-gateway" / "values.yaml").read_text())


def _defaults(register: Any, *command: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    extra = {"node-plugin": ["--inventory", "x.yaml", "--node-name", "n"],
             "webhook": ["--tls-dir", "certs"]}.get(command[0], [])
    return parser.parse_args([*command, *extra])


def test_the_allocators_flags_and_values_default_to_its_settings() -> None:
    settings, flags = ControllerSettings(), _defaults(allocator_cli.register, "allocator")
    values = VALUES["allocator"]
    assert (flags.strategy, values["strategy"]) == (settings.strategy,) * 2
    assert (flags.workers, values["workers"]) == (settings.workers,) * 2
    defrag = values["defrag"]
    for flag, value, setting in [
            (flags.defrag_after, defrag["after"], settings.defrag_after),
            (flags.defrag_interval, defrag["interval"], settings.defrag_interval),
            (flags.defrag_hold, defrag["hold"], settings.defrag_hold),
            (flags.defrag_window, defrag["window"], settings.defrag_window)]:
        assert flag == arguments.duration(value) == setting
    assert flags.defrag_moves_per_hour == defrag["movesPerHour"] == settings.defrag_moves_per_hour
    assert flags.defrag_moves_per_pod == defrag["movesPerPod"] == settings.defrag_moves_per_pod
    assert values["preemption"]["enabled"] == settings.preemption
    assert values["healthEviction"]["enabled"] == settings.health_eviction


def test_the_webhooks_flags_and_values_default_to_its_settings() -> None:
    settings, flags = WebhookSettings(), _defaults(webhook_cli.register, "webhook")
    assert flags.review_deadline == settings.review_deadline
    assert flags.pod_opt_out == settings.pod_opt_out
    assert flags.gated_event_after == settings.gated_event_after \
        == VALUES["webhook"]["gatedEventAfterSeconds"]


def test_the_node_plugins_flags_and_values_default_to_its_settings() -> None:
    # The node plugin's flags keep literal defaults (its settings' module is heavy and
    # `--help` must stay instant): this is where they are held to the settings.
    settings = PluginSettings(node_name="n")
    flags = _defaults(node_plugin_cli.register, "node-plugin", "serve")
    coexistence = CoexistenceSettings()
    assert flags.recovery_seconds == settings.recovery_seconds \
        == VALUES["nodePlugin"]["recoverySeconds"]
    assert flags.admin_check_seconds == settings.admin_check_seconds \
        == VALUES["nodePlugin"]["adminCheckSeconds"]
    assert flags.legacy_poll_interval == coexistence.poll_seconds
    assert flags.legacy_node_interval == coexistence.node_seconds
