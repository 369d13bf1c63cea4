"""What the node plugin found on its node, said on its Node: the condition `DraGatewayNodeSetup`
(`kube/node_setup.py` holds the format), read by `dra-gateway preflight`.

Only what the plugin sees from its pod: whether the CDI folder takes a file (a probe file is
created and removed; a dot name with no `.json` or `.yaml` suffix, which no runtime reads as a
spec) and whether HAMi-core's library is where the chart mounts it from. Writing fails softly:
logged, and tried again by the caller; the plugin serves claims either way.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.kube.node_setup import HamiCore, NodeSetup
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.health import patch_node_condition

PROBE_PREFIX = ".dra-gateway-probe-"


def cdi_dir_writable(cdi_dir: Path) -> tuple[bool, str]:
    """Whether a file can be created in `cdi_dir`, made if missing as the spec writer makes it
    (and why not)."""
    try:
        cdi_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=PROBE_PREFIX, suffix=".probe", dir=cdi_dir)
    except OSError as exc:
        return False, exc.strerror or type(exc).__name__
    os.close(handle)
    Path(name).unlink(missing_ok=True)
    return True, ""


def find_setup(cdi_dir: Path, enforcement: cdi.EnforcementSettings) -> NodeSetup:
    """What this node has, looked at now."""
    writable, why = cdi_dir_writable(cdi_dir)
    hami: HamiCore = "from images"
    if enforcement.mount_hami_library:
        hami = "present" if cdi.hami_library_present(enforcement.hami_library) else "missing"
    return NodeSetup(cdi_dir=str(cdi_dir), cdi_writable=writable, cdi_problem=why,
                     hami_library=enforcement.hami_library, hami_core=hami)


async def report_setup(cluster: Cluster, node_name: str, setup: NodeSetup) -> bool:
    """Patch the Node's condition; False when it was not written (logged, never raised)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return await patch_node_condition(cluster, node_name, setup.condition(now))
