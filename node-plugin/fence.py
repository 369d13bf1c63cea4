"""The one writer of a node's plugin state: an exclusive `flock` on a file in the state
directory, held by the instance that publishes.

During a rolling update (the chart's DaemonSet uses maxSurge 1) two plugin pods run on one node
for a while. Both would otherwise publish the node's ResourceSlices, write its Node conditions
and rewrite the one checkpoint file, each from its own memory: the old pod undoes the new one's
slices, and each drops the other's prepared claims from the checkpoint. Only the instance that
holds the fence writes any of it; the other serves its sockets (so the kubelet can register it
and the rolling update goes on), answers nothing it would have to write for, and waits.

Why a lock and not the kubelet's registration: the kubelet tells a plugin that it registered it
(NotifyRegistrationStatus) but never that a newer instance superseded it, so the old pod of a
rolling update still believes it is registered while the kubelet already sends its calls to the
new one; registration alone would let both publish. The kernel releases a `flock` when its
holder's process ends, however it ends (SIGTERM, SIGKILL, an OOM kill), so a lock is never left
behind, and there is no lease to expire or clock to trust. The state directory is a hostPath,
so every instance on the node sees the same file; a node reboot starts with no lock held.

The hand-over: the new pod registers, is ready once registered while it waits for the fence
(`NodePlugin.readiness`), the DaemonSet then stops the old pod, whose lock goes with it, and
the new pod takes the fence, reads the checkpoint and the health marks the old one left, and
publishes. Nothing here knows what is written under the fence.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FENCE_FILE = "publisher.lock"


class StateFence:
    """An exclusive, non-blocking `flock` on `path`; `acquire()` waits for it."""

    def __init__(self, path: Path, *, holder: str = "") -> None:
        self.path = path
        self._holder = holder or f"pid {os.getpid()}"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the fence if nobody holds it; True when this instance holds it now."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        # Who holds it, for a person reading the file; the lock, not the text, is the fence.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self._holder}\n".encode(), 0)
        self._fd = fd
        return True

    def holder(self) -> str:
        """What the file says of its holder ("" when unreadable)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    async def acquire(self, poll_seconds: float = 0.5) -> None:
        """Wait until this instance holds the fence (cancellable: it polls rather than block a
        thread the event loop could not stop)."""
        if self.try_acquire():
            return
        log.info("another node plugin instance (%s) holds %s: serving the sockets but writing "
                 "no slice, condition or checkpoint until it stops", self.holder() or "unknown",
                 self.path)
        # A lock held by another process wakes nothing here: polling is the only way.
        while not self.try_acquire():  # noqa: ASYNC110
            await asyncio.sleep(poll_seconds)
        log.info("took over %s: this instance now publishes", self.path)

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
