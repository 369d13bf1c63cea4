"""A card that fails is taken out of service and comes back on its own (node-plugin/health.py).

The tier's node plugins follow a fault file each (`--fault-file`) and lift a recovered card's
mark after `RECOVERY_S` seconds. A Deployment of one legacy `nvidia.com/gpu` pod, pinned to the
demo's H100 node, gets a card; then that card falls off the bus (XID 79, fatal):

- where the API server keeps device taints (1.36 on; the node plugins ask it, as the chart's
  `deviceTaints: auto` has them do): the card is published with a `NoExecute`
  taint, kube-controller-manager's device taint eviction deletes the pod, and the Deployment's
  replacement is placed on another card of the node, never the tainted one;
- before (1.34 and 1.35 by default): the card is withheld from the slice and the Node's
  condition `GpuDevicesUnhealthy` lists it (fatal, withheld); the gateway's allocator evicts the
  pod through the Eviction API (allocator/eviction/drain.py) with a DisruptionTarget condition
  and an Event naming the card and fault, and the replacement is placed on another card.

Either way the Node's condition lists the card; once the fault file says it recovered, the
condition gives the time it will be healthy again; within the recovery period it is published
again, untainted, and the condition says every device is healthy. The module leaves no pod,
claim or namespace behind, and every card healthy.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    KEEP_ANNOTATION,
    DeviceMark,
    node_marks,
)
from e2e.support import (
    RECOVERY_S,
    Gateway,
    fault_file,
    pod_devices,
    pods,
    remove_namespace,
    wait_until,
)
from e2e.test_preemption import NODE, _wait_for_free_cards

JSON = dict[str, Any]
RESOURCE = "resource.k8s.io/v1"
NS = "device-health"
PLACE_S = 60.0
APP = "trainer"


@pytest.fixture
def api(gateway: Gateway) -> Iterator[Api]:
    api = gateway.api
    _wait_for_free_cards(gateway, api)
    api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": NS}})
    try:
        yield api
    finally:
        with contextlib.suppress(ApiError):
            api.delete(path_of("apps/v1", "deployments", namespace=NS, name=APP),
                       propagation="Background")
        remove_namespace(gateway, NS, timeout_s=PLACE_S)


def _deployment(replicas: int) -> JSON:
    labels = {"app": APP}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": APP, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "nodeSelector": {"kubernetes.io/hostname": NODE},
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "example.com/cuda:1",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def _placed(api: Api) -> dict[str, str]:
    """Live pods of the Deployment placed on NODE: name -> the card each holds."""
    found = {}
    for pod in pods(api, NS):
        if pod["metadata"].get("deletionTimestamp") or pod["spec"].get("nodeName") != NODE:
            continue
        held = [device for node, device, _ in pod_devices(api, pod) if node == NODE]
        if held:
            found[pod["metadata"]["name"]] = held[0]
    return found


def _published(api: Api) -> dict[str, list[JSON]]:
    """NODE's published devices: name -> their taints."""
    return {d["name"]: list(d.get("taints") or ())
            for s in api.list(path_of(RESOURCE, "resourceslices"))
            if s["spec"].get("nodeName") == NODE and s["spec"].get("driver") == names.DRIVER
            for d in s["spec"].get("devices") or ()}


def _condition(api: Api) -> JSON:
    node = api.get(path_of("v1", "nodes", name=NODE))
    return next((c for c in node["status"].get("conditions") or ()
                 if c["type"] == "GpuDevicesUnhealthy"), {})


def _marks(api: Api) -> list[DeviceMark]:
    return node_marks(api.get(path_of("v1", "nodes", name=NODE)))


def _pod_events(api: Api, pod: str, reason: str) -> list[str]:
    return [e["message"] for e in api.list(path_of("v1", "events", namespace=NS))
            if e["involvedObject"].get("name") == pod and e["reason"] == reason]


def _fault(gateway: Gateway, event: JSON) -> None:
    with fault_file(gateway, NODE).open("a") as stream:
        stream.write(json.dumps(event) + "\n")


def test_a_card_that_falls_off_the_bus_is_drained_and_comes_back(
        gateway: Gateway, api: Api) -> None:
    api.create(path_of("apps/v1", "deployments", namespace=NS), _deployment(1))
    wait_until("the trainer to be placed", lambda: len(_placed(api)) == 1, PLACE_S,
               gateway.check)
    ((first, card),) = _placed(api).items()
    _fault(gateway, {"device": card, "event": "xid", "code": 79})

    if gateway.device_taints:
        def tainted() -> bool:
            return [t["effect"] for t in _published(api).get(card, ())] == ["NoExecute"]

        wait_until(f"{card} to be tainted NoExecute", tainted, PLACE_S, gateway.check)
        (taint,) = _published(api)[card]
        assert (taint["key"], taint["value"]) == (f"{names.DRIVER}/unhealthy", "xid-79")
    else:
        wait_until(f"{card} to be withheld", lambda: card not in _published(api), PLACE_S,
                   gateway.check)
        # The gateway drains it: the pod is told why, then evicted.
        wait_until(f"an Event on {first} naming {card}", lambda: any(
            card in m and "xid-79" in m for m in _pod_events(api, first, "UnhealthyDevice")),
            PLACE_S, gateway.check)

    def replaced() -> bool:
        placed = _placed(api)
        return first not in placed and len(placed) == 1

    wait_until("the evicted trainer's replacement to be placed", replaced, PLACE_S,
               gateway.check)
    (other,) = _placed(api).values()
    assert other != card
    # The Node lists the card, what was done to it, and (once it came back) when it is
    # healthy again.
    (mark,) = [m for m in _marks(api) if m.device == card]
    assert (mark.reason, mark.severity, mark.healthy_at) == ("xid-79", "fatal", "")
    assert mark.action == ("tainted NoExecute" if gateway.device_taints else "withheld")

    _fault(gateway, {"device": card, "event": "recovered"})
    started = time.monotonic()
    wait_until(f"the Node to say when {card} is healthy again", lambda: any(
        m.device == card and m.healthy_at for m in _marks(api)), PLACE_S, gateway.check)

    def healthy() -> bool:
        return _published(api).get(card) == []

    wait_until(f"{card} to be published again without a taint", healthy, PLACE_S,
               gateway.check)
    assert time.monotonic() - started >= RECOVERY_S - 1
    wait_until("the Node to say every device is healthy",
               lambda: _condition(api).get("status") == "False", PLACE_S, gateway.check)
    # Operators are told on the Node: what hit the card and what that did, then its recovery.
    def node_events() -> list[tuple[str, str]]:
        return [(e["reason"], e["message"]) for e in api.list(
            path_of("v1", "events", namespace="default"))
            if e["involvedObject"].get("kind") == "Node"
            and e["involvedObject"].get("name") == NODE and card in e["message"]]

    wait_until(f"Events on Node {NODE} about {card}", lambda: {r for r, _ in node_events()} >= {
        "DeviceUnhealthy", "DeviceHealthy"}, PLACE_S, gateway.check)
    [unhealthy] = [m for r, m in node_events() if r == "DeviceUnhealthy"]
    assert "xid-79 (fatal fault)" in unhealthy
    assert ("tainted NoExecute" if gateway.device_taints else "withheld") in unhealthy


def _devices(gateway: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_gateway", "devices", *args,
         "--kubeconfig", str(gateway.plane.admin_kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False)


def test_an_administrator_brings_a_failed_card_back_and_keeps_another_out(
        gateway: Gateway, api: Api) -> None:
    """`dra-gateway devices`: a card that fell off the bus and never came back is brought back
    by `clear` (the node plugin reads its Node's annotation), and a card kept beforehand with
    `keep` stays out past the recovery that would otherwise bring it back; `list` shows both."""
    failed, flaky = sorted(_published(api))[:2]
    try:
        kept = _devices(gateway, "keep", NODE, flaky)
        assert kept.returncode == 0, kept.stderr
        _fault(gateway, {"device": failed, "event": "xid", "code": 79})
        _fault(gateway, {"device": flaky, "event": "xid", "code": 94})  # degraded
        wait_until("both cards marked, the kept one as kept", lambda: {
            (m.device, m.kept) for m in _marks(api)} == {(failed, False), (flaky, True)},
            PLACE_S, gateway.check)
        listed = _devices(gateway, "list", NODE, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        rows = {r["device"]: r for r in json.loads(listed.stdout)}
        assert (rows[failed]["fault"], rows[failed]["healthyAt"]) == (
            "xid-79", "when the card comes back")
        assert (rows[flaky]["fault"], rows[flaky]["healthyAt"]) == ("xid-94", "kept")

        cleared = _devices(gateway, "clear", NODE, failed)
        assert cleared.returncode == 0, cleared.stderr
        wait_until(f"{failed} to be published again without a taint",
                   lambda: _published(api).get(failed) == [], PLACE_S, gateway.check)
        # Well past its recovery period, the kept card is still out of service.
        time.sleep(RECOVERY_S + 2)
        assert [m.device for m in _marks(api)] == [flaky]
        assert _devices(gateway, "unkeep", NODE, flaky).returncode == 0
        wait_until(f"{flaky} to recover once unkept", lambda: _marks(api) == [], PLACE_S,
                   gateway.check)
    finally:
        _fault(gateway, {"device": failed, "event": "recovered"})
        with contextlib.suppress(ApiError):
            api.patch(path_of("v1", "nodes", name=NODE), {"metadata": {"annotations": {
                CLEAR_ANNOTATION: None, KEEP_ANNOTATION: None}}})
        wait_until("every card healthy again", lambda: _marks(api) == [], PLACE_S,
                   gateway.check)
