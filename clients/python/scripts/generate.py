#!/usr/bin/env python3
"""Generates toolgate's Python gRPC stubs from proto/ with grpcio-tools (no protoc needed).

    python clients/python/scripts/generate.py            # rewrite src/toolgate/v1/*_pb2*.py(i)
    python clients/python/scripts/generate.py --check    # exit 1 if they differ from proto/

The stubs are checked in, so `pip install ./clients/python` needs no code generator. CI runs
`--check`: a change to proto/toolgate/v1 fails it until the stubs are regenerated (and the
typed layer in toolgate.models follows them; the tests check the enums against the stubs).
Needs grpcio-tools (pinned in requirements-dev.txt).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = PACKAGE_ROOT.parents[1] / "proto"
PROTO_FILE = "toolgate/v1/toolgate.proto"
# The proto package toolgate.v1 lands inside our import package `toolgate`, so the generated
# `from toolgate.v1 import toolgate_pb2` resolves to these files.
OUT_ROOT = PACKAGE_ROOT / "src"
GENERATED = ("toolgate_pb2.py", "toolgate_pb2.pyi", "toolgate_pb2_grpc.py")


def generate(out_root: Path) -> None:
    from grpc_tools import protoc  # imported here so --help works without grpcio-tools

    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(PROTO_ROOT / PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc failed for {PROTO_ROOT / PROTO_FILE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)

    if not args.check:
        generate(OUT_ROOT)
        print(f"generated {', '.join(GENERATED)} in {OUT_ROOT / 'toolgate' / 'v1'}")
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [
            name
            for name in GENERATED
            if not (OUT_ROOT / "toolgate" / "v1" / name).is_file()
            or not filecmp.cmp(Path(tmp) / "toolgate" / "v1" / name, OUT_ROOT / "toolgate" / "v1" / name, shallow=False)
        ]
    if stale:
        print(
            f"the Python stubs are stale for {PROTO_ROOT / PROTO_FILE}: {', '.join(stale)}; "
            "run `python clients/python/scripts/generate.py` and update toolgate.models to match",
            file=sys.stderr,
        )
        return 1
    print("Python stubs are up to date with proto/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
