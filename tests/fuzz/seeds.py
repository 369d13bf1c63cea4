"""Seed inputs for the fuzz targets, built from the repository's own examples and rule sets.

A campaign starts from these besides the committed corpus, so that the fuzzer mutates real
inputs instead of discovering JSON and YAML byte by byte:

- /mutate: an AdmissionReview of every pod in examples/ (a workload's pod template as the pod
  its controller would create), at CREATE, one at UPDATE and one as a dry run;
- /validate: the same reviews, and each pod as /validate gets it after /mutate's patch;
- rules: every built-in rules file and every example rules file, as written and one rule each.

`python -m fuzz.seeds TARGET FOLDER` writes them to FOLDER, one file each. This module must not
import atheris.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import orjson
import yaml

from .targets import REPOSITORY, TARGETS, Webhook

EXAMPLES = REPOSITORY / "examples"
POD_FOLDERS = ("pods", "pods-other-vendors", "demo")
RULE_FOLDERS = (REPOSITORY / "translator" / "builtin", EXAMPLES / "rules")


def _pods_in(node: Any) -> Iterator[dict[str, Any]]:
    """Pods and pod templates anywhere in a manifest (Deployment, Job, CronJob, PyTorchJob)."""
    if isinstance(node, dict):
        spec = node.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("containers"), list):
            yield {"apiVersion": "v1", "kind": "Pod", "metadata": dict(node.get("metadata") or {}),
                   "spec": spec}
            return
        for value in node.values():
            yield from _pods_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pods_in(value)


def example_pods() -> list[tuple[str, dict[str, Any]]]:
    """(name, pod) for every pod of the example manifests, in file order."""
    out = []
    for folder in POD_FOLDERS:
        for path in sorted((EXAMPLES / folder).glob("*.yaml")):
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
            for i, pod in enumerate(p for doc in docs for p in _pods_in(doc)):
                out.append((f"{folder}-{path.stem}-{i}", pod))
    return out


def review_body(pod: dict[str, Any], *, uid: str, operation: str = "CREATE",
                dry_run: bool = False) -> bytes:
    """An AdmissionReview of `pod` as the API server sends it to a webhook."""
    meta = pod.get("metadata") or {}
    group_version = {"group": "", "version": "v1"}
    request = {
        "uid": uid,
        "kind": {**group_version, "kind": "Pod"},
        "resource": {**group_version, "resource": "pods"},
        "requestKind": {**group_version, "kind": "Pod"},
        "requestResource": {**group_version, "resource": "pods"},
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", "default"),
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                     "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": pod,
        "oldObject": pod if operation == "UPDATE" else None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1",
                    "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions"},
    }
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": request})


def _uid(name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def webhook_seeds(target: str, webhook: Webhook) -> dict[str, bytes]:
    """Seeds of "mutate" or "validate"; `webhook` patches the pods /validate gets."""
    out: dict[str, bytes] = {}
    pods = example_pods()
    for name, pod in pods:
        out[name] = review_body(pod, uid=_uid(name))
    first_name, first = pods[0]
    out[f"{first_name}-update"] = review_body(first, uid=_uid(first_name + "u"),
                                              operation="UPDATE")
    out[f"{first_name}-dry-run"] = review_body(first, uid=_uid(first_name + "d"), dry_run=True)
    if target == "validate":
        for name, pod in pods:
            webhook.reset()
            status, answer = webhook.post("/mutate", out[name])
            response = orjson.loads(answer)["response"] if status == 200 else {}
            if "patch" in response:
                patch = orjson.loads(base64.b64decode(response["patch"]))
                out[f"{name}-mutated"] = review_body(jsonpatch.apply_patch(pod, patch),
                                                     uid=_uid(name + "m"))
    return out


def rules_seeds() -> dict[str, bytes]:
    """Every rules file as written, and each rule of it alone in a document of its own: a
    built-in file is many times slower to load than one rule, and a campaign then runs as many
    times fewer inputs."""
    out = {}
    for folder in RULE_FOLDERS:
        for path in sorted(folder.glob("*.yaml")):
            out[f"{folder.name}-{path.stem}"] = path.read_bytes()
            for doc in yaml.safe_load_all(path.read_text()):
                rules = doc.get("rules") if isinstance(doc, dict) else None
                for i, rule in enumerate(rules if isinstance(rules, list) else ()):
                    alone = {**doc, "rules": [rule]}
                    alone.pop("overrides", None)
                    out[f"{folder.name}-{path.stem}-{i}"] = yaml.safe_dump(
                        alone, sort_keys=False, width=100).encode()
    return out


def seeds(target: str, webhook: Webhook | None = None) -> dict[str, bytes]:
    """Seeds of `target` by name; the webhook ones need `webhook`."""
    if target == "rules":
        return rules_seeds()
    if webhook is None:
        raise ValueError(f"the {target} seeds need a Webhook")
    return webhook_seeds(target, webhook)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    webhook = None if args.target == "rules" else Webhook()
    try:
        for name, data in seeds(args.target, webhook).items():
            (args.folder / name).write_bytes(data)
    finally:
        if webhook is not None:
            webhook.close()


if __name__ == "__main__":
    main()
