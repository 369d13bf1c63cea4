"""Running the webhook: TLS, the cluster connection, graceful shutdown and worker processes.

`serve` runs one server process until SIGTERM/SIGINT (or a given stop event): it stops
accepting connections, lets in-flight reviews finish (up to `shutdown_timeout`), then closes
the cluster connection. `run` starts `workers` such processes on one port with SO_REUSEPORT, so
the kernel spreads connections over them (more than one core without a proxy in front); the
parent forwards termination signals and exits when any worker fails, so the pod restarts whole.
Threads were rejected: admission work is CPU-bound Python and the GIL would serialise it.

This module must not decide anything about pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from aiohttp import web

from dra_gateway.certs.tls import CertificateReloader
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.kube.runtime.collector import settle
from dra_gateway.webhook import logs
from dra_gateway.webhook.app import create_app, create_probe_app
from dra_gateway.webhook.settings import WebhookSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "0.0.0.0"
    port: int = 8443
    cluster: Literal["kube", "memory"] = "kube"
    kubeconfig: str | None = None
    client_ca: Path | None = None
    # Plain-HTTP port of /healthz, /readyz and /metrics (None: only on the admission port).
    probe_host: str = "0.0.0.0"
    probe_port: int | None = None
    workers: int = 1
    shutdown_timeout: float = 10.0
    certificate_poll_interval: float = 2.0
    log_level: int = logging.INFO


async def serve(settings: WebhookSettings, options: ServeOptions, *,
                reuse_port: bool = False, cluster: Cluster | None = None,
                stop: asyncio.Event | None = None,
                started: Callable[[int], None] | None = None) -> None:
    """Serve until `stop` is set, or until SIGTERM/SIGINT when no event is given."""
    if settings.tls_dir is None:
        raise ValueError("the webhook serves TLS only: give --tls-dir with tls.crt and tls.key")
    tls = CertificateReloader.from_dir(settings.tls_dir, client_ca=options.client_ca,
                                       interval=options.certificate_poll_interval)
    own_cluster = cluster is None
    if cluster is None:
        cluster = await connect(options.cluster, options.kubeconfig)
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    try:
        # No access log: one INFO line per review costs more than the review itself.
        app = create_app(settings, cluster, tls=tls)
        runner = web.AppRunner(app, access_log=None,
                               handle_signals=False, shutdown_timeout=options.shutdown_timeout)
        await runner.setup()
        probes: web.AppRunner | None = None
        if options.probe_port is not None:
            probes = web.AppRunner(create_probe_app(app), access_log=None, handle_signals=False,
                                   shutdown_timeout=1.0)
            await probes.setup()
        # Everything loaded so far (rules, compiled CEL, modules) lives as long as the process:
        # moved out of the collector's reach, it no longer lengthens the collections that run
        # between reviews, which shows in tail latency.
        settle()
        try:
            site = web.TCPSite(runner, options.host, options.port, ssl_context=tls.context,
                               reuse_port=reuse_port or None, backlog=1024)
            await site.start()
            port = int(runner.addresses[0][1])
            if probes is not None:
                await web.TCPSite(probes, options.probe_host, options.probe_port,
                                  reuse_port=reuse_port or None).start()
                log.info("health and metrics serving", extra={
                    "host": options.probe_host, "port": int(probes.addresses[0][1])})
            log.info("webhook serving", extra={"host": options.host, "port": port,
                                               "certificate": tls.fingerprint,
                                               "clientCertificates": options.client_ca is not None})
            if started is not None:
                started(port)
            await stop.wait()
            log.info("webhook stopping: finishing in-flight reviews",
                     extra={"timeout": options.shutdown_timeout})
        finally:
            if probes is not None:
                await probes.cleanup()
            await runner.cleanup()
            gc.unfreeze()
    finally:
        if own_cluster:
            await cluster.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)


def _worker(settings: WebhookSettings, options: ServeOptions) -> None:
    logs.configure(options.log_level)
    asyncio.run(serve(settings, options, reuse_port=True))


def run(settings: WebhookSettings, options: ServeOptions) -> int:
    """Serve in this process (one worker) or in `options.workers` processes; an exit code."""
    logs.configure(options.log_level)
    if options.workers <= 1:
        asyncio.run(serve(settings, options))
        return 0
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_worker, args=(settings, options), name=f"webhook-{i}",
                           daemon=False) for i in range(options.workers)]
    for process in workers:
        process.start()
    stopping = False

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in workers:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = 0
        sentinels = {p.sentinel: p for p in workers}
        while sentinels:
            ready = multiprocessing.connection.wait(list(sentinels))
            for sentinel in ready:
                assert isinstance(sentinel, int)
                process = sentinels.pop(sentinel)
                process.join()
                if process.exitcode != 0 and not stopping:
                    log.error("webhook worker exited, stopping the others",
                              extra={"worker": process.name, "exitcode": process.exitcode})
                    code = 1
                    forward(signal.SIGTERM, None)
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
