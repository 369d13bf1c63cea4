"""What an operator reads to install the chart, and what `helm test` runs once it is installed.

The chart's README (`helm show readme`, its values table written from values.yaml), the
install checklist (docs/install.md), NOTES.txt's next steps, the `helm test` hook and the chart
as `helm package` ships it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gateway.cli import build_parser

from .conftest import CHART_DIR, REPO, HelmBinary

KUBE_VERSION = "1.34.0"
NAMESPACE = "dra-gateway"
HOOK = "templates/tests/smoke-pod.yaml"
CA_BUNDLE = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="  # a base64 PEM header: never parsed here


def _values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return values


def _node_plugin_labels() -> list[tuple[str, str]]:
    """(key, value) of each term of the node plugin's default node affinity."""
    terms = _values()["nodePlugin"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [(e["key"], e["values"][0]) for t in terms for e in t["matchExpressions"]]


def _install_section() -> str:
    """The install checklist: docs/install.md, one page, linked from the README's contents."""
    text = (REPO / "docs" / "install.md").read_text()
    assert text.startswith("# Install on a cluster\n")
    assert "](docs/install.md)" in (REPO / "README.md").read_text()
    return text


def _flat(text: str) -> str:
    return " ".join(text.split())


# The chart's README -------------------------------------------------------------------------


def test_helm_show_readme_shows_the_charts_readme(helm_binary: HelmBinary) -> None:
    result = helm_binary.run("show", "readme", str(CHART_DIR))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (CHART_DIR / "README.md").read_text().strip()


def test_the_values_table_is_what_values_yaml_says() -> None:
    result = subprocess.run([sys.executable, str(REPO / "hack" / "chart-values-table.py"),
                             "--check"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_the_values_table_check_fails_when_a_value_changes(tmp_path: Path) -> None:
    chart = tmp_path / "dra-gateway"
    chart.mkdir()
    shutil.copy(CHART_DIR / "README.md", chart / "README.md")
    values = (CHART_DIR / "values.yaml").read_text()
    (chart / "values.yaml").write_text(values.replace("  tag: \"\"\n", "  tag: \"9.9.9\"\n", 1))
    result = subprocess.run([sys.executable, str(REPO / "hack" / "chart-values-table.py"),
                             "--check", "--chart", str(chart)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert ("README.md: the values table differs from values.yaml; run "
            "hack/chart-values-table.py to rewrite it") in result.stderr


def test_every_top_level_value_is_in_the_charts_readme() -> None:
    readme = (CHART_DIR / "README.md").read_text()
    for key in _values():
        assert f"| `{key}` |" in readme, key


def test_the_charts_readme_has_the_checklist_in_brief() -> None:
    readme = _flat((CHART_DIR / "README.md").read_text())
    for key, value in _node_plugin_labels():
        assert f"{key}={value}" in readme
    for needed in ("--set image.repository=", "--set image.tag=",
                   "--set webhook.translation.default=audit", "--kube-version",
                   "hack/publish-image.sh", "hack/publish-chart.sh oci://", "helm test",
                   "dra-gateway report", "enable_cdi", "nodePlugin.runtimeClassName=nvidia",
                   "nodePlugin.hamiCore.hostPath"):
        assert needed in readme, needed


# The install checklist (docs/install.md) -----------------------------------------------------


def test_the_install_section_is_a_checklist_in_order() -> None:
    section = _install_section()
    headings = re.findall(r"^## (.*)$", section, flags=re.M)
    assert headings == ["1. What the cluster needs", "2. Build and publish the image",
                        "3. Install", "4. Check it"]


def test_the_install_section_names_what_the_cluster_needs() -> None:
    section = _flat(_install_section())
    for key, value in _node_plugin_labels():
        assert f"`{key}={value}`" in section
    for needed in ("Kubernetes 1.34 or later", "containerd 2.0 or later", "containerd 1.7 with",
                   "`enable_cdi = true`", "CRI-O", "`nodePlugin.runtimeClassName=nvidia`",
                   "`nodePlugin.discovery=inventory`", "libvgpu.so", "Prometheus Operator",
                   "cert-manager", "the DaemonSet has 0 pods"):
        assert needed in section, needed


def test_the_install_line_sets_the_image_and_starts_in_audit() -> None:
    section = _install_section()
    install = re.search(r"```bash\n(helm install .*?)\n```", section, flags=re.S)
    assert install is not None
    line = install.group(1)
    assert "--set image.repository=" in line
    assert "--set image.tag=" in line
    # The value the chart reads for namespaces without a label (Moving a live cluster).
    assert "--set webhook.translation.default=audit" in line
    assert _values()["webhook"]["translation"]["default"] == "enabled"
    assert section.index("hack/publish-image.sh") < section.index(line)


def test_the_install_section_says_what_to_check_and_how_to_template() -> None:
    section = _flat(_install_section())
    for needed in ("kubectl -n dra-gateway get pods", "helm test dra-gateway -n dra-gateway",
                   "dra-gateway report", "--kube-version 1.34.0", "ImagePullBackOff"):
        assert needed in section, needed


# NOTES.txt --------------------------------------------------------------------------------


def _notes(helm_binary: HelmBinary, tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it, through a probe template in a copy of the chart
    (helm template leaves NOTES out)."""
    chart = tmp_path / "chart" / CHART_DIR.name
    shutil.copytree(CHART_DIR, chart)
    (chart / "files").mkdir()
    (chart / "templates" / "NOTES.txt").rename(chart / "files" / "NOTES.txt")
    (chart / "templates" / "notes-probe.yaml").write_text(
        'notes: {{ tpl (.Files.Get "files/NOTES.txt") . | toJson }}\n')
    args = [a for s in sets for a in ("--set", s)]
    result = helm_binary.run("template", "dra-gateway", str(chart), "--namespace", NAMESPACE,
                             "--kube-version", KUBE_VERSION, "--show-only",
                             "templates/notes-probe.yaml", *args)
    assert result.returncode == 0, result.stderr
    return str(yaml.safe_load(result.stdout)["notes"])


def test_notes_say_what_to_do_when_the_daemonset_has_no_pods(helm_binary: HelmBinary,
                                                             tmp_path: Path) -> None:
    notes = _notes(helm_binary, tmp_path)
    assert "DESIRED 0 means no node matches:" in notes
    for key, value in _node_plugin_labels():
        assert f"  - {key} In {value}\n" in notes
    assert "kubectl label node NODE nvidia.com/gpu.present=true" in notes
    assert "needs nodePlugin.runtimeClassName=nvidia" in notes
    assert "ErrImagePull or ImagePullBackOff: the nodes cannot pull dra-gateway:0.1.0" in notes


def test_notes_follow_the_node_selection_and_runtime_class_given(helm_binary: HelmBinary,
                                                                 tmp_path: Path) -> None:
    notes = _notes(helm_binary, tmp_path, "nodePlugin.nodeSelector.pool=gpu",
                   "nodePlugin.runtimeClassName=nvidia")
    assert "  - and pool=gpu (nodePlugin.nodeSelector)" in notes
    assert "Discovery: NVML, through RuntimeClass nvidia." in notes


def test_notes_offer_helm_test_and_a_smoke_pod(helm_binary: HelmBinary, tmp_path: Path) -> None:
    notes = _flat(_notes(helm_binary, tmp_path))
    assert "`helm test dra-gateway -n dra-gateway` sends the webhook a dry-run pod" in notes
    assert "kubectl run gpu-smoke" in notes
    assert '"nvidia.com/gpu":"1"' in notes
    notes = _flat(_notes(helm_binary, tmp_path / "client-auth", "webhook.clientAuth.enabled=true",
                         f"webhook.clientAuth.caBundle={CA_BUNDLE}"))
    assert "`helm test` has no check with webhook.clientAuth.enabled" in notes


# The `helm test` hook ---------------------------------------------------------------------


def _hook(helm_binary: HelmBinary, *args: str) -> dict[str, Any] | None:
    result = helm_binary.run("template", "dra-gateway", str(CHART_DIR), "--namespace", NAMESPACE,
                             "--kube-version", KUBE_VERSION, *args)
    assert result.returncode == 0, result.stderr
    marker = f"# Source: dra-gateway/{HOOK}\n"
    documents = [d for d in result.stdout.split("\n---\n") if marker in d]
    assert len(documents) <= 1
    if not documents:
        return None
    pod: dict[str, Any] = yaml.safe_load(documents[0])
    return pod


def test_helm_test_runs_the_smoke_check_without_api_rights(helm_binary: HelmBinary) -> None:
    pod = _hook(helm_binary)
    assert pod is not None
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["annotations"] == {
        "helm.sh/hook": "test", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    (smoke,) = spec["containers"]
    assert smoke["image"] == "dra-gateway:0.1.0"
    args = build_parser().parse_args(smoke["args"])
    assert args.command == "smoke"
    assert args.webhook_url == "https://dra-gateway-webhook.dra-gateway.svc:443"
    # Mode helm: the CA the webhook configurations trust, with the serving key nowhere near.
    assert args.ca_env == "WEBHOOK_CA_BUNDLE"
    (env,) = smoke["env"]
    assert env["name"] == "WEBHOOK_CA_BUNDLE"
    assert env["value"]
    assert "volumes" not in spec
    assert smoke["securityContext"]["readOnlyRootFilesystem"] is True


def test_with_cert_manager_the_hook_reads_only_the_ca_of_the_secret(
        helm_binary: HelmBinary) -> None:
    pod = _hook(helm_binary, "--set", "certificates.mode=cert-manager",
                "--api-versions", "cert-manager.io/v1")
    assert pod is not None
    (smoke,) = pod["spec"]["containers"]
    assert build_parser().parse_args(smoke["args"]).ca_file == "/ca/ca.crt"
    assert pod["spec"]["volumes"] == [{"name": "ca", "secret": {
        "secretName": "dra-gateway-webhook-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]


def test_with_client_certificates_required_there_is_no_hook(helm_binary: HelmBinary) -> None:
    assert _hook(helm_binary, "--set", "webhook.clientAuth.enabled=true",
                 "--set", f"webhook.clientAuth.caBundle={CA_BUNDLE}") is None


def test_the_hook_pulls_the_image_the_release_runs(helm_binary: HelmBinary) -> None:
    pod = _hook(helm_binary, "--set", "image.repository=registry.example.com/gpu/dra-gateway",
                "--set", "image.tag=0.1.0@sha256:" + "0" * 64, "--set", "image.pullPolicy=Always",
                "--set", "imagePullSecrets[0].name=regcred")
    assert pod is not None
    (smoke,) = pod["spec"]["containers"]
    assert smoke["image"] == "registry.example.com/gpu/dra-gateway:0.1.0@sha256:" + "0" * 64
    assert smoke["imagePullPolicy"] == "Always"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


# The chart as `helm package` ships it ------------------------------------------------------


def test_the_packaged_chart_lints_and_carries_its_readme_and_test(helm_binary: HelmBinary,
                                                                   tmp_path: Path) -> None:
    result = helm_binary.run("package", str(CHART_DIR), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    version = _chart_version()
    package = tmp_path / f"dra-gateway-{version}.tgz"
    assert result.stdout.strip().endswith(str(package))
    with tarfile.open(package) as archive:
        names = set(archive.getnames())
    assert {"dra-gateway/README.md", f"dra-gateway/{HOOK}", "dra-gateway/values.schema.json",
            "dra-gateway/templates/NOTES.txt"} <= names
    lint = helm_binary.run("lint", "--strict", str(package), "--namespace", NAMESPACE,
                           "--kube-version", KUBE_VERSION)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _chart_version() -> str:
    chart: dict[str, Any] = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    return str(chart["version"])


@pytest.mark.parametrize("script", ["publish-image.sh", "publish-chart.sh",
                                    "build-registry-tools.sh"])
def test_the_publishing_scripts_parse_and_say_how_to_use_them(script: str) -> None:
    path = REPO / "hack" / script
    assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
    result = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 1
    assert "usage: hack/" in result.stderr
