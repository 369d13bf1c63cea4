"""Regenerates the Python modules of the hand-written .proto files next to this file.

`python -m dra_gateway.node_plugin.proto.generate` rewrites the committed *_pb2.py,
*_pb2_grpc.py and their .pyi stubs; `--check` only compares and exits 1 when they drifted (the
test suite runs the same comparison). Needs the dev tools grpcio-tools and mypy-protobuf.
Generation happens in a scratch tree laid out as the import path, so the generated imports
read `from dra_gateway.node_plugin.proto import ...` wherever the repository lives.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = ("dra_gateway", "node_plugin", "proto")
PROTOS = ("dra_v1.proto", "dra_v1beta1.proto", "dra_health_v1.proto", "dra_health_v1alpha1.proto",
          "pluginregistration.proto", "podresources_v1.proto")
SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi", "_pb2_grpc.pyi")


def _plugin(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit(f"{name} not found: install the dev extra (mypy-protobuf)")
    return found


def generate() -> dict[str, bytes]:
    """Generated file name to content, for every .proto file here."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "src"
        package = root.joinpath(*PACKAGE)
        package.mkdir(parents=True)
        out = Path(tmp) / "out"
        out.mkdir()
        for proto in PROTOS:
            shutil.copyfile(HERE / proto, package / proto)
        args = [
            "grpc_tools.protoc", f"-I{root}",
            f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
            f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
            f"--python_out={out}", f"--grpc_python_out={out}",
            f"--mypy_out={out}", f"--mypy_grpc_out={out}",
            *(str(package / p) for p in PROTOS),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed (see above)")
        produced = out.joinpath(*PACKAGE)
        return {p.name: p.read_bytes() for p in sorted(produced.iterdir()) if p.is_file()}


def drift(generated: dict[str, bytes]) -> list[str]:
    """Names of committed files that differ from (or are missing in) the generated set."""
    problems = []
    for name, content in generated.items():
        path = HERE / name
        if not path.exists() or path.read_bytes() != content:
            problems.append(name)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on drift")
    args = parser.parse_args(argv)
    generated = generate()
    problems = drift(generated)
    if args.check:
        if problems:
            print("out of date: " + ", ".join(problems), file=sys.stderr)
            return 1
        return 0
    for name in problems:
        (HERE / name).write_bytes(generated[name])
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
