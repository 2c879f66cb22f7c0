#!/usr/bin/env bash
# Regenerates every client's code from proto/ (`make proto`; `make proto-check` and
# tests/unit/proto/test_generated_code.py fail when the checked-in output differs):
#   Python      proto/cellblock/**/*_pb2*.py[i]   grpc_tools.protoc (proto path == import path,
#               so `from cellblock.v1 import code_mode_service_pb2` works untouched)
#   TypeScript  clients/typescript/src/gen        buf generate + protoc-gen-es v2 (npm, pinned)
#   Go          clients/go/gen/cellblockv1        Debian's protoc + protoc-gen-go + protoc-gen-go-grpc
# Only the public API (cellblock/v1) is generated for TypeScript and Go; the cell bridge
# (cellblock/bridge/v1) is internal to the service.
#
#   scripts/gen-proto.sh              write in place
#   scripts/gen-proto.sh --out DIR    write the same paths under DIR instead (the checkout is untouched)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root"
if [ "${1:-}" = "--out" ]; then
  [ -n "${2:-}" ] || { echo "usage: gen-proto.sh [--out DIR]" >&2; exit 2; }
  mkdir -p "$2" && dest="$(cd "$2" && pwd)"
fi
python="$(command -v "${PYTHON:-python}")" || { echo "gen-proto.sh: no interpreter ${PYTHON:-python}" >&2; exit 1; }
# Absolute, since the script changes directory (the Makefile's default is the relative .venv/bin/python);
# the file itself is not resolved, so a virtualenv's symlinked interpreter keeps its site-packages.
python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")"
# protoc-gen-mypy and protoc-gen-mypy_grpc live next to the interpreter (a virtualenv's bin/).
PATH="$(dirname "$python"):$PATH"

cd "$root/proto"
files=$(find cellblock -name '*.proto' | LC_ALL=C sort)
mkdir -p "$dest/proto"
(cd "$dest/proto" && find . -path './cellblock/*' \( -name '*_pb2*.py' -o -name '*_pb2*.pyi' \) -print0 | xargs -0r rm -f)
"$python" -m grpc_tools.protoc -I . \
  --python_out="$dest/proto" --grpc_python_out="$dest/proto" --mypy_out="$dest/proto" --mypy_grpc_out="$dest/proto" $files

# TypeScript: buf.gen.yaml in clients/typescript (clean: true replaces src/gen).
[ -x "$root/clients/typescript/node_modules/.bin/protoc-gen-es" ] \
  || { echo "gen-proto: run \`make client-deps\` (npm ci in clients/typescript) first" >&2; exit 1; }
(cd "$root/clients/typescript" && node_modules/.bin/buf generate -o "$dest/clients/typescript")

# Go: the import path is given with M flags, so the protos stay free of go_package options.
for tool in protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null 2>&1 || { echo "gen-proto: $tool not found; run \`make client-deps\`" >&2; exit 1; }
done
go_pkg=cellblock/clients/go/gen/cellblockv1
api_files=$(find cellblock/v1 -name '*.proto' | LC_ALL=C sort)
mflags=()
for f in $api_files; do mflags+=("--go_opt=M$f=$go_pkg" "--go-grpc_opt=M$f=$go_pkg"); done
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
protoc -I . -I /usr/include --go_out="$out" --go-grpc_out="$out" "${mflags[@]}" $api_files
rm -rf "$dest/clients/go/gen/cellblockv1"
mkdir -p "$dest/clients/go/gen"
mv "$out/$go_pkg" "$dest/clients/go/gen/cellblockv1"
