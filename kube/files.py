"""Files that readers in other processes must see whole: written to a temporary file, synced,
renamed over the target, and the directory synced.

One implementation for everything the gateway writes for someone else to read (certificates
for the webhook's reloader, CDI specs for the container runtime, the node plugin's checkpoint,
the kubeconfig of the embedded cluster). It must not know what the bytes mean.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with `data`: a reader sees the old file or the new one, never a torn one.

    The temporary file gets `mode` before any byte is written, so a private key or a token is
    never readable by others, not even for an instant, and a file that existed with a wider
    mode does not keep it (an `open(..., O_TRUNC)` would).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable: it is only once the entry is on disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
