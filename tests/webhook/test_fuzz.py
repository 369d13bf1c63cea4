"""Thousands of mangled reviews: every answer is a one-line 400 or a well-formed response."""

from __future__ import annotations

import base64
import copy
import json
import random
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.webhook.app import STATE

from .conftest import hami_pod, plain_pod, review

Client = TestClient[web.Request, web.Application]

SEED = 20251129
ROUNDS = 2500

_JUNK: list[Any] = [None, True, 0, -1, 2**70, 1.5, "", "x", "CREATE", "nvidia.com/gpu", [], [1],
                    {}, {"a": None}, [{"name": None}], {"limits": {"nvidia.com/gpu": "-1"}},
                    {"nvidia.com/gpu": "1e400"}, {"nvidia.com/gpumem": "abc"}, "🙂" * 3]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mangle(rng: random.Random, body: dict[str, Any]) -> bytes:
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(body) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent: Any = body
        for key in path[:-1]:
            parent = parent[key]
        action = rng.random()
        if action < 0.3 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.9:
            parent[path[-1]] = copy.deepcopy(rng.choice(_JUNK))
        elif isinstance(parent, dict):
            parent[rng.choice(["extra", "request", "object", "spec"])] = rng.choice(_JUNK)
    raw = json.dumps(body).encode()
    if rng.random() < 0.1:
        cut = rng.randrange(len(raw))
        raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1:]
    if rng.random() < 0.05:
        raw = raw[:rng.randrange(len(raw))]
    return raw


def _check_response(raw: bytes, sent: bytes, endpoint: str) -> None:
    data = orjson.loads(raw)
    assert data["apiVersion"] == "admission.k8s.io/v1"
    assert data["kind"] == "AdmissionReview"
    answer = data["response"]
    assert set(answer) <= {"uid", "allowed", "patch", "patchType", "status", "warnings",
                           "auditAnnotations"}
    assert orjson.loads(sent)["request"]["uid"] == answer["uid"]
    assert isinstance(answer["allowed"], bool)
    if "patch" in answer:
        assert endpoint == "/mutate"
        assert answer["allowed"] is True
        assert answer["patchType"] == "JSONPatch"
        assert isinstance(orjson.loads(base64.b64decode(answer["patch"], validate=True)), list)
    else:
        assert "patchType" not in answer
    if not answer["allowed"]:
        status = answer["status"]
        assert isinstance(status["code"], int)
        assert 400 <= status["code"] < 600
        assert isinstance(status["reason"], str)
        assert status["reason"]
        assert isinstance(status["message"], str)
        assert "Traceback" not in status["message"]
    for warning in answer.get("warnings", ()):
        assert isinstance(warning, str)


async def test_every_mangled_review_gets_a_400_or_a_well_formed_answer(client: Client) -> None:
    rng = random.Random(SEED)
    seeds = [review(hami_pod()), review(plain_pod()), review(hami_pod(), operation="UPDATE")]
    counts = {400: 0, 200: 0}
    for i in range(ROUNDS):
        endpoint = "/mutate" if i % 2 == 0 else "/validate"
        sent = _mangle(rng, rng.choice(seeds))
        resp = await client.post(endpoint, data=sent)
        raw = await resp.read()
        assert resp.status in counts, (resp.status, raw, sent)
        counts[resp.status] += 1
        if resp.status == 400:
            text = raw.decode()
            assert text.endswith("\n")
            assert "\n" not in text[:-1]
            assert "Traceback" not in text
        else:
            _check_response(raw, sent, endpoint)
    # Both kinds of answer were exercised, and nothing crashed inside a decision.
    assert counts[400] > ROUNDS // 10
    assert counts[200] > ROUNDS // 10
    metrics = client.app[STATE].metrics
    crashes = sum(metrics.internal_errors.labels(e)._value.get() for e in ("mutate", "validate"))
    assert crashes == 0
