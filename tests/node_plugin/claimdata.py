"""Allocated ResourceClaims as the API server returns them, for prepare tests."""

from __future__ import annotations

import json
from typing import Any

from dra_gateway.kube import names

NODE = "gpu-node-1"
UID = "0b9f7c2e-5d1a-4c3b-9e8f-7a6b5c4d3e2f"


def claim(*, uid: str = UID, name: str = "train-gpu-abcde", namespace: str = "ml",
          devices: list[str] | None = None, request: str = "gpu",
          params: dict[str, Any] | None = None, consumed: dict[str, str] | None = None,
          node: str = NODE, in_spec: bool = False,
          recorded: list[dict[str, Any]] | None = None,
          annotation: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`recorded`: the allocator's share record in the allocation (GpuShareAllocation);
    `annotation`: the shares annotation, which anyone who may update the claim can write."""
    results = []
    for device in devices if devices is not None else ["gpu-0"]:
        result: dict[str, Any] = {"request": request, "driver": names.DRIVER, "pool": node,
                                  "device": device}
        if consumed is not None:
            result["consumedCapacity"] = consumed
        results.append(result)
    config = []
    if params is not None:
        config = [{"source": "FromClaim", "requests": [request],
                   "opaque": {"driver": names.DRIVER,
                              "parameters": {"apiVersion": names.API_VERSION,
                                             "kind": names.KIND_GPU_SHARE_CONFIG, **params}}}]
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": request, "exactly": {
            "deviceClassName": names.GPU_CLASS}}],
            "config": [{"requests": c["requests"], "opaque": c["opaque"]} for c in config]
            if in_spec else []}},
        "status": {"allocation": {
            "devices": {"results": results, "config": [] if in_spec else config},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }},
    }
    if recorded is not None:
        obj["status"]["allocation"]["devices"]["config"].append({
            "source": "FromClaim", "requests": sorted({r["request"] for r in recorded}),
            "opaque": {"driver": names.DRIVER, "parameters": {
                "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_ALLOCATION,
                "shares": recorded}}})
    if annotation is not None:
        obj["metadata"]["annotations"] = {names.ANNOTATION_SHARES: json.dumps(annotation)}
    return obj
