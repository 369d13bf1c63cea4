"""Loading rules: read files, folders and ConfigMap data, apply overrides, return a `RuleSet`.

The built-in documents ship in `builtin/*.yaml`; administrators add files, folders or ConfigMap
data that add rules, replace a rule by name, or adjust one with an `overrides` entry (enable or
disable, precedence, class, units). Every problem of every source is collected before
`RulesError` is raised, each naming its source and field path. This module reads files when
asked to load them and nothing else: no cluster access, no logging.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources as package_resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from dra_gateway.translator import yamlinput
from dra_gateway.translator.compiling import RuleEntry, check_overlaps, compile_rule
from dra_gateway.translator.documents import (
    OverrideSpec,
    RulesDocument,
    RuleSpec,
    field_names_at,
)
from dra_gateway.translator.errors import Problems, RulesError, format_path, pydantic_message
from dra_gateway.translator.ruleset import CompiledRule, RuleSet

# A file or folder path; a ConfigMap's data; or (label, data) such as
# ("ConfigMap dra-gateway/site-rules", data) so that messages name the ConfigMap.
Source = str | Path | Mapping[str, str] | tuple[str, Mapping[str, str]]


_M = TypeVar("_M", bound=BaseModel)


@dataclass
class _ValidDocument:
    source: str
    rules: list[tuple[int, RuleSpec]]
    overrides: list[tuple[int, OverrideSpec]]


def _read_documents(source: Source, problems: Problems) -> list[tuple[str, Any]]:
    """Raw YAML documents of a source, each with a display name."""
    return _parse_texts(_source_texts(source, problems), problems)


def _source_texts(source: Source, problems: Problems) -> list[tuple[str, str]]:
    texts: list[tuple[str, str]] = []
    if isinstance(source, tuple):
        label, data = source
        for key in sorted(data):
            texts.append((f"{label} key {key}", data[key]))
    elif isinstance(source, Mapping):
        # A ConfigMap labelled as rules holds rule documents under every key.
        for key in sorted(source):
            texts.append((f"configmap key {key}", source[key]))
    else:
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir()
                           if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
            if not files:
                problems.add(str(path), "", "no .yaml, .yml or .json files in this folder")
            for file in files:
                texts.append((str(file), _read_text(file, problems)))
        else:
            texts.append((str(path), _read_text(path, problems)))
    return texts


def _parse_texts(texts: list[tuple[str, str]], problems: Problems) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, text in texts:
        try:
            docs = yamlinput.load_all(text)
        except yamlinput.ExpansionError as exc:
            problems.add(name, "", f"refused ({_yaml_problem(exc, text)})")
            continue
        except yaml.YAMLError as exc:
            problems.add(name, "", f"not valid YAML ({_yaml_problem(exc, text)})")
            continue
        for i, doc in enumerate(docs):
            out.append((f"{name}[{i}]" if len(docs) > 1 else name, doc))
    return out


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """Where and what, on one line: PyYAML's own text spans lines (it quotes the input)."""
    if isinstance(exc, yaml.reader.ReaderError):
        # Refused while reading, before parsing: a character YAML does not allow.
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character
        character = f"U+{code:04X}" if isinstance(code, int) else repr(code)
        return f"line {line}: {exc.reason} ({character})"
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark is not None else "somewhere"
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return f"{where}: {' '.join(str(problem).split())}"


def _read_text(path: Path, problems: Problems) -> str:
    try:
        with path.open("rb") as file:
            data = file.read(yamlinput.MAX_INPUT_BYTES + 1)
        yamlinput.check_size(data, str(path))
        return data.decode("utf-8")
    except yamlinput.InputTooLarge as exc:
        problems.add(str(path), "", str(exc))
        return ""
    except OSError as exc:
        problems.add(str(path), "", f"cannot be read: {exc.strerror or exc}")
        return ""
    except UnicodeDecodeError:
        problems.add(str(path), "", "not a text file (not UTF-8): rules are YAML or JSON")
        return ""


def builtin_sources() -> list[tuple[str, str]]:
    """The built-in rule files shipped in the package, as (name, text), in file-name order."""
    folder = package_resources.files("dra_gateway.translator").joinpath("builtin")
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            out.append((f"builtin/{entry.name}", entry.read_text(encoding="utf-8")))
    return out


def config_map_label(namespace: str, name: str) -> str:
    """How messages name a rules ConfigMap: the webhook's and `rules check`'s alike."""
    return f"ConfigMap {namespace}/{name}" if namespace else f"ConfigMap {name}"


def config_map_sources(documents: list[Any], origin: str) -> list[Source] | None:
    """The ConfigMaps among `documents` (those of file `origin`; the items of a `kind: List`,
    as `kubectl get configmaps -o yaml` writes them, included), each a source as the webhook
    loads a rules ConfigMap: every data key a rules document, named by the ConfigMap and the
    key. None when there is no ConfigMap among them (a file of rules documents); `RulesError`
    for a ConfigMap whose data is not a mapping, or a document of another kind beside them."""
    items: list[tuple[int, Any]] = []
    for number, document in enumerate(documents, 1):
        if isinstance(document, dict) and document.get("kind") == "List" \
                and isinstance(document.get("items"), list):
            items.extend((number, item) for item in document["items"])
        else:
            items.append((number, document))
    if not any(isinstance(item, dict) and item.get("kind") == "ConfigMap" for _, item in items):
        return None
    problems = Problems()
    sources: list[Source] = []
    for number, item in items:
        kind = item.get("kind") if isinstance(item, dict) else None
        if kind != "ConfigMap":
            what = f"a {kind}" if isinstance(kind, str) and kind else "no Kubernetes object"
            problems.add(origin, "", f"document {number} is {what} beside ConfigMaps; keep rules "
                         "ConfigMaps and TranslationRules documents in separate files")
            continue
        meta = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
        label = config_map_label(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        data = item.get("data")
        if data is not None and not isinstance(data, dict):
            problems.add(label, "data", "not a mapping of keys to rules documents")
            continue
        sources.append((label, {str(k): str(v) for k, v in (data or {}).items()}))
    if problems.errors:
        raise RulesError(problems.errors, problems.counts())
    return sources


def load_rules(*sources: Source, builtin: bool = True) -> RuleSet:
    """Load rules: the built-in files first (unless `builtin=False`), then each source in order.

    A source is a file, a folder (its .yaml/.yml/.json files in name order), a ConfigMap's
    `data` mapping (every key a rules document), or `(label, data)` to name that ConfigMap in
    messages. A later rule with the same name replaces an earlier one; `overrides` apply
    after every rule is known. Raises `RulesError` listing every problem with its path.
    """
    problems = Problems()
    raw: list[tuple[str, Any]] = []
    if builtin:
        raw.extend(_parse_texts(builtin_sources(), problems))
    for source in sources:
        raw.extend(_read_documents(source, problems))

    documents: list[_ValidDocument] = []
    for name, data in raw:
        if not isinstance(data, dict):
            problems.add(name, "", "a rules document is a mapping with apiVersion, kind and rules")
            continue
        try:
            document = RulesDocument.model_validate(data)
        except ValidationError as exc:
            for error in exc.errors():
                problems.add(name, format_path(error["loc"]), pydantic_message(
                    error, field_names_at(RulesDocument, error["loc"][:-1])))
            continue
        documents.append(_ValidDocument(
            name, _validated(name, "rules", document.rules, RuleSpec, problems),
            _validated(name, "overrides", document.overrides, OverrideSpec, problems)))
    return _assemble(documents, problems)


def _validated(source: str, key: str, items: list[Any], model: type[_M],
               problems: Problems) -> list[tuple[int, _M]]:
    out = []
    for i, item in enumerate(items):
        try:
            out.append((i, model.model_validate(item)))
        except ValidationError as exc:
            for error in exc.errors():
                problems.add(source, format_path((key, i, *error["loc"])), pydantic_message(
                    error, field_names_at(model, error["loc"][:-1])))
    return out


def _assemble(documents: list[_ValidDocument], problems: Problems) -> RuleSet:
    entries: dict[str, RuleEntry] = {}
    order = 0
    for document in documents:
        seen: set[str] = set()
        for i, spec in document.rules:
            order += 1
            if spec.name in seen:
                problems.add(document.source, f"rules[{i}].name",
                             f"rule {json.dumps(spec.name)} is defined twice in this document")
                continue
            seen.add(spec.name)
            units = {name: (res.unit if res is not None else "")
                     for name, res in spec.resources.items()}
            # The same name in a later source replaces the earlier rule as a whole.
            entries[spec.name] = RuleEntry(spec, document.source, f"rules[{i}]", spec.enabled,
                                        spec.precedence, spec.device.class_name, units, order,
                                        spec.extended_resource_names)
    own: set[str] = set()  # rules whose extendedResourceNames an override set
    for document in documents:
        for i, override in document.overrides:
            entry = entries.get(override.rule)
            path = f"overrides[{i}]"
            if entry is None:
                problems.add(document.source, f"{path}.rule",
                             f"no rule named {json.dumps(override.rule)}")
                continue
            if override.enabled is not None:
                entry.enabled = override.enabled
            if override.precedence is not None:
                entry.precedence = override.precedence
            if override.class_name is not None:
                entry.class_name = override.class_name
            if override.extended_resource_names is not None:
                entry.extended_resource_names = override.extended_resource_names
                own.add(override.rule)
            for resource, unit in override.units.items():
                if resource not in entry.units:
                    problems.add(document.source, f"{path}.units[{json.dumps(resource)}]",
                                 f"rule {json.dumps(override.rule)} does not read "
                                 f"{resource}")
                    continue
                entry.units[resource] = unit

    _follow_extended_resource_names(entries, own, problems)
    compiled: list[CompiledRule] = []
    disabled: list[str] = []
    for name in sorted(entries):
        entry = entries[name]
        if not entry.enabled:
            disabled.append(name)
            continue
        rule = compile_rule(entry, problems)
        if rule is not None:
            compiled.append(rule)
    check_overlaps(compiled, entries, problems)
    if problems.errors:
        raise RulesError(problems.errors, problems.counts())
    compiled.sort(key=lambda r: (-r.precedence, r.name))
    return RuleSet(rules=tuple(compiled), disabled=tuple(disabled),
                   disabled_resources=_only_disabled(compiled, [entries[n] for n in disabled]))


def _follow_extended_resource_names(entries: dict[str, RuleEntry], own: set[str],
                                    problems: Problems) -> None:
    """A rule with `extendedResourceNamesFrom` decides as the rule it names does, after that
    rule's overrides (NVIDIA's MIG rules on nvidia.com/gpu decide as nvidia-gpu, so that a name
    a DeviceClass declares is not translated for some pods and deferred for others); an override
    of its own wins."""
    for name, entry in entries.items():
        leader = entry.spec.extended_resource_names_from
        if leader is None or name in own:
            continue
        followed = entries.get(leader)
        if followed is None or followed.spec.extended_resource_names_from is not None:
            why = ("no rule has that name" if followed is None else
                   f"rule {json.dumps(leader)} takes it from another rule itself")
            problems.add(entry.source, f"{entry.path}.extendedResourceNamesFrom",
                         f"{json.dumps(leader)}: {why}; name a rule that sets "
                         "extendedResourceNames itself, or set extendedResourceNames here")
            continue
        entry.extended_resource_names = followed.extended_resource_names


def _only_disabled(enabled: list[CompiledRule], disabled: list[RuleEntry]) -> dict[str, str]:
    """Resource names (a pattern keeps its *) only disabled rules read, each with the first
    such rule by name: a pod asking for one is told which rule to enable."""
    out: dict[str, str] = {}
    for entry in disabled:
        for resource in entry.spec.resources:
            pattern = resource[:-1] if resource.endswith("*") else None
            read = any(r.claims(resource) if pattern is None else r.pattern == pattern
                       for r in enabled)
            if not read:
                out.setdefault(resource, entry.spec.name)
    return out
