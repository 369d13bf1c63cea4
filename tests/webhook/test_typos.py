"""What /mutate tells whoever creates a pod with a typo in a resource name (admission warnings,
which kubectl prints as "Warning: ..."), and a pod with several bad amounts (one refusal naming
every one); and that the webhook configuration sends such a pod at all."""

from __future__ import annotations

from typing import Any

import cel
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.typos import WARNING_LIMIT
from dra_gateway.webhook.config import match_expression

from .conftest import review

Client = TestClient[web.Request, web.Application]


def _pod(*containers: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
            "spec": {"containers": [{"name": name, "image": "x", "resources": {"limits": limits}}
                                    for name, limits in containers]}}


async def _mutate(client: Client, pod: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/mutate", data=orjson.dumps(review(pod, uid="u-1")),
                             headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = orjson.loads(await resp.read())["response"]
    return answer


async def test_a_pod_asking_for_a_typo_is_admitted_with_a_warning_saying_what_was_meant(
        client: Client) -> None:
    answer = await _mutate(client, _pod(("main", {"nvidia.com/gpu-typo": "1", "cpu": "1"})))
    assert answer == {"uid": "u-1", "allowed": True, "warnings": [
        'container "main": nvidia.com/gpu-typo: no dra-gateway rule reads it; did you mean '
        "nvidia.com/gpu?"]}


async def test_a_translated_pod_is_warned_about_the_typo_beside_its_legacy_names(
        client: Client) -> None:
    answer = await _mutate(client, _pod(("main", {"nvidia.com/gpu": "1",
                                                  "nvidia.com/gpumemory": "1000"})))
    assert answer["allowed"] is True
    assert answer["patch"]
    assert answer["warnings"] == [
        'container "main": nvidia.com/gpumemory: no dra-gateway rule reads it; did you mean '
        "nvidia.com/gpumem?"]
    assert all(len(w) <= WARNING_LIMIT and "\n" not in w for w in answer["warnings"])


async def test_a_refused_pod_is_told_every_bad_amount_and_its_typos_at_once(
        client: Client) -> None:
    answer = await _mutate(client, _pod(
        ("a", {"nvidia.com/gpu": "1.5", "nvidia.com/gpumem": "-3"}),
        ("b", {"nvidia.com/gpu": "x", "nvidia.com/gpucore": "50"})))
    assert answer["allowed"] is False
    assert answer["status"] == {"code": 403, "reason": "Forbidden", "message": (
        '2 containers are refused: container "a": 2 problems: nvidia.com/gpu is 1.5, not a '
        "whole number; ask for whole units; nvidia.com/gpumem is -3, a negative amount (rule "
        'hami); container "b": nvidia.com/gpu: invalid quantity "x": a quantity starts with a '
        'number, e.g. "40Gi" or "500m" (rule nvidia-gpu)')}
    assert answer["warnings"] == [
        'container "b": nvidia.com/gpucore: no dra-gateway rule reads it; did you mean '
        "nvidia.com/gpucores?"]


def test_the_match_condition_sends_a_pod_asking_only_for_a_typo_under_a_rules_domain() -> None:
    rules = load_rules()
    expression = match_expression(rules)

    def sent(limits: dict[str, str]) -> bool:
        result = cel.evaluate(expression, {"object": _pod(("main", limits))})
        assert isinstance(result, bool)
        return result

    assert sent({"nvidia.com/gpu-typo": "1"})
    assert sent({"volcano.sh/vgpu-memroy": "1"})
    assert not sent({"example.com/fpga": "1", "cpu": "1"})
    # Every name a rule reads still is, disabled rules' names included.
    assert all(sent({name: "1"}) for name in (*rules.legacy_resource_names(),
                                              *rules.disabled_resources, "nvidia.com/mig-1g.5gb")
               if not name.endswith("*"))
