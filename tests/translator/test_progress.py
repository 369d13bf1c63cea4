"""A long `translate` tells a terminal how far it is, on standard error only, and erases the line
when done; a pipe or a file gets nothing (kube/progress.py)."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import yaml

from dra_gateway.kube.progress import ERASE, Progress


def test_a_terminal_sees_one_line_rewritten_and_erased_at_the_end() -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = Progress("translate", stream, enabled=True, every=0.5, clock=lambda: now[0])
    progress.update("reading a.yaml: 10%")
    progress.update("reading a.yaml: 11%")  # too soon: not written
    now[0] = 0.6
    progress.update("reading a.yaml: 40%")
    progress.done()
    assert stream.getvalue() == (f"{ERASE}translate: reading a.yaml: 10%"
                                 f"{ERASE}translate: reading a.yaml: 40%{ERASE}")


def test_a_stream_that_is_no_terminal_gets_nothing() -> None:
    stream = io.StringIO()  # not a terminal
    with Progress("translate", stream) as progress:
        progress.update("reading a.yaml: 10%", force=True)
    assert stream.getvalue() == ""


def _pods(count: int) -> str:
    return yaml.safe_dump_all([{
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "cuda:12", "resources": {
            "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}}}]}}
        for i in range(count)])


def _translate(manifest: Path, stderr: int) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "dra_gateway", "translate", "-f", str(manifest)],
                          stdout=subprocess.PIPE, stderr=stderr, timeout=120, check=False)


def test_translate_reports_its_reading_and_writing_on_a_terminal_and_nothing_else_changes(
        tmp_path: Path) -> None:
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(_pods(300))
    quiet = _translate(manifest, subprocess.PIPE)
    assert quiet.returncode == 0
    assert quiet.stderr == b""  # a pipe hears nothing

    main, terminal = pty.openpty()
    try:
        shown = _translate(manifest, terminal)
        os.close(terminal)
        said = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(main)
    assert shown.returncode == 0
    assert shown.stdout == quiet.stdout  # the manifests are the same, byte for byte
    text = said.decode()
    assert f"translate: reading {manifest}: " in text
    assert "translate: writing: " in text
    assert " of 301 documents" in text  # 300 pods and the one template they share
    assert text.endswith(ERASE)  # nothing left on the line
