"""A client of the kubelet's pod-resources API (`v1.PodResourcesLister`), over its unix socket.

It asks two questions, `GetAllocatableResources` (every device the kubelet's device manager
knows, per resource name: what device plugins offer) and `List` (what each running container
holds), and returns the answers as plain data (`legacy.KubeletView`). It decides nothing and
never raises anything but `PodResourcesError`, whose message names the socket and what to check,
so the caller can fall back safely. It only reads: `Get` is not used (a kubelet feature gate).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import grpc.aio

from dra_gateway.node_plugin.legacy import Holder, KubeletView
from dra_gateway.node_plugin.proto import podresources_v1_pb2, podresources_v1_pb2_grpc

if TYPE_CHECKING:  # a typing-only class of the generated stubs
    from dra_gateway.node_plugin.proto.podresources_v1_pb2_grpc import (
        PodResourcesListerAsyncStub,
    )

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# The kubelet's own server caps messages at 16 MiB; a node with many pods can exceed grpc's
# default 4 MiB receive limit.
MAX_MESSAGE_BYTES = 16 << 20


class PodResourcesError(Exception):
    """The pod-resources API could not be read; the message says where and what to check."""


class PodResourcesClient:
    """One channel to the kubelet's socket, reused across polls (grpc reconnects by itself
    when the kubelet restarts and replaces the socket)."""

    def __init__(self, socket: Path = DEFAULT_POD_RESOURCES_SOCKET, *,
                 timeout_seconds: float = 5.0) -> None:
        self.socket = socket
        self._timeout = timeout_seconds
        self._channel: grpc.aio.Channel | None = None
        self._stub: PodResourcesListerAsyncStub | None = None

    def _connect(self) -> PodResourcesListerAsyncStub:
        # Checked before each call: grpc alone would report a missing socket as an opaque
        # "failed to connect to all addresses".
        if not self.socket.exists():
            raise PodResourcesError(
                f"the kubelet's pod-resources socket {self.socket} does not exist: mount the "
                f"kubelet's pod-resources directory ({self.socket.parent}) into the plugin, or "
                "set --pod-resources-socket to where the kubelet serves it")
        # No access() check: the directory is mounted read-only, where access(W_OK) says no
        # though connecting works; a refused connection is reported by the call below.
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket.absolute()}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
            self._stub = podresources_v1_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    async def read(self) -> KubeletView:
        """Allocatable devices and the devices running containers hold, per resource name."""
        stub = self._connect()
        try:
            allocatable = await stub.GetAllocatableResources(
                podresources_v1_pb2.AllocatableResourcesRequest(), timeout=self._timeout)
            listed = await stub.List(podresources_v1_pb2.ListPodResourcesRequest(),
                                     timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            # A channel stuck on a replaced socket is rebuilt on the next call.
            await self.close()
            hint = ("; the plugin must run as root (the kubelet owns the socket)"
                    if exc.code() == grpc.StatusCode.UNAVAILABLE
                    and "ermission denied" in (exc.details() or "") else "")
            raise PodResourcesError(
                f"the kubelet's pod-resources API at {self.socket} failed: "
                f"{exc.code().name}: {exc.details()}{hint}") from None
        by_name: dict[str, list[str]] = {}
        for devices in allocatable.devices:
            by_name.setdefault(devices.resource_name, []).extend(devices.device_ids)
        holders = [
            Holder(namespace=pod.namespace, pod=pod.name, container=container.name,
                   resource=devices.resource_name, device_ids=tuple(devices.device_ids))
            for pod in listed.pod_resources
            for container in pod.containers
            for devices in container.devices]
        return KubeletView(allocatable={n: tuple(ids) for n, ids in sorted(by_name.items())},
                           holders=tuple(holders))

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close(None)
