"""Constants and the error type shared by the demo's modules: where the bundled examples are,
the simulated nodes, the gateway's namespace, timings.

It must hold no behaviour and import no component: every other demo module imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dra_gateway.kube import names

if TYPE_CHECKING:
    pass


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_DIR = EXAMPLES / "demo"
DEFAULT_PODS = tuple(sorted((EXAMPLES / "pods").glob("*.yaml")))
# The quota shown at work with the bundled examples, and the two pods it cannot hold together.
QUOTA_POLICIES = DEMO_DIR / "quota.yaml"
QUOTA_PODS = DEMO_DIR / "quota-pods.yaml"
# The simulated GPU nodes: node name -> inventory (the seed holds their Node objects).
NODES: tuple[tuple[str, str], ...] = (
    ("gpu-a100-1", "gpu-a100-1.yaml"),
    ("gpu-h100-1", "gpu-h100-1.yaml"),
)
NAMESPACE = names.GATEWAY_NAMESPACE
WEBHOOK_SERVICE = "dra-gateway-webhook"
GRACE_S = 5.0
# What the demo's output fits when no terminal says its width; below MIN_TEXT_WIDTH columns
# a table of pods is no longer readable, so lines run past a narrower one.
TEXT_WIDTH = 120
MIN_TEXT_WIDTH = 60
LOG_TAIL_LINES = 25
_POLL_S = 0.2


def text_width() -> int:
    """The terminal's width ($COLUMNS first, as shutil reads it), at least MIN_TEXT_WIDTH."""
    import shutil

    return max(MIN_TEXT_WIDTH, shutil.get_terminal_size((TEXT_WIDTH, 24)).columns)


class DemoError(Exception):
    """A step of the demo failed; `log` is the log file of the process at fault, if any."""

    def __init__(self, step: str, message: str, *, log: Path | None = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message
        self.log = log
