"""The kubelet's gRPC services over unix sockets: plugin registration, DRAPlugin v1/v1beta1 and
DRAResourceHealth v1/v1alpha1.

The DRA socket (`<plugins-dir>/<driver>/dra.sock`) serves both DRAPlugin versions from one
implementation, and the devices' health (`HealthFeed`: the complete list at once, again at every
change and at least every `HEALTH_RESEND_SECONDS`, within the timeout it tells the kubelet;
every `HEALTH_FIRST_RESEND_SECONDS` during a stream's first `HEALTH_FIRST_SECONDS`),
which a kubelet from 1.36 (1.34 and 1.35 with ResourceHealthStatus on) writes into the status of
the pods using them; the registration socket (`<registry-dir>/<driver>-reg.sock`) tells the
kubelet's plugin watcher the driver name, the DRA endpoint and the versions. The DRA socket
starts first, so the kubelet never connects to an endpoint that is not there yet. Handlers only
convert messages and call the `Preparer`: every decision lives there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import grpc.aio

from dra_gateway.kube import names
from dra_gateway.node_plugin.prepare import ClaimRef, Preparer
from dra_gateway.node_plugin.proto import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# After the DRAPlugin services: the kubelet takes the first of the list it knows as the DRA
# service, and picks the health service from the rest.
HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
# The kubelet deems a device's health unknown after this long without an update (its default,
# for a plugin that does not say, is 30 s); the feed resends well within it.
HEALTH_TIMEOUT_SECONDS = 60
HEALTH_RESEND_SECONDS = 15.0
# A kubelet clears a driver's health when a stream of that driver ends (kubelet/cm/dra
# manager.go: clearDriver), even while another instance's stream is open: in a rolling update
# the old plugin's stream ends shortly after the new one opened, and the devices read Unknown
# until the new one sends again. A new stream is therefore resent to often for a while.
HEALTH_FIRST_RESEND_SECONDS = 2.0
HEALTH_FIRST_SECONDS = 120.0
MAX_HEALTH_MESSAGE = 1024
DEFAULT_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
MAX_UNIX_PATH = 107  # sun_path is 108 bytes with the terminating NUL
SHORT_INSTANCE = 12  # the longest instance socket names carry as it is
_INSTANCE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def socket_tag(instance: str) -> str:
    """What an instance's socket names carry: the instance itself when it is short, otherwise
    the first 12 hex digits of its SHA-256. A pod UID has 36 characters, and under a kubelet
    root such as MicroK8s' (/var/snap/microk8s/common/var/lib/kubelet) the registration socket
    named by it would pass the 107 bytes a unix socket path may have."""
    if len(instance) <= SHORT_INSTANCE:
        return instance
    return hashlib.sha256(instance.encode()).hexdigest()[:SHORT_INSTANCE]


def dra_socket_path(plugins_dir: Path, driver: str = names.DRIVER, instance: str = "") -> Path:
    """The DRA service's socket: one per instance when plugins replace each other in a rolling
    update (`instance`: the pod's UID), so the old one keeps serving until the new one is
    registered."""
    return plugins_dir / driver / (f"dra-{socket_tag(instance)}.sock" if instance
                                   else "dra.sock")


def registration_socket_path(registry_dir: Path, driver: str = names.DRIVER,
                             instance: str = "") -> Path:
    """The registration socket the kubelet watches for: with `instance`, a new pod's socket
    sits beside the old one's, and the kubelet (1.33 and later) sends its calls to the newest
    registration while both exist, and keeps the driver registered when the old one goes."""
    return registry_dir / (f"{driver}-{socket_tag(instance)}-reg.sock" if instance
                           else f"{driver}-reg.sock")


class _DraService:
    """NodePrepareResources / NodeUnprepareResources for one proto version's messages."""

    def __init__(self, preparer: Preparer, pb2: ModuleType) -> None:
        self._preparer = preparer
        self._pb2 = pb2

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
                                   ) -> Any:
        refs = [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]
        results = await self._preparer.prepare(refs)
        response = self._pb2.NodePrepareResourcesResponse()
        for ref in refs:  # every claim the kubelet named must be answered
            result = results[ref.uid]
            entry = response.claims[ref.uid]
            entry.error = result.error
            for device in result.devices:
                entry.devices.add(**device)
        return response

    async def NodeUnprepareResources(self, request: Any,
                                     context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        refs = [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]
        errors = await self._preparer.unprepare(refs)
        response = self._pb2.NodeUnprepareResourcesResponse()
        for ref in refs:
            response.claims[ref.uid].error = errors[ref.uid]
        return response


class DraServiceV1(_DraService, dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        super().__init__(preparer, dra_v1_pb2)


class DraServiceV1beta1(_DraService, dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        super().__init__(preparer, dra_v1beta1_pb2)


@dataclass(frozen=True, slots=True)
class DeviceHealthState:
    """One device's health as the kubelet is told it."""

    pool: str
    device: str
    healthy: bool
    message: str = ""


class HealthFeed:
    """The devices' health for every kubelet stream: `changed()` sends the list again."""

    def __init__(self, devices: Callable[[], Sequence[DeviceHealthState]], *,
                 resend_seconds: float = HEALTH_RESEND_SECONDS,
                 first_resend_seconds: float = HEALTH_FIRST_RESEND_SECONDS,
                 first_seconds: float = HEALTH_FIRST_SECONDS) -> None:
        self._devices = devices
        self._resend_seconds = resend_seconds
        self._first_resend_seconds = first_resend_seconds
        self._first_seconds = first_seconds
        self._streams: set[asyncio.Event] = set()

    def changed(self) -> None:
        for wake in self._streams:
            wake.set()

    async def stream(self, pb2: ModuleType) -> AsyncIterator[Any]:
        """Responses of `pb2`'s version: now, at every change, and at least every resend
        (more often while the stream is new)."""
        wake = asyncio.Event()
        self._streams.add(wake)
        opened = time.monotonic()
        try:
            while True:
                wake.clear()
                yield self.response(pb2)
                young = time.monotonic() - opened < self._first_seconds
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._first_resend_seconds if young
                                               else self._resend_seconds):
                        await wake.wait()
        finally:
            self._streams.discard(wake)

    def response(self, pb2: ModuleType) -> Any:
        now = int(time.time())
        response = pb2.NodeWatchResourcesResponse()
        for state in self._devices():
            response.devices.add(
                device=pb2.DeviceIdentifier(pool_name=state.pool, device_name=state.device),
                health=pb2.HEALTHY if state.healthy else pb2.UNHEALTHY,
                last_updated_time=now, health_check_timeout_seconds=HEALTH_TIMEOUT_SECONDS,
                message=state.message[:MAX_HEALTH_MESSAGE])
        return response


class _HealthService:
    def __init__(self, feed: HealthFeed, pb2: ModuleType) -> None:
        self._feed = feed
        self._pb2 = pb2

    async def NodeWatchResources(self, request: Any,
                                 context: grpc.aio.ServicerContext[Any, Any]
                                 ) -> AsyncIterator[Any]:
        async for response in self._feed.stream(self._pb2):
            yield response


class HealthServiceV1(_HealthService, dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: HealthFeed) -> None:
        super().__init__(feed, dra_health_v1_pb2)


class HealthServiceV1alpha1(_HealthService,
                            dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, feed: HealthFeed) -> None:
        super().__init__(feed, dra_health_v1alpha1_pb2)


class RegistrationService(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(self, *, driver: str, endpoint: Path, health: bool = False,
                 on_status: Callable[[bool], None] = lambda registered: None) -> None:
        self._driver = driver
        self._on_status = on_status
        self._endpoint = endpoint
        self._versions = [*SUPPORTED_VERSIONS, *(HEALTH_VERSIONS if health else ())]
        self.registered = asyncio.Event()
        self.last_error = ""

    async def GetInfo(self, request: pluginregistration_pb2.InfoRequest,
                      context: grpc.aio.ServicerContext[Any, Any]
                      ) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=self._driver, endpoint=str(self._endpoint),
            supported_versions=list(self._versions))

    async def NotifyRegistrationStatus(
            self, request: pluginregistration_pb2.RegistrationStatus,
            context: grpc.aio.ServicerContext[Any, Any],
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", self._driver)
            self.last_error = ""
            self.registered.set()
            self._on_status(True)
        else:
            self.last_error = request.error
            self.registered.clear()
            self._on_status(False)
            log.error("the kubelet refused to register DRA driver %s: %s", self._driver,
                      request.error or "(no reason given)")
        return pluginregistration_pb2.RegistrationStatusResponse()


def _identity(path: Path) -> tuple[int, int] | None:
    """The socket file at `path` (device, inode), or None when there is none."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


class PluginServer:
    """Both sockets; `start()` then `stop()` (or `async with`)."""

    def __init__(self, preparer: Preparer, *, driver: str = names.DRIVER,
                 plugins_dir: Path = DEFAULT_PLUGINS_DIR,
                 registry_dir: Path = DEFAULT_REGISTRY_DIR,
                 health: HealthFeed | None = None,
                 on_registration: Callable[[bool], None] = lambda registered: None,
                 instance: str = "") -> None:
        if instance and not _INSTANCE.fullmatch(instance):
            raise ValueError(f"instance {instance!r} is not a pod UID or another name of at "
                             "most 63 letters, digits and dashes: give --instance $(POD_UID)")
        # Absolute: the kubelet dials the endpoint it is given from its own working directory,
        # and gRPC reads "unix://<relative path>" as a host name and fails to bind.
        self.dra_socket = dra_socket_path(plugins_dir.absolute(), driver, instance)
        self.registration_socket = registration_socket_path(registry_dir.absolute(), driver,
                                                            instance)
        for path in (self.dra_socket, self.registration_socket):
            if len(str(path).encode()) > MAX_UNIX_PATH:
                raise ValueError(f"socket path {path} is longer than {MAX_UNIX_PATH} bytes, the "
                                 "unix socket limit: choose shorter --plugins-dir/--registry-dir")
        self.registration = RegistrationService(driver=driver, endpoint=self.dra_socket,
                                                health=health is not None,
                                                on_status=on_registration)
        self._driver = driver
        self._preparer = preparer
        self._health = health
        self._servers: list[grpc.aio.Server] = []
        self._by_path: dict[Path, grpc.aio.Server] = {}
        self._bound: dict[Path, tuple[int, int] | None] = {}  # the socket files served

    def _remove_stale_sockets(self) -> None:
        """Sockets of earlier instances of this driver that nobody listens on any more (a pod
        killed without its SIGTERM): removed, so the kubelet stops trying to register them.
        A socket that still answers belongs to a live plugin (the old pod of a rolling update)
        and stays."""
        driver = self._driver
        candidates = [*self.registration_socket.parent.glob(f"{driver}-*-reg.sock"),
                      *self.dra_socket.parent.glob("dra-*.sock")]
        for path in candidates:
            if path in (self.registration_socket, self.dra_socket) or not path.is_socket():
                continue
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(path))
            except ConnectionRefusedError:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                log.info("removed stale socket %s (no plugin listens on it)", path)
            except OSError:
                pass
            finally:
                probe.close()

    def _dra_server(self) -> grpc.aio.Server:
        dra = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraServiceV1(self._preparer), dra)
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            DraServiceV1beta1(self._preparer), dra)
        if self._health is not None:
            dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServiceV1(self._health), dra)
            dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
                HealthServiceV1alpha1(self._health), dra)
        return dra

    def _registration_server(self) -> grpc.aio.Server:
        registration = grpc.aio.server()
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration,
                                                                       registration)
        return registration

    async def start(self) -> None:
        self._remove_stale_sockets()
        await self._serve(self._dra_server(), self.dra_socket)
        await self._serve(self._registration_server(), self.registration_socket)

    async def keep_sockets(self, poll_seconds: float = 2.0) -> None:
        """Until cancelled: a socket removed under the plugin (by hand, by a cleanup of the
        kubelet's folders) is served again, so the kubelet registers the plugin again instead
        of losing the driver for good (it deletes the node's slices 30 s after)."""
        while True:
            await asyncio.sleep(poll_seconds)
            for path, make in ((self.dra_socket, self._dra_server),
                               (self.registration_socket, self._registration_server)):
                if self._bound.get(path) == _identity(path):
                    continue
                log.warning("socket %s was removed or replaced under the plugin: serving it "
                            "again", path)
                old = self._by_path.pop(path, None)
                if old is not None:
                    self._servers.remove(old)
                    await old.stop(0)
                await self._serve(make(), path)

    async def _serve(self, server: grpc.aio.Server, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A socket left by a previous run would make the bind fail.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {path}: {exc}; check that the directory is "
                          "writable and no other plugin instance is running") from None
        await server.start()
        self._servers.append(server)
        self._by_path[path] = server
        self._bound[path] = _identity(path)
        log.info("serving %s", path)

    async def stop(self, grace: float = 2.0) -> None:
        # Registration first: the kubelet stops sending work before the DRA socket goes.
        for server in reversed(self._servers):
            await server.stop(grace)
        self._servers.clear()
        self._by_path.clear()
        self._bound.clear()
        for path in (self.registration_socket, self.dra_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    async def __aenter__(self) -> PluginServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
