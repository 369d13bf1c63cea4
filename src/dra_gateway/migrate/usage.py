"""What a namespace's live GPU pods hold in each world, in GPUQuota terms, for `migrate plan`.

While a namespace moves, its GPUQuota counts both worlds together (policy.legacyusage): the
pods a legacy device plugin serves, charged what their translation would cost, and the pods the
webhook translated, whose claims the allocator counts. The plan shows the two apart. A
translated pod's claims are not in a dump of pods, so its cost is read from what the webhook
recorded it translated (the annotation dra-gateway.io/translated keeps each container's
legacy requests), translated again by the same rules.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from dra_gateway.kube import names, objects
from dra_gateway.policy.amounts import DeviceCharge
from dra_gateway.policy.legacyusage import keeps_legacy_gpus, pod_charges
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import translated_claim_specs

World = Literal["legacy", "translated"]


def _restored(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod as it was before the webhook translated it (its recorded legacy requests put
    back), None when the record cannot be read."""
    try:
        record = json.loads(objects.annotations(pod)[names.ANNOTATION_TRANSLATED])
    except (KeyError, TypeError, ValueError):
        return None
    containers = record.get("containers") if isinstance(record, dict) else None
    if not isinstance(containers, dict):
        return None
    restored = copy.deepcopy(dict(pod))
    meta = restored.setdefault("metadata", {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k != names.ANNOTATION_TRANSLATED}
    spec = restored.setdefault("spec", {})
    spec.pop("resourceClaims", None)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            entry = containers.get(container.get("name"))
            resources = container.setdefault("resources", {})
            resources.pop("claims", None)
            if not isinstance(entry, dict):
                continue
            for part in ("limits", "requests"):
                if isinstance(entry.get(part), dict):
                    resources.setdefault(part, {}).update(entry[part])
    return restored


def _amounts(charges: Iterable[DeviceCharge]) -> dict[str, int]:
    listed = list(charges)
    return {"pods": 1, "devices": len({c.key for c in listed}),
            "memory": sum(c.memory for c in listed), "cores": sum(c.cores for c in listed)}


def usage_by_world(pods: Iterable[Mapping[str, Any]], rules: RuleSet
                   ) -> dict[tuple[str, World], dict[str, int]]:
    """(namespace, world) -> pods, devices, memory (bytes) and cores its live GPU pods hold.
    Whole cards count no memory here (their size is the card's, unknown in a dump)."""
    out: dict[tuple[str, World], dict[str, int]] = {}
    for pod in pods:
        if objects.status(pod).get("phase") in ("Succeeded", "Failed"):
            continue
        world: World
        if names.ANNOTATION_TRANSLATED in objects.annotations(pod):
            source = _restored(pod)
            world = "translated"
        else:
            source = dict(pod) if keeps_legacy_gpus(pod) else None
            world = "legacy"
        if source is None:
            continue
        charges = pod_charges(source, translated_claim_specs(source, rules))
        if not charges:
            continue
        total = out.setdefault((objects.namespace(pod) or "default", world),
                               {"pods": 0, "devices": 0, "memory": 0, "cores": 0})
        for field, amount in _amounts(charges).items():
            total[field] += amount
    return out


__all__ = ["World", "usage_by_world"]
