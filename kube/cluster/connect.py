"""One way for every component to obtain its `Cluster`: a real API or a fresh in-memory one.

Components call `connect` from their command-line handlers; libraries take a `Cluster` as an
argument instead, so tests hand them a `MemoryCluster`. This module must stay light to import:
the client library (and the YAML parser) is imported only when a real API is asked for.

The in-memory cluster is the simulator's (`dra_gateway.devkit.sim`), which production code never
imports: the entry point that offers `--cluster memory` (`dra-gateway`, through
`dra_gateway.devkit.cli`) hands `offer_memory` a factory first.

The kubeconfig is checked here before the client library reads it, so that every way it can be
wrong is one line naming the file and the fix: the library reports an empty file as a
`TypeError`, a missing one only through a logged warning ("Config not found") followed by an
unrelated `KeyError`, and a file that is not YAML with a raw parser traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from dra_gateway.kube.cluster.port import Cluster

FIX = ("point --kubeconfig at a kubeconfig (kubectl config view --raw > FILE) or run in a pod "
       "with a service account")
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_SECTIONS = ("clusters", "contexts", "users")
_MAX_NAMES = 10


class ClusterConfigError(Exception):
    """The cluster to connect to could not be configured (no kubeconfig, bad file...)."""


# What `connect("memory")` hands out, offered by the entry point (see the module's text).
_memory_factories: list[Callable[[], Cluster]] = []


def offer_memory(factory: Callable[[], Cluster]) -> None:
    """Let `connect("memory")` return `factory()`, a fresh in-memory cluster each call."""
    _memory_factories[:] = [factory]


def _read_text(path: str) -> str:
    """The kubeconfig's text (a seam: tests stand in an unreadable file, which root can read)."""
    with open(path, encoding="utf-8") as file:
        return file.read()


# What DRA commands need the API server to serve (connect's `verify`).
DRA_GROUPS: Final = (("resource.k8s.io", "v1", "is DRA as the gateway uses it (Kubernetes 1.34 "
                      "or later)"),)


async def connect(kind: Literal["kube", "memory"], kubeconfig: str | None = None, *,
                  verify: Sequence[tuple[str, str, str]] | None = None) -> Cluster:
    """A `Cluster` of `kind`.

    "memory": a new, empty in-memory cluster (the embedded default's backing store).
    "kube": the API named by `kubeconfig`; without one, $KUBECONFIG (a list of files joined by
    os.pathsep, merged as kubectl does: the first file to define a name or the current-context
    wins), else the pod's service account when running in a cluster, else ~/.kube/config: the
    order of controller-runtime, so an operator's habits carry over.

    `verify` (for commands that read a cluster for a person: report, migrate, defrag): check
    first that the endpoint is a Kubernetes API server serving these (group, version, why)
    (`DRA_GROUPS`; () for any Kubernetes API); `NotKubernetes` says what it found instead.
    """
    if kind == "memory":
        if not _memory_factories:
            raise ClusterConfigError(
                "no in-memory cluster is offered here: it is the development kit's simulator, "
                "which the dra-gateway command offers (dra-gateway COMPONENT --cluster memory)")
        return _memory_factories[0]()
    if kind != "kube":
        raise ClusterConfigError(f'unknown cluster kind "{kind}": use "kube" or "memory"')
    from kubernetes_asyncio.config import ConfigException

    from dra_gateway.kube.cluster.kubernetes import KubernetesCluster

    kubeconfig = kubeconfig or None  # kubectl too takes --kubeconfig="" as not given
    source = _source(kubeconfig)
    if source.origin == "default" and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            cluster = KubernetesCluster.in_cluster()
        except (ConfigException, OSError, ValueError) as exc:
            detail = _one_line(exc).rstrip(".")
            raise ClusterConfigError(
                "cannot use the pod's service account (KUBERNETES_SERVICE_HOST is set): "
                f"{detail[:1].lower()}{detail[1:]}; mount its token and ca.crt at "
                f"{SERVICE_ACCOUNT_DIR} (automountServiceAccountToken: true) or pass "
                "--kubeconfig") from None
    else:
        loaded = _load(source)
        try:
            cluster = await KubernetesCluster.from_kubeconfig(os.pathsep.join(loaded.paths),
                                                              context=loaded.context)
        except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterConfigError(
                f"cannot load {loaded.where}: {_one_line(exc)}; {FIX}") from None
    if verify is not None:
        try:
            await cluster.verify(verify)
        except BaseException:
            await cluster.close()
            raise
    return cluster


# Where the kubeconfig comes from ---------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """The kubeconfig files asked for, and how messages name them and the kubectl fix."""

    paths: tuple[str, ...]
    origin: Literal["flag", "env", "default"]

    @property
    def suffix(self) -> str:
        return " (from $KUBECONFIG)" if self.origin == "env" else ""

    @property
    def flag(self) -> str:
        """What a suggested kubectl command needs to edit the same file."""
        return f" --kubeconfig {self.paths[0]}" if self.origin == "flag" else ""

    def name(self, paths: Sequence[str]) -> str:
        return f"kubeconfig {os.pathsep.join(paths)}{self.suffix}"


def _source(kubeconfig: str | None) -> _Source:
    if kubeconfig is not None:
        return _Source((kubeconfig,), "flag")
    listed = [os.path.expanduser(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep)
              if p]
    if listed:
        return _Source(tuple(listed), "env")
    return _Source((str(Path.home() / ".kube" / "config"),), "default")


def _nothing_found(source: _Source) -> ClusterConfigError:
    if source.origin == "env":
        # As with kubectl, a $KUBECONFIG that is set is used: no other place is tried.
        files = ", ".join(source.paths)
        looked = (f"none of the files in $KUBECONFIG exists ({files})" if len(source.paths) > 1
                  else f"$KUBECONFIG names {files}, which does not exist")
        return ClusterConfigError(
            f"no kubeconfig found: {looked}; point $KUBECONFIG at kubeconfig files, unset it "
            "(to use ~/.kube/config or the pod's service account), or pass --kubeconfig")
    return ClusterConfigError(
        f"no kubeconfig found: no --kubeconfig given, $KUBECONFIG is not set, "
        f"{source.paths[0]} does not exist, and no in-cluster service account "
        f"(KUBERNETES_SERVICE_HOST is not set); {FIX}")


# Reading and checking it -----------------------------------------------------------------------


@dataclass
class _Loaded:
    """The usable files, merged as kubectl merges them, and the context to use."""

    where: str
    paths: list[str] = field(default_factory=list)
    contexts: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    clusters: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    context: str | None = None


def _load(source: _Source) -> _Loaded:
    existing = [p for p in source.paths if os.path.exists(p)]
    if source.origin == "flag" and not existing:
        raise ClusterConfigError(f"kubeconfig {source.paths[0]} does not exist; {FIX}")
    if not existing:
        raise _nothing_found(source)
    documents: list[tuple[str, dict[Any, Any]]] = []
    for path in existing:
        document = _document(path, source)
        if document is not None:
            documents.append((path, document))
    if not documents:
        verb = "are all empty" if len(existing) > 1 else "is empty"
        raise ClusterConfigError(f"{source.name(existing)} {verb}; {FIX}")
    loaded = _Loaded(where=source.name([p for p, _ in documents]))
    for path, document in documents:
        if os.pathsep in path:
            raise ClusterConfigError(
                f"kubeconfig {path}{source.suffix}: its path contains '{os.pathsep}', which the "
                f"Kubernetes client reads as a list of files; move or link it to a path "
                f"without '{os.pathsep}'")
        loaded.paths.append(path)
        for name, entry in _entries(document, "contexts"):
            loaded.contexts.setdefault(name, entry)
        for name, entry in _entries(document, "clusters"):
            loaded.clusters.setdefault(name, entry)
        current = document.get("current-context")
        if loaded.context is None and isinstance(current, str) and current:
            loaded.context = current
    _check_context(loaded, source)
    return loaded


def _document(path: str, source: _Source) -> dict[Any, Any] | None:
    """The file's mapping, None when it is empty; the reason it is unusable otherwise."""
    import yaml

    name = f"kubeconfig {path}{source.suffix}"
    if os.path.isdir(path):
        inside = os.path.join(path, "config")
        hint = f" (did you mean {inside}?)" if os.path.isfile(inside) else ""
        raise ClusterConfigError(f"{name} is a directory, not a file{hint}; {FIX}")
    try:
        text = _read_text(path)
    except PermissionError:
        raise ClusterConfigError(
            f"cannot read {name}: permission denied; make it readable by this user, or "
            f"{FIX}") from None
    except UnicodeDecodeError:
        raise ClusterConfigError(f"{name} is not a text file (not UTF-8); {FIX}") from None
    except OSError as exc:
        raise ClusterConfigError(f"cannot read {name}: {exc.strerror or exc}; {FIX}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterConfigError(f"{name} is not YAML ({_yaml_problem(exc)}); {FIX}") from None
    if document is None:
        return None
    if not isinstance(document, dict):
        kind = "list" if isinstance(document, list) else type(document).__name__
        kind = {"str": "string", "int": "number", "float": "number", "bool": "boolean"}.get(
            kind, kind)
        raise ClusterConfigError(
            f"{name} is not a kubeconfig: it holds a YAML {kind}, not a mapping of clusters, "
            f"contexts and users; {FIX}")
    for section in _SECTIONS:
        value = document.get(section)
        if value is None:
            continue
        if not isinstance(value, list) or not all(
                isinstance(e, dict) and isinstance(e.get("name"), str) for e in value):
            raise ClusterConfigError(
                f"{name}: {section} is not a list of entries with a name; {FIX}")
    return document


def _entries(document: Mapping[Any, Any], section: str) -> list[tuple[str, Mapping[str, Any]]]:
    return [(e["name"], e) for e in document.get(section) or []]


def _check_context(loaded: _Loaded, source: _Source) -> None:
    where, flag = loaded.where, source.flag
    if not loaded.contexts:
        raise ClusterConfigError(f"{where} defines no contexts; {FIX}")
    contexts = _names(loaded.contexts)
    if loaded.context is None:
        raise ClusterConfigError(
            f"{where} sets no current-context; choose one of its contexts ({contexts}): "
            f"kubectl config use-context NAME{flag}")
    entry = loaded.contexts.get(loaded.context)
    if entry is None:
        raise ClusterConfigError(
            f'{where}: current-context "{loaded.context}" is not one of its contexts '
            f"({contexts}); choose one: kubectl config use-context NAME{flag}")
    body = entry.get("context")
    cluster = body.get("cluster") if isinstance(body, dict) else None
    if not isinstance(cluster, str) or not cluster:
        raise ClusterConfigError(
            f'{where}: context "{loaded.context}" names no cluster; set one: kubectl config '
            f"set-context {loaded.context} --cluster NAME{flag}")
    cluster_entry = loaded.clusters.get(cluster)
    if cluster_entry is None:
        clusters = _names(loaded.clusters) or "it defines none"
        raise ClusterConfigError(
            f'{where}: context "{loaded.context}" names cluster "{cluster}", which is not one '
            f"of its clusters ({clusters}); fix the context: kubectl config set-context "
            f"{loaded.context} --cluster NAME{flag}")
    details = cluster_entry.get("cluster")
    server = details.get("server") if isinstance(details, dict) else None
    if not isinstance(server, str) or not server:
        raise ClusterConfigError(
            f'{where}: cluster "{cluster}" has no server; set one: kubectl config set-cluster '
            f"{cluster} --server URL{flag}")


def _names(entries: Mapping[str, object]) -> str:
    names = list(entries)
    shown = ", ".join(names[:_MAX_NAMES])
    return shown + (f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else "")


def _yaml_problem(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return _one_line(exc)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
