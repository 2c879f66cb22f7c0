#!/usr/bin/env bash
# Regenerates the Python code of proto/ in place (proto path == import path,
# so `from cellblock.v1 import code_mode_service_pb2` works untouched).
set -euo pipefail
cd "$(dirname "$0")/../proto"
files=$(find cellblock -name '*.proto' | LC_ALL=C sort)
find cellblock -name '*_pb2*.py' -o -name '*_pb2*.pyi' | xargs -r rm -f
python -m grpc_tools.protoc -I . \
  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $files
