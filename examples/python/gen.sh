#!/usr/bin/env bash
# Generates the Python gRPC stubs for toolgate.v1 from proto/ with grpcio-tools.
#
#   examples/python/gen.sh [OUT_DIR]        # default: examples/python/gen (git-ignored)
#
# Writes OUT_DIR/toolgate/v1/toolgate_pb2.py, toolgate_pb2.pyi and toolgate_pb2_grpc.py; put OUT_DIR
# on sys.path (agent_loop.py takes it as --stubs) and `from toolgate.v1 import toolgate_pb2`.
# Needs `pip install grpcio-tools` (pinned in tests/python/requirements.txt); set PYTHON to choose
# the interpreter (default python3).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROTO_ROOT="$HERE/../../proto"
OUT="${1:-$HERE/gen}"

mkdir -p "$OUT"
"${PYTHON:-python3}" -m grpc_tools.protoc \
  --proto_path="$PROTO_ROOT" \
  --python_out="$OUT" \
  --pyi_out="$OUT" \
  --grpc_python_out="$OUT" \
  "$PROTO_ROOT/toolgate/v1/toolgate.proto"
echo "generated toolgate.v1 stubs in $OUT"
