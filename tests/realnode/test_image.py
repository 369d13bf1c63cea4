"""The gateway's image, built without a container engine (hack/build-image.sh: Debian's Python
3.11, the project's wheels with constraints.txt, an OCI archive), imported into the real node's
containerd and run by the real kubelet as the chart runs its components: its own non-root user,
a read-only root file system, no capability."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from e2e.support import wait_until

from realnode.support import WORKLOADS, Cluster


def test_the_image_runs_the_gateway_as_the_chart_runs_it(
        cluster: Cluster, gateway_image: tuple[Path, str]) -> None:
    archive, name = gateway_image
    cluster.node.import_image(archive)
    cluster.create_pod({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gateway-image"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c0", "image": name,
            # The entrypoint is dra-gateway; this lists the rules it would translate with.
            "args": ["translate", "--help"],
            "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}}]}})

    def finished() -> bool:
        return cluster.pod("gateway-image").get("status", {}).get("phase") in (
            "Succeeded", "Failed")

    wait_until("the image's container to finish", finished, 120, cluster.check)
    pod = cluster.pod("gateway-image")
    output = cluster.node.container_log(WORKLOADS, "gateway-image", "c0")
    assert pod["status"]["phase"] == "Succeeded", f"{pod['status']}\n{output}"
    assert "usage: dra-gateway translate" in output
    [status] = pod["status"]["containerStatuses"]
    assert status["user"]["linux"]["uid"] == 65532  # the image's own user, not root
    cluster.delete_pod("gateway-image")


def _layer_files(archive: Path) -> list[str]:
    """The paths of every file in the OCI archive's layers."""
    found: list[str] = []
    with tarfile.open(archive) as outer:
        for member in outer.getmembers():
            if not member.name.startswith("blobs/") or not member.isfile():
                continue
            data = outer.extractfile(member)
            assert data is not None
            blob = data.read()
            if not tarfile.is_tarfile(io.BytesIO(blob)):
                continue  # the manifest and the config
            with tarfile.open(fileobj=io.BytesIO(blob)) as layer:
                found += layer.getnames()
    return found


def test_the_image_holds_the_components_and_no_development_kit(
        gateway_image: tuple[Path, str]) -> None:
    archive, _ = gateway_image
    files = [f for f in _layer_files(archive) if "/site-packages/dra_gateway/" in f]
    assert any("/dra_gateway/node_plugin/" in f for f in files)
    assert not [f for f in files if "/dra_gateway/devkit/" in f]
