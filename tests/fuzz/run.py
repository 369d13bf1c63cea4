"""One fuzz target under atheris, libFuzzer's engine for Python: coverage-guided campaigns and
corpus merges.

    python -m fuzz.run TARGET [libFuzzer flags] [CORPUS_FOLDER...]

with tests/ on the import path; `hack/fuzz.sh` runs a campaign and merges its finds into the
committed corpus. The project's modules (`dra_gateway`, less the simulator that plays the
cluster) are instrumented as they are imported, so that coverage guides the fuzzer through the
webhook, the translator, the policies and the core rather than through aiohttp or pydantic.
Everything the target needs is imported and started inside the instrumentation, and the seeds
are run once there, so that modules imported lazily on first use are instrumented too. Inputs
are changed as JSON or YAML trees (`mutators.py`) as well as bytes.

libFuzzer's -merge=1 starts itself again as a child with argv[0] and the same flags, which a
Python module cannot be: `hack/fuzz.sh` names an executable wrapper running this module for the
target in FUZZ_RUNNER, and the engine is handed that as argv[0].

This is the only module that imports atheris.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import atheris  # type: ignore[import-untyped]

INSTRUMENTED = ["dra_gateway"]
# The in-memory API server plays the cluster; its branches are not the gateway's. atheris
# excludes modules by their exact names.
_SIMULATOR = Path(__file__).resolve().parents[2] / "src" / "dra_gateway" / "devkit" / "sim"
NOT_INSTRUMENTED = ["dra_gateway.devkit.sim", *(
    "dra_gateway.devkit.sim." + ".".join(path.relative_to(_SIMULATOR).with_suffix("").parts)
    for path in sorted(_SIMULATOR.rglob("*.py")) if path.name != "__init__.py")]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit(f"usage: {sys.argv[0]} TARGET [libFuzzer flags] [CORPUS_FOLDER...]")
    name = sys.argv[1]
    with atheris.instrument_imports(include=INSTRUMENTED, exclude=NOT_INSTRUMENTED):
        from fuzz import mutators, seeds, targets

        target, _ = targets.make(name)
        webhook = None if name == "rules" else targets.Webhook()
        try:
            for data in seeds.seeds(name, webhook).values():
                target(data)
        finally:
            if webhook is not None:
                webhook.close()
    # The target's app stays open until the process ends: libFuzzer exits without returning.
    kind = "yaml" if name == "rules" else "json"

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        return mutators.mutate(kind, data, max_size, seed, atheris.Mutate)

    atheris.Setup([os.environ.get("FUZZ_RUNNER") or sys.argv[0], *sys.argv[2:]], target,
                  custom_mutator=mutate)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
