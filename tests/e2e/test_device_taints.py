"""Devices an administrator taints with a DeviceTaintRule (served and on by default from
Kubernetes 1.37), on a real control plane whose kube-controller-manager runs its device taint
eviction controller.

A rule taints every card of the demo's H100 node `gpu-h100-1` with `NoExecute`; pods are pinned
to that node by its hostname:

- a pod asking for `nvidia.com/gpu` (its translated claim tolerates nothing) gets no card and
  stays gated while the rule stands, and is placed within seconds of the rule's deletion;
- a pod whose own ResourceClaimTemplate tolerates the taint's key without naming an effect is
  placed on a tainted card, the toleration copied into its allocation. From 1.38 such a
  toleration tolerates NoExecute in kube-controller-manager's eviction too, and the pod keeps
  running; 1.37's eviction controller still asked for the effect and deletes it (upstream's
  change, which the gateway follows: kube-scheduler of every release places such a claim).

The module leaves no pod, claim, rule or namespace behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    Gateway,
    namespace_state,
    pod_devices,
    remove_namespace,
    wait_until,
)
from e2e.test_preemption import NODE, _wait_for_free_cards

JSON = dict[str, Any]
RESOURCE = "resource.k8s.io/v1"
NS = "device-taints"
RULE = "e2e-maintenance"
KEY = "example.com/maintenance"
PLACE_S = 60.0
WATCH_S = 8.0  # how long a pod must stay unplaced, or placed and not evicted
EVICTION = "DeviceTaintManagerEviction"  # the reason of the eviction controller's Event


def _minor(gateway: Gateway) -> int:
    return int(gateway.version.split(".")[1])


@pytest.fixture
def api(gateway: Gateway) -> Iterator[Api]:
    api = gateway.api
    try:
        api.list(path_of(RESOURCE, "devicetaintrules"))
    except ApiError as exc:
        if exc.code == 404:
            pytest.skip(f"Kubernetes {gateway.version} does not serve DeviceTaintRules "
                        f"({RESOURCE}, from 1.37)")
        raise
    _wait_for_free_cards(gateway, api)
    api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": NS}})
    try:
        yield api
    finally:
        with contextlib.suppress(ApiError):
            api.delete(path_of(RESOURCE, "devicetaintrules", name=RULE))
        remove_namespace(gateway, NS, timeout_s=PLACE_S)


def _rule() -> JSON:
    return {"apiVersion": RESOURCE, "kind": "DeviceTaintRule", "metadata": {"name": RULE},
            "spec": {"deviceSelector": {"driver": names.DRIVER, "pool": NODE},
                     "taint": {"key": KEY, "value": "drain", "effect": "NoExecute"}}}


def _pod(name: str, *, legacy: bool) -> JSON:
    container: JSON = {"name": "main", "image": "example.com/cuda:1"}
    spec: JSON = {"nodeSelector": {"kubernetes.io/hostname": NODE},
                  "terminationGracePeriodSeconds": 0, "containers": [container]}
    if legacy:
        container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    else:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "tolerant"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def _tolerant_template() -> JSON:
    return {"apiVersion": RESOURCE, "kind": "ResourceClaimTemplate",
            "metadata": {"name": "tolerant", "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": names.GPU_CLASS,
                # No effect: every effect, NoExecute included.
                "tolerations": [{"key": KEY, "operator": "Exists"}]}}]}}}}


def _get(api: Api, name: str) -> JSON | None:
    try:
        return api.get(path_of("v1", "pods", namespace=NS, name=name))
    except ApiError as exc:
        if exc.code == 404:
            return None
        raise


def _state(api: Api) -> str:
    """The namespace's pods and claims, and the events that matter, for a failure."""
    events = [f"event {e['involvedObject'].get('name')} {e.get('reason')}: {e.get('message')}"
              for e in api.list(path_of("v1", "events", namespace=NS))
              if e.get("type") == "Warning" or e.get("reason") == EVICTION]
    return "\n".join([namespace_state(api, NS), *events])


def _wait(gateway: Gateway, api: Api, what: str, ready: Callable[[], bool]) -> None:
    try:
        wait_until(what, ready, PLACE_S, gateway.check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{_state(api)}") from None


def _evictions(api: Api) -> set[str]:
    """The pods kube-controller-manager's device taint eviction deleted (its Events)."""
    return {e["involvedObject"].get("name")
            for e in api.list(path_of("v1", "events", namespace=NS))
            if e.get("reason") == EVICTION}


def _placed(api: Api, name: str) -> bool:
    pod = _get(api, name)
    return bool(pod and (pod.get("spec") or {}).get("nodeName") == NODE
                and pod_devices(api, pod))


def test_a_tainted_card_waits_for_a_toleration_and_one_without_an_effect_keeps_its_pod(
        gateway: Gateway, api: Api) -> None:
    api.create(path_of(RESOURCE, "devicetaintrules"), _rule())
    api.create(path_of(RESOURCE, "resourceclaimtemplates", namespace=NS), _tolerant_template())
    api.create(path_of("v1", "pods", namespace=NS), _pod("plain", legacy=True))
    api.create(path_of("v1", "pods", namespace=NS), _pod("tolerant", legacy=False))

    if _minor(gateway) >= 38:
        seen: list[JSON] = []

        def tolerant_allocated() -> bool:
            for claim in api.list(path_of(RESOURCE, "resourceclaims", namespace=NS)):
                allocation = (claim.get("status") or {}).get("allocation")
                if claim["metadata"]["name"].startswith("tolerant-") and allocation:
                    seen.append(allocation)
            return bool(seen)

        _wait(gateway, api, "the tolerant pod's claim to be allocated on a tainted card",
              tolerant_allocated)
        result = seen[0]["devices"]["results"][0]
        assert result["pool"] == NODE
        assert result["tolerations"] == [{"key": KEY, "operator": "Exists"}]
        _wait(gateway, api, "the tolerant pod to be bound", lambda: _placed(api, "tolerant"))
    else:
        # 1.37's eviction controller matched only a toleration naming NoExecute: it deletes
        # the pod the allocator placed, as it would one kube-scheduler placed.
        _wait(gateway, api, "1.37's eviction controller to delete the tolerant pod",
              lambda: "tolerant" in _evictions(api))

    deadline = time.monotonic() + WATCH_S
    while time.monotonic() < deadline:
        assert not _placed(api, "plain"), "a card tainted NoExecute went to a claim that " \
            "does not tolerate it"
        time.sleep(0.5)
    if _minor(gateway) >= 38:
        assert _placed(api, "tolerant"), _state(api)
        assert "tolerant" not in _evictions(api), _state(api)

    api.delete(path_of(RESOURCE, "devicetaintrules", name=RULE))
    _wait(gateway, api, "the plain pod to be placed once the rule is gone",
          lambda: _placed(api, "plain"))
