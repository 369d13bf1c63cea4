"""The image is what CI tested: the Dockerfile installs with the pins of the README's commands
(constraints.txt), on the Python those pins were written with."""

from __future__ import annotations

import re
import shlex
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
            else:
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
