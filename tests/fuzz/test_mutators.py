"""The structure-aware mutator keeps inputs decodable, changes them, and falls back to bytes."""

from __future__ import annotations

import orjson
import yaml

from .mutators import mutate, vocabulary
from .seeds import rules_seeds

REVIEW = orjson.dumps({"request": {"uid": "u-1", "object": {"spec": {"containers": [
    {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})


def _reversed(data: bytes, max_size: int) -> bytes:
    return data[::-1][:max_size]


def test_most_mutations_of_a_review_are_other_valid_json() -> None:
    outs = [mutate("json", REVIEW, 8192, seed, _reversed) for seed in range(300)]
    structured = [o for o in outs if o != REVIEW[::-1]]
    assert len(structured) > 150
    for out in structured:
        orjson.loads(out)
    assert len({*structured} - {REVIEW}) > 100


def test_rules_documents_are_mutated_as_yaml() -> None:
    seed_text = rules_seeds()["builtin-nvidia-0"]
    outs = [mutate("yaml", seed_text, 16384, seed, _reversed) for seed in range(100)]
    structured = [o for o in outs if o != seed_text[::-1]]
    assert len(structured) > 50
    for out in structured:
        list(yaml.safe_load_all(out))


def test_bytes_that_do_not_decode_and_oversized_results_go_to_the_fallback() -> None:
    assert {mutate("json", b"{not json", 8192, seed, _reversed) for seed in range(20)} == {
        b"nosj ton{"}
    outs = [mutate("json", REVIEW, 10, seed, _reversed) for seed in range(50)]
    assert all(len(out) <= 10 for out in outs)
    assert REVIEW[::-1][:10] in outs


def test_the_vocabulary_holds_the_built_in_rules_names() -> None:
    assert {"nvidia.com/gpu", "nvidia.com/gpumem", "aliyun.com/gpu-mem"} <= set(vocabulary())


def test_empty_and_nested_empty_documents_are_mutated_without_an_error() -> None:
    for data in (b"{}", b"[]", b"[[]]", b'{"a": {}}', b"[{}, []]"):
        for seed in range(200):
            mutate("json", data, 8192, seed, _reversed)
    for text in (b"", b"---\n", b"{}", b"[]", b"a: []\n---\n{}\n"):
        for seed in range(100):
            mutate("yaml", text, 8192, seed, _reversed)
