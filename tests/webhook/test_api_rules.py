"""A translation whose template the API would refuse (kube/api_rules.py) is refused by /mutate,
naming the template and the field, and nothing is created; the translator's own amounts never
make one, so the translation is corrupted here."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES
from dra_gateway.webhook import mutation

from .conftest import hami_pod, review

Client = TestClient[web.Request, web.Application]


async def test_a_template_with_a_negative_capacity_request_is_never_created(
        client: Client, cluster: MemoryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    real = mutation.translate

    def corrupted(*args: Any, **kwargs: Any) -> Any:
        plan = copy.deepcopy(real(*args, **kwargs))
        for template in plan.templates:
            exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
            exactly["capacity"]["requests"]["memory"] = "-1Gi"
        return plan

    monkeypatch.setattr(mutation, "translate", corrupted)
    resp = await client.post("/mutate", data=orjson.dumps(review(hami_pod())))
    assert resp.status == 200
    answer = orjson.loads(await resp.read())["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    message = answer["status"]["message"]
    assert message.startswith("the pod's translation is not one the API accepts "
                              "(ResourceClaimTemplate ")
    assert ("spec.spec.devices.requests[0].exactly.capacity.requests[memory]: -1Gi must be "
            "greater than or equal to 0") in message
    assert cluster.objects(RESOURCE_CLAIM_TEMPLATES) == []
