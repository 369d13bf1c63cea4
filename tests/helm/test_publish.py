"""Publishing to a real registry: hack/publish-image.sh pushes the OCI archive with crane and
hack/publish-chart.sh pushes the packaged chart, both to the CNCF distribution registry served on
loopback; what comes back is compared digest for digest.

crane and the registry are built pinned from the Go module proxy by
hack/build-registry-tools.sh (cached: a second run builds nothing; tests/registrytools.py).
Without `go` these tests skip with the reason, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from registrytools import publish_image, registry_tool, serve_registry

from dra_gateway.devkit.ociarchive import write_archive

from .conftest import CHART_DIR, REPO, HelmBinary


@pytest.fixture(scope="module")
def crane() -> Path:
    return registry_tool("crane")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a distribution registry on loopback, storing in a temporary folder."""
    with serve_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A small OCI archive as hack/build-image.sh writes it, and its manifest's digest."""
    work = tmp_path_factory.mktemp("image")
    (work / "hello").write_text("dra-gateway publish test\n")
    layer = work / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        tar.add(work / "hello", arcname="hello")
    out = work / "image.oci.tar"
    digest = write_archive(out, "dra-gateway.local/dra-gateway:0.1.0", [layer],
                           {"Entrypoint": ["dra-gateway"], "User": "65532:65532"})
    return out, digest


def _app_version() -> str:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def test_publish_image_pushes_the_archive_and_prints_the_values_to_install(
        crane: Path, registry: str, archive: tuple[Path, str]) -> None:
    path, digest = archive
    repository = f"{registry}/gpu/dra-gateway"
    result = publish_image(crane, repository, str(path))
    assert result.returncode == 0, result.stderr
    tag = _app_version()
    assert result.stdout.splitlines() == [
        f"{repository}@{digest}",
        f"--set image.repository={repository} --set image.tag={tag}",
        f"# or pinned to what was pushed: --set image.repository={repository} "
        f"--set image.tag={tag}@{digest}"]
    # What the registry serves under the tag is the archive's manifest, byte for byte.
    pulled = subprocess.run([str(crane), "digest", f"{repository}:{tag}"], capture_output=True,
                            text=True, timeout=60, check=False)
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == digest
    config = subprocess.run([str(crane), "config", f"{repository}@{digest}"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert '"Entrypoint":["dra-gateway"]' in config.stdout


def test_publish_image_takes_the_tag_given(crane: Path, registry: str,
                                           archive: tuple[Path, str]) -> None:
    path, digest = archive
    result = publish_image(crane, f"{registry}/gpu/dra-gateway:rc1", str(path))
    assert result.returncode == 0, result.stderr
    assert "--set image.tag=rc1\n" in result.stdout + "\n"
    pulled = subprocess.run([str(crane), "digest", f"{registry}/gpu/dra-gateway:rc1"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert pulled.stdout.strip() == digest


def test_publish_image_refuses_a_name_without_registry_and_a_missing_archive(
        crane: Path, tmp_path: Path) -> None:
    result = publish_image(crane, "dra-gateway:0.1.0", str(tmp_path / "none.tar"))
    assert result.returncode == 1
    assert ("dra-gateway:0.1.0: name the registry too (REGISTRY/REPOSITORY[:TAG]), or the nodes "
            "would pull from Docker Hub") in result.stderr
    result = publish_image(crane, "127.0.0.1:1/gpu/dra-gateway", str(tmp_path / "none.tar"))
    assert result.returncode == 1
    assert f"{tmp_path / 'none.tar'} not found: build it first with `sudo hack/build-image.sh`" \
        in result.stderr


def test_publish_chart_pushes_a_package_helm_installs_from(helm_binary: HelmBinary,
                                                           registry: str, tmp_path: Path) -> None:
    target = f"oci://{registry}/charts"
    result = subprocess.run(["bash", str(REPO / "hack" / "publish-chart.sh"), target],
                            capture_output=True, text=True, timeout=300, check=False,
                            env={**helm_binary.env, "DRA_GATEWAY_HELM": helm_binary.path,
                                 "DIST": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["version"]
    package, pushed, install = result.stdout.splitlines()
    assert package == str(tmp_path / f"dra-gateway-{version}.tgz")
    reference, _, digest = pushed.partition("@")
    assert reference == f"{registry}/charts/dra-gateway:{version}"
    assert digest.startswith("sha256:")
    assert install.startswith(f"helm install dra-gateway {target}/dra-gateway --version "
                              f"{version} --plain-http -n dra-gateway --create-namespace")
    shown = helm_binary.run("show", "chart", f"{target}/dra-gateway", "--version", str(version),
                            "--plain-http")
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout)["name"] == "dra-gateway"
    readme = helm_binary.run("show", "readme", f"{target}/dra-gateway", "--version",
                             str(version), "--plain-http")
    assert readme.stdout.strip() == (CHART_DIR / "README.md").read_text().strip()
