"""`dra-gateway smoke`: ask a running webhook to translate a legacy GPU pod, and check it did.

What `helm test` runs (the chart's templates/tests/): it sends the webhook Service one
AdmissionReview of a pod asking for `nvidia.com/gpu: 1`, marked dry-run so that the webhook
creates nothing (`sideEffects: NoneOnDryRun`), and checks the answer: allowed, with a JSON patch
that gives the pod resource claims and leaves no legacy GPU resource in any container. It needs no
API rights and no GPU. It talks to the webhook directly, not through the API server (a dry-run pod
create would need the right to create pods in a namespace the webhook serves), so it proves the
webhook pods, their Service, certificate and rules, not the API server's webhook configuration.

It must not decide anything about pods: what a translated pod looks like is the webhook's.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import uuid
from collections.abc import Mapping
from typing import Any

from dra_gateway.kube import arguments

LEGACY_RESOURCE = "nvidia.com/gpu"


def legacy_pod(namespace: str) -> dict[str, Any]:
    """A pod as a Deployment written for NVIDIA's device plugin would create it."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "dra-gateway-smoke", "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "dra-gateway-smoke"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "cuda", "image": "dra-gateway-smoke:never-pulled",
                                     "resources": {"limits": {LEGACY_RESOURCE: "1"}}}]}}


def review(pod: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """A dry-run CREATE review of `pod`, as the API server sends it."""
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    resource = {"group": "", "version": "v1", "resource": "pods"}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "kind": kind, "resource": resource,
                        "requestKind": kind, "requestResource": resource,
                        "name": pod["metadata"]["name"], "namespace": namespace,
                        "operation": "CREATE", "dryRun": True,
                        "userInfo": {"username": "dra-gateway-smoke"},
                        "object": dict(pod), "oldObject": None,
                        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def problems(pod: Mapping[str, Any], answer: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """What is wrong with the webhook's `answer` to `pod` (nothing: translated), and the pod
    the answer's patch makes."""
    response = answer.get("response")
    if not isinstance(response, Mapping):
        return [f"the answer has no response: {json.dumps(answer)[:300]}"], dict(pod)
    if response.get("allowed") is not True:
        status = response.get("status") or {}
        return [f"the pod was refused ({status.get('code')} {status.get('reason')}): "
                f"{status.get('message')}"], dict(pod)
    if not response.get("patch"):
        warnings = "; ".join(response.get("warnings") or []) or "none"
        return [f"the pod was admitted unchanged (warnings: {warnings}): no translation rule "
                f"took {LEGACY_RESOURCE}"], dict(pod)
    import jsonpatch  # here, not at the top: `dra-gateway --help` stays instant

    operations = json.loads(base64.b64decode(response["patch"]))
    patched: dict[str, Any] = jsonpatch.apply_patch(dict(pod), operations)
    found: list[str] = []
    spec = patched.get("spec") or {}
    if not spec.get("resourceClaims"):
        found.append("the translated pod has no spec.resourceClaims")
    for index, c in enumerate(spec.get("containers") or []):
        resources = c.get("resources") or {}
        for section in ("limits", "requests"):
            if LEGACY_RESOURCE in (resources.get(section) or {}):
                found.append(f"spec.containers[{index}].resources.{section} still asks for "
                             f"{LEGACY_RESOURCE}")
        if not resources.get("claims"):
            found.append(f"spec.containers[{index}].resources.claims is empty")
    return found, patched


def _context(ca_file: str | None, ca_env: str | None) -> ssl.SSLContext:
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)
    text = os.environ.get(ca_env or "", "")
    if not text:
        raise ValueError(f"no CA: environment variable {ca_env} is empty; give --ca-file")
    if "-----BEGIN" not in text:
        text = base64.b64decode(text).decode()
    return ssl.create_default_context(cadata=text)


def run(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    url = args.webhook_url.rstrip("/") + "/mutate"
    pod = legacy_pod(args.namespace)
    try:
        context = _context(args.ca_file, args.ca_env)
    except (ValueError, OSError, ssl.SSLError) as exc:
        return arguments.error(f"the webhook's CA: {exc}", 2)
    request = urllib.request.Request(url, data=json.dumps(review(pod, args.namespace)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout, context=context) as reply:
            answer = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return arguments.error(
            f"no answer from the webhook at {url}: {exc}; check that its pods are ready "
            "(kubectl get pods,endpointslices in the gateway's namespace) and their logs", 1)
    found, patched = problems(pod, answer)
    if found:
        return arguments.error(f"FAILED: the webhook at {url} did not translate a pod asking for "
                               f"{LEGACY_RESOURCE}: " + "; ".join(found), 1)
    claims = [c.get("resourceClaimTemplateName") or c.get("name")
              for c in patched["spec"]["resourceClaims"]]
    gates = [g.get("name") for g in patched["spec"].get("schedulingGates") or []]
    print(f"smoke: ok: the webhook at {url} translated a pod asking for {LEGACY_RESOURCE}: 1 "
          f"into resource claims {claims}, legacy limits removed, scheduling gates {gates} "
          "(dry run: nothing was created)")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "smoke", help="check that a running webhook translates a legacy GPU pod (helm test)",
        description="Send the webhook one dry-run AdmissionReview of a pod asking for "
                    f"{LEGACY_RESOURCE}: 1 and check that it comes back translated: resource "
                    "claims, no legacy limits. Exit 0 when it does, 1 when not, 2 on bad options.")
    parser.add_argument("--webhook-url", required=True, metavar="URL",
                        help="base URL of the webhook, "
                             "e.g. https://dra-gateway-webhook.dra-gateway.svc")
    ca = parser.add_mutually_exclusive_group(required=True)
    ca.add_argument("--ca-file", metavar="FILE",
                    help="PEM file of the CA that signed the webhook's certificate")
    ca.add_argument("--ca-env", metavar="VARIABLE",
                    help="environment variable holding that CA (PEM, or its base64)")
    arguments.namespace_option(parser, default="default",
                               help="namespace the pod is reviewed in (default: %(default)s); "
                               "nothing is created")
    parser.add_argument("--timeout", type=arguments.positive_duration, default=10.0,
                        metavar="DURATION", help=arguments.duration_help(
                            "how long to wait for the webhook's answer", 10.0))
    parser.set_defaults(func=run)

