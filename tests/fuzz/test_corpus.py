"""The committed fuzz corpus replayed through the fuzz targets, without atheris.

Every input a campaign kept (`hack/fuzz.sh`) and every regression input must still hold the
targets' properties, so a bug the fuzzer found once stays found. The checks themselves are
tested here too: a target that could not fail would pass any corpus.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from dra_gateway.translator.rules import RulesError
from dra_gateway.webhook import mutation
from dra_gateway.webhook.reviews import encode_patch

from .seeds import seeds
from .targets import (
    RULES_LABEL,
    RULES_SOURCE,
    TARGETS,
    Finding,
    Webhook,
    check_review_answer,
    check_rules_error,
    rules_target,
    webhook_target,
)

CORPUS = Path(__file__).parent / "corpus"


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    app = Webhook()
    yield app
    app.close()


@pytest.mark.parametrize("name", TARGETS)
def test_every_committed_input_still_holds_its_targets_properties(name: str,
                                                                  webhook: Webhook) -> None:
    folder = CORPUS / name
    files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    assert files, f"{folder.relative_to(CORPUS.parents[2])} is empty: run hack/fuzz.sh {name}"
    target = rules_target if name == "rules" else webhook_target(webhook, f"/{name}")
    failed = []
    for path in files:
        try:
            target(path.read_bytes())
        except Exception as exc:
            failed.append(f"{path.name}: {type(exc).__name__}: {exc}")
    assert failed == []


@pytest.mark.parametrize("name", TARGETS)
def test_the_seeds_hold_the_targets_properties(name: str, webhook: Webhook) -> None:
    target = rules_target if name == "rules" else webhook_target(webhook, f"/{name}")
    built = seeds(name, webhook)
    assert len(built) >= 10
    for data in built.values():
        target(data)


def _review(uid: str = "u-1") -> bytes:
    return orjson.dumps({"request": {"uid": uid}})


def _answer(response: dict[str, object]) -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "response": response})


@pytest.mark.parametrize(("status", "answer", "found"), [
    (500, b"oops\n", "HTTP 500"),
    (400, b"two\nlines\n", "one line"),
    (400, b"Traceback (most recent call last)\n", "a stack"),
    (200, _answer({"uid": "u-2", "allowed": True}), "uid is not echoed"),
    (200, _answer({"uid": "u-1", "allowed": "yes"}), "not a boolean"),
    (200, _answer({"uid": "u-1", "allowed": False}), "without code, reason and message"),
    (200, _answer({"uid": "u-1", "allowed": False, "status": {
        "code": 500, "reason": "InternalError", "message": "Traceback (most recent..."}}),
     "a stack"),
    (200, _answer({"uid": "u-1", "allowed": True, "patchType": "JSONPatch",
                   "patch": base64.b64encode(b"{}").decode()}), "not a list of operations"),
    (200, _answer({"uid": "u-1", "allowed": True, "extra": 1}), "unknown fields"),
])
def test_the_review_checks_find_a_broken_answer(status: int, answer: bytes, found: str) -> None:
    with pytest.raises(Finding, match=found):
        check_review_answer("/mutate", _review(), status, answer)


def test_a_failure_inside_a_decision_is_a_finding_with_its_stack(
        webhook: Webhook, monkeypatch: pytest.MonkeyPatch) -> None:
    # The handler turns it into a well-formed refusal; the target must still report it.
    def broken(*args: object, **kwargs: object) -> mutation.Mutation:
        raise KeyError("spec")

    monkeypatch.setattr(mutation, "decide", broken)
    body = next(iter(seeds("mutate", webhook).values()))
    with pytest.raises(Finding, match="admission review failed") as caught:
        webhook_target(webhook, "/mutate")(body)
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_patch_that_does_not_apply_is_a_finding(webhook: Webhook,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = mutation.Mutation(patch=encode_patch(
        [{"op": "remove", "path": "/spec/no-such-field"}]))
    monkeypatch.setattr(mutation, "decide", lambda *args, **kwargs: wrong)
    body = next(iter(seeds("mutate", webhook).values()))
    with pytest.raises(Finding, match="does not apply"):
        webhook_target(webhook, "/mutate")(body)


@pytest.mark.parametrize(("errors", "found"), [
    ([f"{RULES_SOURCE}: rules[0].device: required"], None),
    ([f"{RULES_SOURCE}: not valid YAML (line 1: found undefined alias 'x')"], None),
    ([f"{RULES_SOURCE}[1]: kind: must be 'TranslationRules', not \"x\""], None),
    (['builtin/nvidia.yaml: rules[0].resources["nvidia.com/gpu"].unit: bad'], None),
    ([f"{RULES_SOURCE}: something is wrong"], "names no field"),
    (["another.yaml: rules[0]: bad"], "names another source"),
    ([f"{RULES_SOURCE}: rules[0]: two\nlines"], "more than one line"),
])
def test_the_rules_checks_want_every_problem_to_name_its_source_and_field(
        errors: list[str], found: str | None) -> None:
    error = RulesError(errors, {"rule": 1})
    if found is None:
        check_rules_error(error)
    else:
        with pytest.raises(Finding, match=found):
            check_rules_error(error)


def test_a_rules_error_is_checked_and_good_rules_are_translated() -> None:
    assert RULES_SOURCE.startswith(RULES_LABEL)
    rules_target(b"apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\nrules: [{}]\n")
    rules_target((CORPUS.parents[2] / "examples" / "rules" / "new-vendor.yaml").read_bytes())


def test_a_closed_target_gives_the_package_logger_back_as_it_found_it() -> None:
    # The replay runs inside the test session: a logger left silenced hid the records that
    # later tests read through the root logger (caplog).
    logger = logging.getLogger("dra_gateway")
    before = (logger.propagate, logger.level)
    app = Webhook()
    assert (logger.propagate, logger.level) == (False, logging.ERROR)
    app.close()
    assert (logger.propagate, logger.level) == before
