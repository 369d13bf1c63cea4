"""`connect` hands out the right backend and explains a bad configuration in one line."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gateway.devkit.cli import offer_memory_cluster
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import kubeconfig_document
from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
from dra_gateway.kube.cluster.kubernetes import KubernetesCluster

# The package exports the function `connect` under the module's name: reach the module itself.
connect_module = sys.modules[ClusterConfigError.__module__]

FIX = ("point --kubeconfig at a kubeconfig (kubectl config view --raw > FILE) or run in a pod "
       "with a service account")


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Neither this machine's kubeconfig nor a pod's environment may leak into a test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return home


def _write(path: Path, document: Any) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


async def _refused(kubeconfig: str | Path | None) -> str:
    with pytest.raises(ClusterConfigError) as caught:
        await connect("kube", None if kubeconfig is None else str(kubeconfig))
    return str(caught.value)


async def test_memory_gives_a_fresh_in_memory_cluster() -> None:
    offer_memory_cluster()  # as the dra-gateway command does for --cluster memory
    first, second = await connect("memory"), await connect("memory")
    assert isinstance(first, MemoryCluster)
    assert first is not second


async def test_memory_without_the_simulator_offered_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connect_module, "_memory_factories", [])
    with pytest.raises(ClusterConfigError) as caught:
        await connect("memory")
    assert "development kit's simulator" in str(caught.value)


async def test_an_unknown_kind_names_the_kinds() -> None:
    with pytest.raises(ClusterConfigError) as caught:
        await connect("etcd", None)  # type: ignore[arg-type]
    assert str(caught.value) == 'unknown cluster kind "etcd": use "kube" or "memory"'


async def test_a_valid_kubeconfig_connects_to_its_server(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", kubeconfig_document("http://127.0.0.1:1", "t"))
    cluster = await connect("kube", str(path))
    try:
        assert isinstance(cluster, KubernetesCluster)
        assert cluster.host == "http://127.0.0.1:1"
    finally:
        await cluster.close()


# --kubeconfig FILE ---------------------------------------------------------------------------


async def test_a_missing_kubeconfig_names_the_file_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert await _refused(missing) == f"kubeconfig {missing} does not exist; {FIX}"


async def test_a_directory_is_not_reported_as_missing(tmp_path: Path) -> None:
    folder = tmp_path / "kube"
    folder.mkdir()
    assert await _refused(folder) == f"kubeconfig {folder} is a directory, not a file; {FIX}"


async def test_a_directory_holding_a_config_suggests_it(tmp_path: Path) -> None:
    folder = tmp_path / ".kube"
    folder.mkdir()
    _write(folder / "config", kubeconfig_document("http://127.0.0.1:1"))
    assert await _refused(folder) == (
        f"kubeconfig {folder} is a directory, not a file (did you mean {folder / 'config'}?); "
        f"{FIX}")


@pytest.mark.parametrize("text", ["", "\n", "# nothing yet\n", "---\n"])
async def test_an_empty_kubeconfig_says_so(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    assert await _refused(path) == f"kubeconfig {path} is empty; {FIX}"


async def test_a_kubeconfig_that_is_not_yaml_says_where(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("clusters: [\n")
    assert await _refused(path) == (
        f"kubeconfig {path} is not YAML (line 2, column 1: expected the node content, but "
        f"found '<stream end>'); {FIX}")


async def test_a_kubeconfig_that_is_not_text_says_so(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_bytes(b"\xff\xfe\x00binary")
    assert await _refused(path) == f"kubeconfig {path} is not a text file (not UTF-8); {FIX}"


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"),
                                            ("just some words\n", "string"),
                                            ("42\n", "number")])
async def test_a_kubeconfig_that_is_not_a_mapping_names_what_it_holds(
        tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "config"
    path.write_text(text)
    assert await _refused(path) == (
        f"kubeconfig {path} is not a kubeconfig: it holds a YAML {kind}, not a mapping of "
        f"clusters, contexts and users; {FIX}")


async def test_a_section_that_is_not_a_list_of_named_entries_is_named(tmp_path: Path) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    document["contexts"] = {"dra-gateway": {"cluster": "dra-gateway"}}
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f"kubeconfig {path}: contexts is not a list of entries with a name; {FIX}")


async def test_an_unreadable_kubeconfig_says_permission_denied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "config", kubeconfig_document("http://127.0.0.1:1"))

    def denied(name: str) -> str:  # root reads a mode-000 file: stand in the refusal
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(connect_module, "_read_text", denied)
    assert await _refused(path) == (
        f"cannot read kubeconfig {path}: permission denied; make it readable by this user, or "
        f"{FIX}")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
async def test_a_mode_000_kubeconfig_says_permission_denied(tmp_path: Path) -> None:
    path = _write(tmp_path / "config", kubeconfig_document("http://127.0.0.1:1"))
    path.chmod(0)
    assert await _refused(path) == (
        f"cannot read kubeconfig {path}: permission denied; make it readable by this user, or "
        f"{FIX}")


async def test_a_kubeconfig_without_contexts_says_so(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text("apiVersion: v1\nkind: Config\n")
    assert await _refused(path) == f"kubeconfig {path} defines no contexts; {FIX}"


async def test_no_current_context_lists_the_contexts_and_the_kubectl_command(
        tmp_path: Path) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    del document["current-context"]
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f"kubeconfig {path} sets no current-context; choose one of its contexts (dra-gateway): "
        f"kubectl config use-context NAME --kubeconfig {path}")


async def test_a_current_context_naming_a_missing_context_lists_the_contexts(
        tmp_path: Path) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    document["current-context"] = "nowhere"
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f'kubeconfig {path}: current-context "nowhere" is not one of its contexts '
        f"(dra-gateway); choose one: kubectl config use-context NAME --kubeconfig {path}")


async def test_a_context_without_a_cluster_says_so(tmp_path: Path) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    document["contexts"][0]["context"] = {"user": "dra-gateway"}
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f'kubeconfig {path}: context "dra-gateway" names no cluster; set one: kubectl config '
        f"set-context dra-gateway --cluster NAME --kubeconfig {path}")


async def test_a_context_naming_a_missing_cluster_lists_the_clusters(tmp_path: Path) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    document["contexts"][0]["context"]["cluster"] = "gone"
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f'kubeconfig {path}: context "dra-gateway" names cluster "gone", which is not one of '
        f"its clusters (dra-gateway); fix the context: kubectl config set-context dra-gateway "
        f"--cluster NAME --kubeconfig {path}")


async def test_a_cluster_without_a_server_says_so(tmp_path: Path) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    document["clusters"][0]["cluster"] = {}
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f'kubeconfig {path}: cluster "dra-gateway" has no server; set one: kubectl config '
        f"set-cluster dra-gateway --server URL --kubeconfig {path}")


async def test_what_the_client_library_still_refuses_is_one_line(tmp_path: Path) -> None:
    document = kubeconfig_document("https://127.0.0.1:1")
    missing_ca = tmp_path / "ca.crt"
    document["clusters"][0]["cluster"]["certificate-authority"] = str(missing_ca)
    path = _write(tmp_path / "config", document)
    assert await _refused(path) == (
        f"cannot load kubeconfig {path}: File does not exists: {missing_ca}; {FIX}")


async def test_a_path_holding_the_list_separator_is_refused_clearly(tmp_path: Path) -> None:
    path = _write(tmp_path / f"a{os.pathsep}b", kubeconfig_document("http://127.0.0.1:1"))
    assert await _refused(path) == (
        f"kubeconfig {path}: its path contains '{os.pathsep}', which the Kubernetes client "
        f"reads as a list of files; move or link it to a path without '{os.pathsep}'")


# No --kubeconfig: $KUBECONFIG, ~/.kube/config, the pod's service account ------------------


async def test_nothing_to_connect_with_names_every_place_looked_at(
        home: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    default = home / ".kube" / "config"
    assert await _refused(None) == (
        f"no kubeconfig found: no --kubeconfig given, $KUBECONFIG is not set, {default} does "
        "not exist, and no in-cluster service account (KUBERNETES_SERVICE_HOST is not set); "
        f"{FIX}")
    # The client library's own "Config not found" warning never reaches the user.
    assert capsys.readouterr() == ("", "")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kubernetes")] == []


async def test_an_empty_default_kubeconfig_is_named(home: Path) -> None:
    default = home / ".kube" / "config"
    default.parent.mkdir()
    default.write_text("")
    assert await _refused(None) == f"kubeconfig {default} is empty; {FIX}"


async def test_the_default_kubeconfig_connects(home: Path) -> None:
    default = home / ".kube" / "config"
    default.parent.mkdir()
    _write(default, kubeconfig_document("http://127.0.0.1:2"))
    cluster = await connect("kube")
    try:
        assert isinstance(cluster, KubernetesCluster)
        assert cluster.host == "http://127.0.0.1:2"
    finally:
        await cluster.close()


async def test_kubeconfig_naming_a_missing_file_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "nope"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    assert await _refused(None) == (
        f"no kubeconfig found: $KUBECONFIG names {missing}, which does not exist; point "
        "$KUBECONFIG at kubeconfig files, unset it (to use ~/.kube/config or the pod's service "
        "account), or pass --kubeconfig")


async def test_kubeconfig_listing_only_missing_files_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    assert await _refused(None) == (
        f"no kubeconfig found: none of the files in $KUBECONFIG exists ({first}, {second}); "
        "point $KUBECONFIG at kubeconfig files, unset it (to use ~/.kube/config or the pod's "
        "service account), or pass --kubeconfig")


async def test_an_error_in_a_kubeconfig_from_the_environment_says_where_it_came_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    document = kubeconfig_document("http://127.0.0.1:1")
    document["current-context"] = "nowhere"
    path = _write(tmp_path / "config", document)
    monkeypatch.setenv("KUBECONFIG", str(path))
    # kubectl reads $KUBECONFIG itself: the suggested command needs no --kubeconfig.
    assert await _refused(None) == (
        f'kubeconfig {path} (from $KUBECONFIG): current-context "nowhere" is not one of its '
        "contexts (dra-gateway); choose one: kubectl config use-context NAME")


async def test_a_bad_file_in_the_kubeconfig_list_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = _write(tmp_path / "good", kubeconfig_document("http://127.0.0.1:1"))
    bad = tmp_path / "bad"
    bad.write_text("- not\n- a mapping\n")
    monkeypatch.setenv("KUBECONFIG", f"{good}{os.pathsep}{bad}")
    assert await _refused(None) == (
        f"kubeconfig {bad} (from $KUBECONFIG) is not a kubeconfig: it holds a YAML list, not a "
        f"mapping of clusters, contexts and users; {FIX}")


async def test_a_kubeconfig_list_of_empty_files_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text("")
    second.write_text("\n")
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    assert await _refused(None) == (
        f"kubeconfig {first}{os.pathsep}{second} (from $KUBECONFIG) are all empty; {FIX}")


async def test_a_kubeconfig_list_merges_as_kubectl_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing and empty files are skipped; the first file to set current-context wins."""
    empty = tmp_path / "empty"
    empty.write_text("")
    first = _write(tmp_path / "first", kubeconfig_document("http://127.0.0.1:3", name="one"))
    second = _write(tmp_path / "second", kubeconfig_document("http://127.0.0.1:4", name="two"))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(
        str(p) for p in (tmp_path / "missing", empty, first, second)))
    cluster = await connect("kube")
    try:
        assert isinstance(cluster, KubernetesCluster)
        assert cluster.host == "http://127.0.0.1:3"
    finally:
        await cluster.close()


async def test_a_context_may_come_from_a_later_file_in_the_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chooser = _write(tmp_path / "chooser", {"apiVersion": "v1", "kind": "Config",
                                            "current-context": "two"})
    first = _write(tmp_path / "first", kubeconfig_document("http://127.0.0.1:3", name="one"))
    second = _write(tmp_path / "second", kubeconfig_document("http://127.0.0.1:4", name="two"))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(str(p) for p in (chooser, first, second)))
    cluster = await connect("kube")
    try:
        assert isinstance(cluster, KubernetesCluster)
        assert cluster.host == "http://127.0.0.1:4"
    finally:
        await cluster.close()


async def test_an_explicit_kubeconfig_wins_over_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    path = _write(tmp_path / "config", kubeconfig_document("http://127.0.0.1:5"))
    cluster = await connect("kube", str(path))
    try:
        assert isinstance(cluster, KubernetesCluster)
        assert cluster.host == "http://127.0.0.1:5"
    finally:
        await cluster.close()


async def test_kubeconfig_from_the_environment_wins_over_the_service_account(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # controller-runtime's order: --kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    path = _write(tmp_path / "config", kubeconfig_document("http://127.0.0.1:6"))
    monkeypatch.setenv("KUBECONFIG", str(path))
    cluster = await connect("kube")
    try:
        assert isinstance(cluster, KubernetesCluster)
        assert cluster.host == "http://127.0.0.1:6"
    finally:
        await cluster.close()


async def test_the_service_account_wins_over_the_home_kubeconfig(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes_asyncio.config import incluster_config

    (home / ".kube").mkdir()
    _write(home / ".kube" / "config", kubeconfig_document("http://127.0.0.1:7"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    message = await _refused(None)
    assert message.startswith("cannot use the pod's service account")


async def test_a_pod_without_its_service_account_token_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes_asyncio.config import incluster_config

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    assert await _refused(None) == (
        "cannot use the pod's service account (KUBERNETES_SERVICE_HOST is set): service token "
        "file does not exist; mount its token and ca.crt at "
        "/var/run/secrets/kubernetes.io/serviceaccount (automountServiceAccountToken: true) or "
        "pass --kubeconfig")
