"""Helpers every test folder shares: where the repository's examples are, and polling.

Imported as a top-level module (`from testkit import eventually`), as `gotools` is: pytest puts
this folder on the import path. Test modules never import each other; what two of them need
lives here or in their folder's conftest.py.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
EXAMPLES = REPOSITORY / "examples"


async def eventually(check: Callable[[], Any], *, within: float = 10.0,
                     interval: float = 0.01) -> Any:
    """The first truthy result of `check` (sync or async), polled every `interval` seconds.

    For state spread over several tasks that has no single event to wait on; fails the test
    with TimeoutError after `within` seconds.
    """
    async with asyncio.timeout(within):
        while True:
            result = check()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            await asyncio.sleep(interval)
