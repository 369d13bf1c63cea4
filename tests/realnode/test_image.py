"""The gateway's image, built without a container engine (hack/build-image.sh: Debian's Python
3.11, the project's wheels with constraints.txt, an OCI archive), imported into the real node's
containerd and run by the real kubelet as the chart runs its components: its own non-root user,
a read-only root file system, no capability."""

from __future__ import annotations

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
