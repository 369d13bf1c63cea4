"""The fuzz targets: one function per target from raw bytes to a checked verdict, or an error.

The same targets serve the coverage-guided campaigns (`python -m fuzz.run`, under atheris) and
the replay of the committed corpus (`test_corpus.py`, without atheris), so an input a campaign
kept is checked the same way by every test run afterwards.

- `mutate`, `validate`: the bytes are the body of a POST to the webhook's /mutate or /validate,
  answered by the real aiohttp app (its router, its handler, its parsing and decisions) with
  the GPU policies, DeviceClasses and templates of a small cluster in place. The answer must be
  a one-line 400 or an AdmissionReview response that echoes the uid and carries a refusal
  Status, or a JSONPatch that applies to the pod; nothing may reach the handler's catch-all
  (an internal error is re-raised here with its stack). /mutate's patched pod is sent on to
  /validate, which must judge it as a pod (a patch of ours never makes a pod malformed).
- `rules`: the bytes are the text of a rules ConfigMap key, loaded with the built-in rules.
  Either a `RuleSet` comes back, and a pod asking for every resource its rules read is
  translated without an error and with a patch that applies, or `RulesError` is raised whose
  every line names the ConfigMap key and, below the document level, the field.

A target raises AssertionError (or the escaped exception) on a finding and returns otherwise.
This module must not import atheris: CI replays the corpus without it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, cast

import jsonpatch
import orjson
import yaml
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES
from dra_gateway.translator.rules import RulesError, RuleSet, load_rules
from dra_gateway.translator.translate import translate
from dra_gateway.webhook import mutation
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.settings import MAX_BODY_BYTES, WebhookSettings

Target = Callable[[bytes], None]

REPOSITORY: Final = Path(__file__).resolve().parents[2]

TARGETS: Final = ("mutate", "validate", "rules")

# What the label of the fuzzed ConfigMap key looks like in every load error.
RULES_LABEL: Final = "ConfigMap dra-gateway/fuzz-rules"
RULES_KEY: Final = "rules.yaml"
RULES_SOURCE: Final = f"{RULES_LABEL} key {RULES_KEY}"

# Load errors that concern a whole document, so they name no field. Any other problem must
# carry the path of the field it is about.
DOCUMENT_PROBLEMS: Final = ("not valid YAML (", "a rules document is a mapping ")
# A field path as errors.format_path writes it: a name, then .name, [index] or ["key"] parts.
_KEY = r'\["(?:[^"\\]|\\.)*"\]'
_FIELD_PATH = re.compile(rf"^(?:[A-Za-z_][A-Za-z0-9_]*|{_KEY})"
                         rf"(?:\.[A-Za-z_][A-Za-z0-9_]*|\[-?\d+\]|{_KEY})*: \S")

_RESPONSE_KEYS: Final = frozenset({"uid", "allowed", "patch", "patchType", "status", "warnings",
                                   "auditAnnotations"})

_NAMESPACE: Final = "dra-gateway"
_GATEWAY_CLASSES: Final = ("gpu.dra-gateway.io", "mig.dra-gateway.io")


class Finding(AssertionError):
    """A property of a target does not hold for an input."""


def _namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}}}


def _device_class(name: str, extended_resource: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {
        "expression": f'device.driver == "{names.DRIVER}"'}}]}
    if extended_resource is not None:
        spec["extendedResourceName"] = extended_resource
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": spec}


def _claim(namespace: str, name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount",
                "count": 1}}]}}}


def cluster_objects(examples: Path) -> list[dict[str, Any]]:
    """The small cluster the webhook targets run against: the namespaces the examples use, the
    gateway's DeviceClasses and one that declares amd.com/gpu as its extendedResourceName, the
    example GPU quotas and sharing policies, and claims of a gateway and of another class."""
    objects: list[dict[str, Any]] = []
    namespaces = {"default", "inference", "training", "team-a", "team-b", "students", _NAMESPACE}
    for path in sorted((examples / "policies").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                objects.append(doc)
                namespace = (doc.get("metadata") or {}).get("namespace")
                if namespace:
                    namespaces.add(namespace)
    # Labels the example sharing policies select by.
    labels = {"inference": {"tier": "production"}, "team-a": {"team": "a"},
              "team-b": {"team": "b"}}
    objects[:0] = [_namespace(ns, labels.get(ns)) for ns in sorted(namespaces)]
    objects += [_device_class(name) for name in _GATEWAY_CLASSES]
    objects.append(_device_class("gpu.amd.com", "amd.com/gpu"))
    for namespace in ("default", "inference"):
        objects.append(_claim(namespace, "shared-gpu", _GATEWAY_CLASSES[0]))
        objects.append(_claim(namespace, "fpga", "fpga.example.com"))
    return objects


class _Stacks(logging.Handler):
    """Keeps the records logged with a stack (the handler's catch-all logs an unexpected
    failure with log.exception); prints nothing."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@contextmanager
def _errors_of(logger: logging.Logger) -> Iterator[list[logging.LogRecord]]:
    """Log records with a stack that `logger` emits meanwhile."""
    handler = _Stacks()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        handler.close()


class Webhook:
    """The webhook app on a loop of its own, started as the server starts it, with a cluster
    holding `cluster_objects`; `post` answers one body as the API server would get it."""

    def __init__(self, examples: Path = REPOSITORY / "examples") -> None:
        self.loop = asyncio.new_event_loop()
        # Templates come and go with every input; no watch resumes from their history.
        self.cluster = MemoryCluster(history=100)
        self.loop.run_until_complete(self.cluster.load(cluster_objects(examples)))
        settings = WebhookSettings(namespace=_NAMESPACE, reconcile_webhooks=False,
                                   watch_retry_delay=0.05, rules_poll_interval=3600)
        self.app = create_app(settings, self.cluster)
        self.runner = web.AppRunner(self.app, handle_signals=False)
        self.loop.run_until_complete(self._start())
        self.state = self.app[STATE]
        self._kept_templates = self._templates()
        # The app's own loggers: a stack logged there is a finding, other records are noise.
        # Restored by close(): the replay runs inside the test session, whose other tests
        # read these records through the root logger (caplog).
        self._log = logging.getLogger("dra_gateway")
        self._saved_log = (self._log.propagate, self._log.level)
        self._log.propagate = False
        self._log.setLevel(logging.ERROR)
        self._body = _Body()
        self._request: web.Request | None = None
        self._posts = 0

    async def _start(self) -> None:
        await self.runner.setup()
        state = self.app[STATE]
        await eventually(lambda: state.store.rules is not None and state.config_maps_synced
                         and state.device_classes.synced and state.policies.synced, within=30)

    def _templates(self) -> set[tuple[str, str]]:
        return {(t["metadata"]["namespace"], t["metadata"]["name"])
                for t in self.cluster.objects(RESOURCE_CLAIM_TEMPLATES)}

    def close(self) -> None:
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.run_until_complete(self.cluster.close())
        self.loop.close()
        self._log.propagate, level = self._saved_log
        self._log.setLevel(level)

    def reset(self) -> None:
        """Forget what the last input left (templates it made, cached plans and classes), so
        that each input is answered as the first, and a replay as in the campaign."""
        for namespace, name in self._templates() - self._kept_templates:
            self.loop.run_until_complete(
                self.cluster.delete(RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace))
        self.state.plans = mutation.PlanCache(self.state.settings.plan_cache_size)
        self.state.claim_specs.forget()

    def post(self, endpoint: str, body: bytes) -> tuple[int, bytes]:
        """The status and body of the app's answer to `body` posted to `endpoint`."""
        with _errors_of(self._log) as errors:
            status, answer = self.loop.run_until_complete(self._post(endpoint, body))
        if errors:
            record = errors[0]
            assert record.exc_info is not None
            raise Finding(f"{endpoint}: {record.getMessage()}") from record.exc_info[1]
        return status, answer

    async def _post(self, endpoint: str, body: bytes) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        # make_mocked_request builds a dozen mocks (milliseconds); a clone of one costs
        # microseconds and reads the body from a fresh StreamReader. Its mocks record every
        # call made on them, so it is built again now and then.
        self._posts += 1
        if self._request is None or self._posts % 500 == 0:
            self._request = make_mocked_request(
                "POST", "/", headers={"Content-Type": "application/json"}, app=self.app,
                payload=cast(StreamReader, self._body), client_max_size=MAX_BODY_BYTES, loop=loop)
        self._body.reader = StreamReader(cast(BaseProtocol, _Protocol()), 2**16, loop=loop)
        self._body.reader.feed_data(body)
        self._body.reader.feed_eof()
        request = self._request.clone(rel_url=endpoint)
        match = await self.app.router.resolve(request)
        response = await match.handler(request)
        assert isinstance(response, web.Response)
        answer = response.body
        assert isinstance(answer, bytes), type(answer)
        return response.status, answer


class _Body:
    """The request payload: reads go to the StreamReader of the body being posted."""

    def __init__(self) -> None:
        self.reader: StreamReader | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)


class _Protocol:
    """What a StreamReader asks of its transport's protocol; a fed body needs none of it."""

    _reading_paused = False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, *, resume_parser: bool = True) -> None:
        pass


def _check_bad_request(endpoint: str, answer: bytes) -> None:
    text = answer.decode()
    if not (text.endswith("\n") and "\n" not in text[:-1] and text.strip()):
        raise Finding(f"{endpoint}: a 400 is one line of text, got {text!r}")
    if "Traceback" in text:
        raise Finding(f"{endpoint}: a 400 carries a stack: {text!r}")


def _decoded_patch(endpoint: str, answer: dict[str, Any]) -> list[Any]:
    if answer.get("patchType") != "JSONPatch" or not isinstance(answer.get("patch"), str):
        raise Finding(f"{endpoint}: a patch without patchType JSONPatch: {answer!r}")
    if endpoint != "/mutate" or answer["allowed"] is not True:
        raise Finding(f"{endpoint}: a patch comes only with /mutate's allowed: {answer!r}")
    try:
        patch = orjson.loads(base64.b64decode(answer["patch"], validate=True))
    except (binascii.Error, orjson.JSONDecodeError) as exc:
        raise Finding(f"{endpoint}: the patch is not base64 JSON: {exc}") from exc
    if not isinstance(patch, list) or not patch:
        raise Finding(f"{endpoint}: the patch is not a list of operations: {patch!r}")
    return patch


def check_review_answer(endpoint: str, sent: bytes, status: int, answer: bytes
                        ) -> dict[str, Any] | None:
    """Check one answer of /mutate or /validate; the decoded response when it is a review."""
    if status == 400:
        _check_bad_request(endpoint, answer)
        return None
    if status != 200:
        raise Finding(f"{endpoint}: HTTP {status}, neither 200 nor 400: {answer[:300]!r}")
    review = orjson.loads(answer)
    if review.get("apiVersion") != "admission.k8s.io/v1" or review.get("kind") != \
            "AdmissionReview":
        raise Finding(f"{endpoint}: not an AdmissionReview v1: {answer[:300]!r}")
    response = review.get("response")
    if not isinstance(response, dict) or not set(response) <= _RESPONSE_KEYS:
        raise Finding(f"{endpoint}: the response has unknown fields: {response!r}")
    if response.get("uid") != orjson.loads(sent)["request"]["uid"]:
        raise Finding(f"{endpoint}: the request uid is not echoed: {response.get('uid')!r}")
    if not isinstance(response.get("allowed"), bool):
        raise Finding(f"{endpoint}: allowed is not a boolean: {response!r}")
    if "patch" in response or "patchType" in response:
        _decoded_patch(endpoint, response)
    if not response["allowed"]:
        refusal = response.get("status")
        if not (isinstance(refusal, dict) and isinstance(refusal.get("code"), int)
                and 400 <= refusal["code"] < 600 and isinstance(refusal.get("reason"), str)
                and refusal["reason"] and isinstance(refusal.get("message"), str)
                and refusal["message"].strip()):
            raise Finding(f"{endpoint}: a refusal without code, reason and message: {response!r}")
    messages = [response.get("status", {}).get("message", ""), *response.get("warnings", ())]
    if not all(isinstance(m, str) for m in messages):
        raise Finding(f"{endpoint}: a warning that is not a string: {response!r}")
    if any("Traceback" in m for m in messages):
        raise Finding(f"{endpoint}: a message carries a stack: {messages!r}")
    return response


def _applied(sent: bytes, response: dict[str, Any]) -> dict[str, Any]:
    """The pod of `sent` with /mutate's patch applied; a patch that does not apply is a finding."""
    pod = orjson.loads(sent)["request"]["object"]
    try:
        patched = jsonpatch.apply_patch(pod, _decoded_patch("/mutate", response))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise Finding(f"/mutate: the patch does not apply to the pod: {exc}") from exc
    if not isinstance(patched, dict):
        raise Finding(f"/mutate: the patch makes the pod a {type(patched).__name__}")
    return patched


def webhook_target(webhook: Webhook, endpoint: str) -> Target:
    """The target posting each input to `endpoint` ("/mutate" or "/validate")."""

    def run(data: bytes) -> None:
        webhook.reset()
        status, answer = webhook.post(endpoint, data)
        response = check_review_answer(endpoint, data, status, answer)
        if endpoint != "/mutate" or response is None or "patch" not in response:
            return
        sent = orjson.loads(data)
        sent["request"]["object"] = _applied(data, response)
        chained = orjson.dumps(sent)
        status, answer = webhook.post("/validate", chained)
        if status == 400:
            raise Finding(f"/validate calls the pod /mutate patched malformed: {answer!r}")
        check_review_answer("/validate", chained, status, answer)

    return run


def check_rules_error(exc: RulesError) -> None:
    """Every problem names the fuzzed key, and the field unless it is about a whole document."""
    if not exc.errors or not str(exc).startswith(exc.summary + ": "):
        raise Finding(f"rules: an error without problems or summary: {exc}")
    if sum(exc.failed.values()) < 1 or exc.summary.startswith("nothing"):
        raise Finding(f"rules: an error that counts no failure: {exc.summary!r}")
    for line in exc.errors:
        if "Traceback" in line or "\n" in line:
            raise Finding(f"rules: a problem of more than one line: {line!r}")
        source, _, rest = line.partition(": ")
        # An override of a built-in rule may break that rule, reported where it is defined.
        if not (source == RULES_SOURCE or source.startswith((RULES_SOURCE + "[", "builtin/"))):
            raise Finding(f"rules: a problem that names another source: {line!r}")
        if not rest.strip():
            raise Finding(f"rules: a problem without a message: {line!r}")
        if not (rest.startswith(DOCUMENT_PROBLEMS) or _FIELD_PATH.match(rest)):
            raise Finding(f"rules: a problem that names no field: {line!r}")


def _pod_for(rules: RuleSet) -> dict[str, Any]:
    """A pod with one container per rule, asking for "1" of every resource the rule reads."""
    containers = []
    for i, rule in enumerate(rules.rules):
        limits = dict.fromkeys(rule.exact, "1")
        if rule.pattern is not None:
            limits[rule.pattern + "x"] = "1"
        containers.append({"name": f"c{i}", "image": "busybox",
                           "resources": {"limits": limits}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "fuzz", "namespace": "default"},
            "spec": {"containers": containers or [{"name": "c", "image": "busybox"}]}}


def rules_target(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        rules = load_rules((RULES_LABEL, {RULES_KEY: text}), builtin=False)
    except RulesError as exc:
        check_rules_error(exc)
        return
    pod = _pod_for(rules)
    plan = translate(copy.deepcopy(pod), rules)
    if plan.refusal is not None:
        if not plan.refusal.message.strip() or "Traceback" in plan.refusal.message:
            raise Finding(f"rules: a refusal without a usable message: {plan.refusal!r}")
        return
    if plan.patch:
        try:
            jsonpatch.apply_patch(pod, plan.patch)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise Finding(f"rules: the translation's patch does not apply: {exc}") from exc


def make(name: str) -> tuple[Target, Callable[[], None]]:
    """The target called `name` (one of TARGETS) and what closes it."""
    if name == "rules":
        return rules_target, lambda: None
    if name not in TARGETS:
        raise ValueError(f"no fuzz target {name!r}; the targets are {', '.join(TARGETS)}")
    webhook = Webhook()
    return webhook_target(webhook, f"/{name}"), webhook.close
