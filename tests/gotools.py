"""Go test tools: built once per test session from their folder, then run by the tests.

The folders (tests/kube/oracle, tests/allocator/oracle, tests/node_plugin/kubeletclient) are
small Go programs of ours on upstream Kubernetes modules. Without `go` their tests are skipped
with the reason, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest


def build_go_tool(source: Path, out_dir: Path, what: str, package: str = ".") -> Path:
    """`go build` the program in `source` (or `package`, a main package the module in
    `source` requires) into `out_dir`, named as `source` (as `package`'s last element when
    given); skip (fail in CI) without Go."""
    go = shutil.which("go")
    if go is None:
        folder = source.relative_to(Path(__file__).resolve().parent.parent)
        reason = f"go not found on PATH: {what} ({folder}) is built with Go 1.26 or newer"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    binary = out_dir / (source.name if package == "." else package.rsplit("/", 1)[-1])
    # GOTOOLCHAIN=local: a Go older than go.mod asks for fails with its message instead of
    # fetching another toolchain; -buildvcs=false: the module sits in this repository's git
    # tree and needs no build stamps.
    env = {**os.environ, "GOTOOLCHAIN": "local"}
    started = time.monotonic()
    result = subprocess.run([go, "build", "-buildvcs=false", "-o", str(binary), package],
                            cwd=source, env=env, capture_output=True, text=True, timeout=540,
                            check=False)
    if result.returncode != 0:
        pytest.fail(f"building {what} failed ({result.returncode}):\n{result.stderr}")
    print(f"{what} built in {time.monotonic() - started:.1f}s")
    return binary


class JsonLinesTool:
    """A running tool that answers one JSON line for each JSON line it reads."""

    def __init__(self, binary: Path) -> None:
        self._process = subprocess.Popen([str(binary)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, encoding="utf-8")

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        process = self._process
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"oracle exited with {process.wait()} on {request!r}")
        answer: dict[str, Any] = json.loads(line)
        assert "protocol_error" not in answer, answer
        return answer

    def close(self) -> None:
        process = self._process
        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
