"""Shared by the chart's documentation, hook and publishing tests: the helm binary.

test_chart.py keeps its own rendering fixture (`helm`); these tests need only the binary, run
with private config and cache folders and no kubeconfig, as there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "dra-gateway"


@dataclass(frozen=True)
class HelmBinary:
    path: str
    home: Path

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home),
                "HELM_CACHE_HOME": str(self.home / "cache"),
                "HELM_CONFIG_HOME": str(self.home / "config"),
                "HELM_DATA_HOME": str(self.home / "data"),
                "KUBECONFIG": str(self.home / "no-kubeconfig")}

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.path, *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout, check=False)


@pytest.fixture(scope="session")
def helm_binary(tmp_path_factory: pytest.TempPathFactory) -> HelmBinary:
    """DRA_GATEWAY_HELM, else helm on PATH; skips without (fails in CI, CI=true)."""
    path = os.environ.get("DRA_GATEWAY_HELM") or shutil.which("helm")
    if path is None or not Path(path).is_file():
        reason = ("helm not found: set DRA_GATEWAY_HELM to a helm v3 binary or put helm on PATH"
                  f" (DRA_GATEWAY_HELM={os.environ.get('DRA_GATEWAY_HELM')!r})")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return HelmBinary(path, tmp_path_factory.mktemp("helm-binary"))
