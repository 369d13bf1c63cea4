"""CI builds the clusters in the background while the suite runs (.ci/run): the suite's order
and the builds' order are one list (tests/conftest.py BUILD_ORDER), and every cluster test runs
after the build it needs, the tests that need none first."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BUILD_ORDER
from e2e.conftest import NARROW_SETUPS
from e2e.conftest import SETUPS as E2E_SETUPS
from realnode.support import SETUPS as NODE_SETUPS

REPO = Path(__file__).resolve().parent.parent


def test_ci_builds_in_the_order_the_suite_runs_its_tiers() -> None:
    run = (REPO / ".ci" / "run").read_text()
    listed = re.search(r"^builds=\(\n(.*?)^\)", run, re.MULTILINE | re.DOTALL)
    assert listed, ".ci/run lists its background builds in builds=( ... )"
    builds = [tuple(line.strip().strip('"').split()) for line in listed[1].splitlines()]
    assert builds == list(BUILD_ORDER)


def test_every_release_a_tier_runs_is_built() -> None:
    planes = {kind_version[1] for kind_version in BUILD_ORDER}
    nodes = {version for kind, version in BUILD_ORDER if kind == "node"}
    assert {version for _id, version, _gates in E2E_SETUPS + NARROW_SETUPS} <= planes
    assert {plane for _id, plane, _kubelet in NODE_SETUPS} <= planes
    assert {kubelet for _id, _plane, kubelet in NODE_SETUPS} <= nodes


def test_each_cluster_test_runs_after_its_build_and_after_every_other_test() -> None:
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
         "tests/e2e", "tests/realnode", "tests/realchart", "tests/devkit/sim/test_kubectl.py",
         "tests/translator/test_cli.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout
    ids = [line for line in collected.splitlines() if "::" in line]
    assert ids

    def build_of(test_id: str) -> int:
        """Where in BUILD_ORDER the build this test needs is (-1: none), from its id."""
        setup = re.search(r"\[(1\.\d+\.\d+(?:-(?:alpha|beta|rc)\.\d+)?)", test_id)
        version = setup[1] if setup else None
        if test_id.startswith("tests/e2e/test_workload_api.py"):
            version = "1.37.2"
        if test_id.startswith("tests/devkit/sim/test_kubectl.py"):
            return min(i for i, (kind, _v) in enumerate(BUILD_ORDER) if kind == "node")
        if version is None:
            return -1
        if test_id.startswith(("tests/realnode/", "tests/realchart/")):
            kubelet = {plane: kubelet for _id, plane, kubelet in NODE_SETUPS}[version]
            return max(BUILD_ORDER.index(("node", kubelet)),
                       next(i for i, (_k, v) in enumerate(BUILD_ORDER) if v == version))
        return next(i for i, (_k, v) in enumerate(BUILD_ORDER) if v == version)

    needed = [build_of(test_id) for test_id in ids]
    assert needed == sorted(needed), "a test runs before a test that needs an earlier build"
    assert needed[0] == -1
    assert needed[-1] == len(BUILD_ORDER) - 1
    # Each setup (the narrow ones too) is made once: its tests are together.
    every = E2E_SETUPS + NARROW_SETUPS
    setups = sorted((setup_id for setup_id, _v, _g in every), key=len, reverse=True)
    runs = [next(s for s in setups if i.split("[", 1)[1].startswith(s))
            for i in ids if i.startswith("tests/e2e/") and "[1." in i]
    assert len([s for n, s in enumerate(runs) if n == 0 or runs[n - 1] != s]) == len(every)


@pytest.mark.skipif(shutil.which("go") is None or shutil.which("flock") is None,
                    reason="the build script needs go and flock on PATH")
def test_two_builds_of_one_release_take_turns(tmp_path: Path) -> None:
    """The suite's build of a release waits for .ci/run's background build of it, then finds
    its binaries instead of writing them a second time."""
    release = tmp_path / "1.99.0"
    (release / "src").mkdir(parents=True)
    (release / "src" / "go.mod").write_text("module dra-gateway.local/kube\n\ngo 1.24.0\n")
    (release / "src" / "go.sum").write_text("")
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        (release / name).write_text("#!/bin/sh\n")
        (release / name).chmod(0o755)
    for folder, names in (("_etcd-v3.6.5", ["etcd"]), ("_kwok-v0.8.0", ["kwok"])):
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / name).write_text("#!/bin/sh\n")
            (tmp_path / folder / name).chmod(0o755)
    (tmp_path / "_kwok-v0.8.0" / "kwok-stages.yaml").write_text("")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "DRA_GATEWAY_KUBE_CACHE": str(tmp_path), "ETCD_VERSION": "v3.6.5",
           "KWOK_VERSION": "v0.8.0"}
    said = tmp_path / "stderr"
    with (tmp_path / "1.99.0.lock").open("w") as held, said.open("w") as stderr:
        fcntl.flock(held, fcntl.LOCK_EX)
        second = subprocess.Popen(["bash", str(REPO / "hack" / "build-control-plane.sh"),
                                   "1.99.0"], env=env, stdout=subprocess.PIPE,
                                  stderr=stderr, text=True)
        deadline = time.monotonic() + 60
        while "waiting for another build of 1.99.0" not in said.read_text():
            assert second.poll() is None, (second.communicate(), said.read_text())
            assert time.monotonic() < deadline, said.read_text()
            time.sleep(0.05)
        time.sleep(0.2)
        assert second.poll() is None  # it waits while the lock is held
    out, _ = second.communicate(timeout=60)
    err = said.read_text()
    assert second.returncode == 0, err
    assert f"have {release}/kube-apiserver" in err
    assert out.strip() == str(release)
