from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import EXAMPLES

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import Forbidden, NotFound, ObjectList
from dra_gateway.kube.resources import ResourceType
from dra_gateway.webhook.app import create_app
from dra_gateway.webhook.settings import WebhookSettings

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]


def example_pod(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load((EXAMPLES / "pods" / name).read_text())
    return pod


def hami_pod() -> dict[str, Any]:
    return example_pod("hami.yaml")


def plain_pod(namespace: str = "inference") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": namespace},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.27",
                                     "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}}


def deadline_refusal(seconds: str) -> dict[str, Any]:
    """The status of a review cut at its deadline (`review_deadline`, as the message writes it)."""
    return {"code": 503, "reason": "Timeout",
            "message": "the dra-gateway webhook could not read what it needs from the API server "
                       f"within {seconds}s; the object was not admitted and can be retried "
                       "(controllers retry on their own)"}


def review(pod: dict[str, Any], *, uid: str | None = None, operation: str = "CREATE",
           dry_run: bool = False, namespace: str | None = None) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    ns = namespace if namespace is not None else meta.get("namespace", "default")
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": meta.get("name", ""),
        "namespace": ns,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": pod,
        "oldObject": pod if operation == "UPDATE" else None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def decoded_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    answer = response["response"]
    assert answer["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = orjson.loads(base64.b64decode(answer["patch"]))
    return patch


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster()


@pytest.fixture
def settings(tmp_path: Path) -> WebhookSettings:
    return WebhookSettings(namespace="dra-gateway", rules_poll_interval=0.05,
                           watch_retry_delay=0.05)


@pytest.fixture
async def client(aiohttp_client: ClientFactory, settings: WebhookSettings,
                 cluster: MemoryCluster) -> TestClient[web.Request, web.Application]:
    return await aiohttp_client(create_app(settings, cluster))


class RefusedList(MemoryCluster):
    """An API server that refuses the webhook a list of `rt` (Forbidden: RBAC lacks it;
    NotFound: the server does not serve the resource)."""

    def __init__(self, rt: ResourceType, error: type[Forbidden] | type[NotFound]) -> None:
        super().__init__()
        self.rt = rt
        self.error = error

    async def list(self, rt: ResourceType, *, namespace: str | None = None,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> ObjectList:
        if rt is self.rt:
            raise self.error(f'{rt.plural}.{rt.group} is forbidden: User '
                             '"system:serviceaccount:dra-gateway:dra-gateway-webhook" cannot list '
                             f'resource "{rt.plural}"')
        return await super().list(rt, namespace=namespace, label_selector=label_selector,
                                  field_selector=field_selector)
