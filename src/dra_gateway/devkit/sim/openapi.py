"""The OpenAPI v3 documents of the embedded API (`/openapi/v3` and one per group-version), which
kubectl downloads to validate (`kubectl apply`'s default `--validate=strict` asks whether the
server checks fields itself), to build client-side apply's strategic merge patches and to
`kubectl explain`.

The built-in kinds' schemas are upstream's own, shipped by the `kubernetes-validate` package
(JSON Schema translated from each release's OpenAPI document): each group-version takes the
newest release that serves all of its kinds (the simulator serves DeviceTaintRules v1, new in
1.37), so a field the project writes is known. The gateway's kinds take their CRD's schema
(`crds`); any other kind (other schedulers' and job controllers' objects) is described as
preserving unknown fields, as a CRD without a schema would be. Without `kubernetes-validate`
every built-in kind is described that way too: kubectl still works, `explain` says less.

Built once per group-version, on first request. Nothing here reads the store.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from dra_gateway.devkit.sim import crds
from dra_gateway.kube.resources import ALL, ResourceType

Schema = dict[str, Any]
_REF = "#/components/schemas/"
_PATCH_TYPES = ("application/apply-patch+yaml", "application/json-patch+json",
                "application/merge-patch+json", "application/strategic-merge-patch+json")
_CUSTOM_PATCH_TYPES = ("application/apply-patch+yaml", "application/json-patch+json",
                       "application/merge-patch+json")


@functools.cache
def _releases() -> list[dict[str, Schema]]:
    """The definitions of each release `kubernetes-validate` ships, newest first."""
    try:
        import importlib.resources as resources

        import kubernetes_validate
    except ImportError:
        return []
    root = resources.files(kubernetes_validate) / "kubernetes-json-schema"
    names = sorted((p.name for p in root.iterdir()
                    if p.name.endswith("-local") and p.name.startswith("v1.")),
                   key=lambda n: tuple(int(x) for x in n[1:].split("-")[0].split(".")),
                   reverse=True)
    found = []
    for name in names[:4]:
        text = (root / name / "_definitions.json").read_text(encoding="utf-8")
        found.append(json.loads(text)["$defs"])
    return found


def _gvk_of(definition: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return [(g.get("group", ""), g.get("version", ""), g.get("kind", ""))
            for g in definition.get("x-kubernetes-group-version-kind") or []]


def _find(defs: Mapping[str, Schema], rt: ResourceType) -> str | None:
    for name, definition in defs.items():
        if (rt.group, rt.version, rt.kind) in _gvk_of(definition):
            return name
    return None


def _convert(node: Any, *, top: bool = False) -> Any:
    """A JSON Schema node of `kubernetes-validate` back in OpenAPI v3's form."""
    if isinstance(node, list):
        return [_convert(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref":
            continue
        if key == "type" and isinstance(value, list):
            kept = [t for t in value if t != "null"]
            value = kept[0] if len(kept) == 1 else kept
        if key == "properties":
            value = {name: _convert(child) for name, child in value.items()}
            if top:
                for name in ("apiVersion", "kind"):
                    if isinstance(value.get(name), dict):
                        value[name].pop("enum", None)
            out[key] = value
            continue
        out[key] = _convert(value)
    if "$ref" in node:
        ref = {"$ref": _REF + str(node["$ref"]).rsplit("/", 1)[-1]}
        if not out:
            return ref
        out["allOf"] = [ref]  # as the API server writes a reference with a description
    return out


def _closure(defs: Mapping[str, Schema], roots: Iterable[str]) -> dict[str, Schema]:
    found: dict[str, Schema] = {}
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in found or name not in defs:
            continue
        found[name] = defs[name]
        text = json.dumps(defs[name])
        start = 0
        while True:
            at = text.find('"#/$defs/', start)
            if at < 0:
                break
            end = text.find('"', at + 1)
            pending.append(text[at + 9:end])
            start = end
    return found


def _custom_schema(rt: ResourceType) -> Schema:
    definition = crds.definition(rt)
    schema: Schema = (dict(definition.schema) if definition is not None
                      else {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    properties = dict(schema.get("properties") or {})
    properties["metadata"] = {"allOf": [{"$ref": _REF + "io.k8s.apimachinery.pkg.apis.meta.v1."
                                                      "ObjectMeta"}],
                              "description": "Standard object's metadata. More info: "
                                             "https://git.k8s.io/community/contributors/devel/"
                                             "sig-architecture/api-conventions.md#metadata"}
    schema["properties"] = properties
    schema["x-kubernetes-group-version-kind"] = [
        {"group": rt.group, "version": rt.version, "kind": rt.kind}]
    return schema


def _schema_name(rt: ResourceType) -> str:
    reversed_group = ".".join(reversed(rt.group.split("."))) if rt.group else "core"
    return f"{reversed_group}.{rt.version}.{rt.kind}"


def _operations(rt: ResourceType, schema_name: str, custom: bool) -> dict[str, Any]:
    gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
    ref = {"$ref": _REF + schema_name}
    body = {"content": {"application/json": {"schema": ref}}, "required": True}
    ok = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}

    def query(name: str, description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "description": description,
                "schema": {"type": "string", "uniqueItems": True}}

    writes = [query("dryRun", "When present, indicates that modifications should not be "
                              "persisted."),
              query("fieldManager", "fieldManager is a name associated with the actor or "
                                    "entity that is making these changes."),
              query("fieldValidation", "fieldValidation instructs the server on how to handle "
                                       "objects in the request containing unknown or "
                                       "duplicate fields: Ignore, Warn or Strict.")]
    path_params = [{"name": "name", "in": "path", "required": True,
                    "schema": {"type": "string", "uniqueItems": True}}]
    if rt.namespaced:
        path_params.append({"name": "namespace", "in": "path", "required": True,
                            "schema": {"type": "string", "uniqueItems": True}})

    def op(action: str, **extra: Any) -> dict[str, Any]:
        return {"operationId": f"{action}{rt.kind}", "responses": ok,
                "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, **extra}

    patch_types = _CUSTOM_PATCH_TYPES if custom else _PATCH_TYPES
    patch_body = {"content": {t: {"schema": {"$ref": _REF + "io.k8s.apimachinery.pkg.apis."
                                                           "meta.v1.Patch"}}
                              for t in patch_types}, "required": True}
    item = {"parameters": path_params,
            "get": op("get"),
            "put": op("put", requestBody=body, parameters=writes),
            "patch": op("patch", requestBody=patch_body,
                        parameters=[*writes, query("force", "Force is going to \"force\" "
                                                            "Apply requests.")]),
            "delete": op("delete")}
    collection = {"parameters": path_params[1:],
                  "get": op("list"),
                  "post": op("post", requestBody=body, parameters=writes)}
    base = rt.path(namespace="{namespace}")
    return {base: collection, f"{base}/{{name}}": item}


def group_versions() -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for rt in ALL:
        if (rt.group, rt.version) not in seen:
            seen.append((rt.group, rt.version))
    return seen


def api_path(group: str, version: str) -> str:
    """"api/v1" or "apis/<group>/<version>": a group-version's key in /openapi/v3."""
    return f"apis/{group}/{version}" if group else f"api/{version}"


@functools.cache
def document(group: str, version: str) -> bytes | None:
    """The OpenAPI v3 document of one group-version (JSON), None when it is not served."""
    kinds = [rt for rt in ALL if rt.group == group and rt.version == version]
    if not kinds:
        return None
    releases = _releases()
    # The newest release with all the group-version's built-in kinds, else the one with most.
    builtin = [rt for rt in kinds if crds.definition(rt) is None]
    chosen = max(releases, default={},
                 key=lambda defs: sum(_find(defs, rt) is not None for rt in builtin))
    schemas: dict[str, Schema] = {}
    paths: dict[str, Any] = {}
    for rt in kinds:
        name = _find(chosen, rt) if crds.definition(rt) is None else None
        if name is None:
            name = _schema_name(rt)
            schemas[name] = _custom_schema(rt)
        else:
            for ref, definition in _closure(chosen, [name]).items():
                schemas.setdefault(ref, _convert(definition, top=bool(_gvk_of(definition))))
        paths.update(_operations(rt, name, custom=crds.definition(rt) is not None))
    meta = _closure(chosen, ["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                             "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"])
    for ref, definition in meta.items():
        schemas.setdefault(ref, _convert(definition))
    schemas.setdefault("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", {"type": "object"})
    schemas.setdefault("io.k8s.apimachinery.pkg.apis.meta.v1.Patch", {"type": "object"})
    doc = {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.34.0"},
           "paths": paths, "components": {"schemas": schemas}}
    return json.dumps(doc, sort_keys=True).encode()


@functools.cache
def index() -> bytes:
    """/openapi/v3: each group-version's document, named with its hash as the API server does."""
    paths = {}
    for group, version in group_versions():
        doc = document(group, version)
        if doc is None:
            continue
        digest = hashlib.sha512(doc).hexdigest().upper()
        paths[api_path(group, version)] = {
            "serverRelativeURL": f"/openapi/v3/{api_path(group, version)}?hash={digest}"}
    return json.dumps({"paths": paths}).encode()


def schema_of(rt: ResourceType) -> tuple[Schema, dict[str, Schema]] | None:
    """The OpenAPI schema of `rt` and the components its references name, for the
    unknown-field check of a built-in kind; None where the kind is not described."""
    doc = document(rt.group, rt.version)
    if doc is None:
        return None
    return _parsed(rt.group, rt.version, rt.kind)


@functools.cache
def _parsed(group: str, version: str, kind: str) -> tuple[Schema, dict[str, Schema]] | None:
    doc = document(group, version)
    if doc is None:
        return None
    schemas: dict[str, Schema] = json.loads(doc)["components"]["schemas"]
    for schema in schemas.values():
        if (group, version, kind) in _gvk_of(schema):
            return schema, schemas
    return None


def resolver(components: Mapping[str, Schema]) -> Any:
    """A function from a schema node to the node its `$ref` (or single `allOf`) names."""
    def resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
        for _ in range(16):
            if "$ref" in node:
                node = components.get(str(node["$ref"]).removeprefix(_REF), {})
            elif len(node.get("allOf") or []) == 1 and "properties" not in node:
                merged = dict(node["allOf"][0])
                node = merged
            else:
                break
        return node
    return resolve
