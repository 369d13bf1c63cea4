"""What a simulated GPU node has on disk beside its inventory, for the demo and the test tiers.

A node plugin run with `--inventory` publishes GPUs that are not there; the node's HAMi-core
library is simulated the same way: a file where the library would be installed, so that the
plugin publishes `hamiCore=true` and the runtime (on the real-node tier) has something to
bind-mount. Nothing loads it: there is no CUDA behind an inventory's cards.
"""

from __future__ import annotations

from pathlib import Path

HAMI_LIBRARY_NAME = "libvgpu.so"


def install_hami_core(folder: Path) -> Path:
    """Put a stand-in for HAMi-core's library in `folder` (made if needed); its path, for the
    node plugin's --hami-library."""
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / HAMI_LIBRARY_NAME
    library.write_bytes(b"\x7fELF stand-in for HAMi-core's libvgpu.so on a simulated node\n")
    return library
