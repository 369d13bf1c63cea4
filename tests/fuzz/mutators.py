"""Structure-aware mutation for the fuzz campaigns: change a review's JSON or a rules document's
YAML as a tree, not as bytes.

libFuzzer's byte mutations mostly break the JSON or YAML they start from, so a campaign spends
its time in the parsers' error paths. This mutator decodes the input, changes one to three
nodes (a value replaced by a boundary value, a legacy resource name or annotation of the
built-in rules, or another value of the same input; a key removed or added; a list item
repeated; a number scaled), and encodes the result again. A third of the time, and whenever the
input does not decode, it hands over to the engine's own byte mutation (`fallback`), so broken
syntax is still explored.

This module must not import atheris: `run.py` hands it the engine's mutation.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from functools import cache
from typing import Any

import orjson
import yaml

from dra_gateway.kube import names
from dra_gateway.translator.rules import builtin_sources

Fallback = Callable[[bytes, int], bytes]

# Values at the edges of what pods, reviews and rules carry.
BOUNDARY: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 2**31, 2**63, 2**70, 0.5, -0.0, 1e308, "", " ", "x", "0", "1",
    "-1", "0.5", "1e3", "1e400", "2**64", "100Mi", "1Gi", "80G", "99999999999999999999Ki",
    "NaN", "abc", "🙂", "a" * 300, "CREATE", "UPDATE", "DELETE", "CONNECT", "pods", "Pod",
    "status", "nvidia.com/gpu", "true", "false", "null", [], [{}], {}, {"": ""},
    'r["nvidia.com/gpu"] > 0', "1/0", "size(r)", "int(r[\"x\"])", "[1][5]", "'a' + 1",
)


@cache
def vocabulary() -> tuple[str, ...]:
    """The resource names, annotations, node labels and classes the built-in rules read, and
    the gateway's own names: strings a pod or a rule must hold to reach the rules' logic."""
    words: set[str] = {names.DRIVER, names.ANNOTATION_TRANSLATED, "dra-gateway.io/allocation"}
    for _, text in builtin_sources():
        for doc in yaml.safe_load_all(text):
            for rule in (doc or {}).get("rules") or ():
                words.update(rule.get("resources") or ())
                words.update(rule.get("annotations") or ())
                words.update(rule.get("nodeSelector") or ())
                class_name = (rule.get("device") or {}).get("className")
                if class_name:
                    words.add(class_name)
    return tuple(sorted(words))


def _nodes(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += _nodes(value, (*path, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += _nodes(value, (*path, i))
    return out


def _scalars(tree: Any) -> list[Any]:
    if isinstance(tree, dict):
        return [s for k, v in tree.items() for s in (k, *_scalars(v))]
    if isinstance(tree, list):
        return [s for v in tree for s in _scalars(v)]
    return [tree]


def _value(rng: random.Random, tree: Any) -> Any:
    choice = rng.random()
    if choice < 0.35:
        return copy.deepcopy(rng.choice(BOUNDARY))
    if choice < 0.6:
        return rng.choice(vocabulary())
    if choice < 0.8:
        return rng.choice(_scalars(tree) or BOUNDARY)
    return copy.deepcopy(_get(tree, rng.choice(_nodes(tree))))


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _scaled(rng: random.Random, value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return rng.choice((value + 1, value - 1, value * 1024, -value, value / 3, 0))
    if isinstance(value, str) and value[:1].isdigit():
        digits = len(value) - len(value.lstrip("0123456789"))
        number = int(value[:digits])
        return str(rng.choice((number + 1, number * 1000, 0, number - 1))) + value[digits:]
    return value


def _mutate_once(rng: random.Random, tree: Any) -> Any:
    path = rng.choice(_nodes(tree))
    if not path:
        return _value(rng, tree) if rng.random() < 0.05 else tree
    parent = _get(tree, path[:-1])
    key = path[-1]
    action = rng.random()
    if action < 0.35:
        parent[key] = _value(rng, tree)
    elif action < 0.5:
        parent[key] = _scaled(rng, parent[key])
    elif action < 0.65:
        del parent[key]
    elif action < 0.85 and isinstance(parent, dict):
        parent[rng.choice(vocabulary()) if rng.random() < 0.7 else rng.choice(BOUNDARY[14:30])] \
            = _value(rng, tree)
    elif isinstance(parent, list):
        parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[key]))
    else:
        target = _get(tree, path)
        if isinstance(target, dict):
            target[rng.choice(vocabulary())] = _value(rng, tree)
        elif isinstance(target, list):
            target.append(_value(rng, tree))
    return tree


def _decode(kind: str, data: bytes) -> Any:
    if kind == "json":
        return orjson.loads(data)
    return list(yaml.safe_load_all(data.decode("utf-8")))


def _encode(kind: str, tree: Any) -> bytes:
    if kind == "json":
        return orjson.dumps(tree, option=orjson.OPT_NON_STR_KEYS)
    return yaml.safe_dump_all(tree, sort_keys=False, allow_unicode=True).encode()


def mutate(kind: str, data: bytes, max_size: int, seed: int, fallback: Fallback) -> bytes:
    """`data` changed as a tree of `kind` ("json" or "yaml"), or by `fallback`."""
    rng = random.Random(seed)
    if rng.random() < 0.33:
        return fallback(data, max_size)
    try:
        tree = _decode(kind, data)
    except (ValueError, yaml.YAMLError):
        return fallback(data, max_size)
    if not isinstance(tree, dict | list):
        return fallback(data, max_size)
    try:
        for _ in range(rng.randint(1, 3)):
            tree = _mutate_once(rng, tree)
        out = _encode(kind, tree)
    except (TypeError, ValueError, RecursionError, yaml.YAMLError):
        # Not encodable again (a YAML key that JSON has no form for, a cycle of aliases).
        return fallback(data, max_size)
    return out if len(out) <= max_size else fallback(data, max_size)
