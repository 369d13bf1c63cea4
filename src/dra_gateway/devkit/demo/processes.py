"""The demo's child processes: the work directory's layout, the files the components need, starting
the embedded API server and the components, stopping every one of them, and the readiness
checks the demo waits on.

It must not create or judge pods: it only brings the components up and down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.devkit.demo.common import (
    _POLL_S,
    DEMO_DIR,
    GRACE_S,
    NAMESPACE,
    NODES,
    WEBHOOK_SERVICE,
    DemoError,
)
from dra_gateway.devkit.simnode import install_hami_core

LOG_TAIL_LINES = 25


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join(tail) if tail else "(empty log)"


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes]

    def check(self, step: str) -> None:
        code = self.process.poll()
        if code is not None:
            raise DemoError(step, f"{self.name} exited with code {code}", log=self.log)


@dataclass
class Children:
    """The processes the demo started, stopped together and always."""

    log_dir: Path
    started: list[Child] = field(default_factory=list)

    def start(self, name: str, *args: str) -> Child:
        argv = [sys.executable, "-m", "dra_gateway", *args]
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=env)
        child = Child(name, argv, log, process)
        self.started.append(child)
        return child

    def check(self, step: str) -> None:
        for child in self.started:
            child.check(step)

    def ended(self) -> list[str]:
        """Names of the children that have exited."""
        return [c.name for c in self.started if c.process.poll() is not None]

    def stop(self, grace: float = GRACE_S) -> list[str]:
        """SIGTERM every child, SIGKILL what is left after `grace`; names of those killed.

        The first child (the API server) goes last, so the others can still release their
        Lease and say goodbye through it.
        """
        killed = self._stop(self.started[1:], grace)
        return killed + self._stop(self.started[:1], grace)

    @staticmethod
    def _stop(children: Sequence[Child], grace: float) -> list[str]:
        for child in children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        killed: list[str] = []
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(child.name)
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                child.process.wait()
        return killed


def free_port() -> int:
    """A loopback port free right now (the API server must know the webhook's before both run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Setup -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Layout:
    root: Path
    # Node plugins' kubelet sockets live below here: a unix socket path holds at most 107
    # bytes, so a deep work directory gets a short temporary one beside it.
    nodes_root: Path

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def seed(self) -> Path:
        return self.root / "seed-gateway.yaml"

    def node(self, name: str) -> Path:
        return self.nodes_root / name


def prepare(layout: Layout) -> None:
    """Certificates and the gateway's cluster-wide objects, written into the work directory."""
    import yaml

    from dra_gateway.certs.generate import make_bundle, write_bundle
    from dra_gateway.node_plugin.deviceclasses import device_classes
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.webhook.config import configurations

    for folder in (layout.logs, layout.nodes_root):
        folder.mkdir(parents=True, exist_ok=True)
    # The API server dials the webhook as NAME.NAMESPACE.svc (checked against the certificate)
    # at the loopback address it was given for that Service.
    bundle = make_bundle(dns_names=[f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"],
                         ip_addresses=["127.0.0.1"])
    paths = write_bundle(bundle, layout.certs)
    mutating, validating = configurations(
        load_rules(), service_namespace=NAMESPACE, service_name=WEBHOOK_SERVICE,
        ca_bundle=paths.ca_cert.read_bytes(), gateway_namespace=NAMESPACE)
    documents = [*device_classes(), mutating, validating]
    layout.seed.write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")


def start_api(children: Children, layout: Layout, webhook_port: int, *,
              policies: Sequence[Path] = ()) -> Child:
    return children.start(
        "cluster", "cluster", "serve", "--listen", "127.0.0.1:0",
        "--kubeconfig", str(layout.kubeconfig),
        # HTTPS, so that kubectl sends the kubeconfig's token (demo --serve).
        "--tls-dir", str(layout.certs), "--ca-file", str(layout.certs / "ca.crt"),
        "--seed", str(DEMO_DIR / "seed.yaml"), "--seed", str(layout.seed),
        *(arg for path in policies for arg in ("--policies", str(path))),
        "--webhook-service", f"{NAMESPACE}/{WEBHOOK_SERVICE}=127.0.0.1:{webhook_port}")


def start_components(children: Children, layout: Layout, webhook_port: int) -> None:
    kube = ("--cluster", "kube", "--kubeconfig", str(layout.kubeconfig))
    # The embedded API server keeps consumable-capacity fields (as Kubernetes 1.36 does): the
    # node plugins and the allocator both detect it with their defaults, so shared cards are
    # published natively and the allocator hands out native shares.
    children.start("webhook", "webhook", "--listen", f"127.0.0.1:{webhook_port}",
                   "--tls-dir", str(layout.certs), "--ca-file", str(layout.certs / "ca.crt"),
                   "--namespace", NAMESPACE, *kube)
    children.start("allocator", "allocator", "--namespace", NAMESPACE, *kube)
    for node, inventory in NODES:
        base = layout.node(node)
        children.start(f"node-plugin-{node}", "node-plugin", "serve",
                       "--inventory", str(DEMO_DIR / inventory), "--node-name", node,
                       "--plugins-dir", str(base / "plugins"),
                       "--registry-dir", str(base / "registry"),
                       "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
                       "--hami-library", str(install_hami_core(base / "hami-core")),
                       *kube)


async def wait_for(step: str, children: Children, deadline: float, culprit: Child | None,
                   ready: Callable[[], Awaitable[bool]], waiting_for: str) -> None:
    """Poll the coroutine function `ready` until true; children dying or time running out fail."""
    while True:
        children.check(step)
        if await ready():
            return
        if time.monotonic() > deadline:
            raise DemoError(step, f"timed out waiting for {waiting_for}",
                            log=culprit.log if culprit else None)
        await asyncio.sleep(_POLL_S)


def _api_started(layout: Layout, api: Child) -> bool:
    return layout.kubeconfig.is_file() and "serving the Kubernetes API" in log_tail(api.log, 200)


def _webhook_ssl(layout: Layout) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(layout.certs / "ca.crt"))


async def webhook_ready(port: int, context: ssl.SSLContext) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"https://127.0.0.1:{port}/readyz", ssl=context,
                timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def slices_published(cluster: Cluster) -> set[str]:
    from dra_gateway.kube import names
    from dra_gateway.kube.resources import RESOURCE_SLICES

    listed = await cluster.list(RESOURCE_SLICES)
    return {str(s["spec"].get("nodeName")) for s in listed.items
            if s["spec"].get("driver") == names.DRIVER and s["spec"].get("devices")}


async def allocator_leads(cluster: Cluster) -> bool:
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import LEASES

    try:
        lease = await cluster.get(LEASES, "dra-gateway-allocator", namespace=NAMESPACE)
    except NotFound:
        return False
    return bool((lease.get("spec") or {}).get("holderIdentity"))
