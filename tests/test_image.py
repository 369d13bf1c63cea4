"""The image is what CI tested: the Dockerfile installs with the pins of the README's commands
(constraints.txt), on the Python those pins were written with, and the production build leaves
the development kit out."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _runs() -> list[list[str]]:
    """Each RUN instruction of the Dockerfile, continuations joined, split into words."""
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    runs = [shlex.split(line.split(None, 1)[1]) for line in joined.splitlines()
            if line.startswith("RUN ")]
    # RUN's own flags (--mount=...) come before the command.
    return [words[next(i for i, w in enumerate(words) if not w.startswith("--")):]
            for words in runs]


def _pip_commands() -> list[list[str]]:
    commands: list[list[str]] = []
    for words in _runs():
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", ";"):
                if command[:1] == ["pip"]:
                    commands.append(command)
                command = []
            elif command or not re.fullmatch(r"[A-Z_]+=\S*", word):  # VAR=value first: env
                command.append(word)
    return commands


def test_every_pip_install_of_the_image_is_constrained_by_the_tested_pins() -> None:
    commands = _pip_commands()
    assert {c[1] for c in commands} == {"wheel", "install"}, commands
    for command in commands:
        flags = [w for i, w in enumerate(command) if command[i - 1] in ("-c", "--constraint")]
        assert flags, f"pip {command[1]} runs without constraints.txt: {command}"
        assert all(Path(f).name == "constraints.txt" for f in flags), command


def test_the_image_runs_the_python_the_pins_were_written_with() -> None:
    pinned = re.search(r"with Python (\d+\.\d+)", (ROOT / "constraints.txt").read_text())
    assert pinned is not None
    images = re.findall(r"^FROM python:(\d+\.\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert images, "the Dockerfile names no python base image"
    assert set(images) == {pinned.group(1)}


def test_the_production_build_leaves_the_development_kit_out(tmp_path: Path) -> None:
    """The image's wheel (DRA_GATEWAY_PRODUCTION=1, setup.py) holds every component and no
    devkit (simulator, demo, benches); installed alone, its command works without the kit's
    commands and says what to use instead of the embedded cluster."""
    source = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        origin = ROOT / name
        if origin.is_symlink() or origin.is_file():
            target = source / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if origin.is_symlink():
                target.symlink_to(os.readlink(origin))
            else:
                shutil.copy2(origin, target)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(source)], check=True, timeout=300,
                   env={**os.environ, "DRA_GATEWAY_PRODUCTION": "1"})
    [wheel] = wheels.glob("dra_gateway-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("dra_gateway/devkit/")]
    packages = {n.split("/")[1] for n in names if n.startswith("dra_gateway/") and n.count("/") > 1}
    assert packages >= {"allocator", "webhook", "node_plugin", "translator", "policy", "kube",
                        "certs", "migrate", "examples"}
    installed = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(installed), str(wheel)], check=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(installed)}

    def dra_gateway(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dra_gateway", *args], env=env,
                              capture_output=True, text=True, timeout=60, check=False)

    shown = dra_gateway("--help")
    assert shown.returncode == 0, shown.stderr
    commands = {line.split()[0] for line in shown.stdout.splitlines()
                if line.startswith("    ") and line.split()}
    assert {"translate", "webhook", "allocator", "node-plugin", "report"} <= commands
    assert not commands & {"demo", "bench", "cluster"}
    refused = dra_gateway("allocator", "--cluster", "memory")
    assert refused.returncode == 2
    assert "use --cluster kube" in refused.stderr
