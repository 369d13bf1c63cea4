"""The registry tools of hack/build-registry-tools.sh for the tests that publish:
go-containerregistry's crane (what hack/publish-image.sh pushes with) and the CNCF distribution
registry, served as a real registry (tests/helm/test_publish.py on loopback, the chart tier on
the real node's network).

Without `go` the tools cannot be built: the test skips with the reason, except in CI (CI=true),
where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BUILD_TOOLS = REPO / "hack" / "build-registry-tools.sh"
PUBLISH_IMAGE = REPO / "hack" / "publish-image.sh"


def registry_tool(name: str) -> Path:
    """crane or registry, built (once, cached) by hack/build-registry-tools.sh."""
    if shutil.which("go") is None:
        reason = f"go not found on PATH: {name} is built with Go 1.26 or newer ({BUILD_TOOLS.name})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    result = subprocess.run(["bash", str(BUILD_TOOLS), name], capture_output=True, text=True,
                            timeout=1500, check=False)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serve_registry(work: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """host:port of a distribution registry listening on `host` over plain HTTP, storing in
    `work`; stopped on exit."""
    binary = registry_tool("registry")
    work.mkdir(parents=True, exist_ok=True)
    port = _free_port(host)
    config = work / "config.yml"
    config.write_text(yaml.safe_dump({
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(work / "data")}},
        "http": {"addr": f"{host}:{port}"}}))
    log = (work / "registry.log").open("w")
    process = subprocess.Popen([str(binary), "serve", str(config)], stdout=log,
                               stderr=subprocess.STDOUT,
                               env={**os.environ, "OTEL_TRACES_EXPORTER": "none"})
    try:
        deadline = time.monotonic() + 30
        # Straight to the registry, whatever proxy the environment names.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            try:
                with opener.open(f"http://{host}:{port}/v2/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    text = (work / "registry.log").read_text()
                    pytest.fail(f"the registry did not start: {text}")
                time.sleep(0.2)
        yield f"{host}:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def publish_image(crane: Path, *args: str, insecure: bool = False
                  ) -> subprocess.CompletedProcess[str]:
    """hack/publish-image.sh `args` with `crane`; `insecure`: PUBLISH_INSECURE=1 (a registry
    served over plain HTTP elsewhere than on loopback)."""
    env = {**os.environ, "CRANE": str(crane)}
    if insecure:
        env["PUBLISH_INSECURE"] = "1"
    return subprocess.run(["bash", str(PUBLISH_IMAGE), *args], capture_output=True, text=True,
                          timeout=300, check=False, env=env)
