#!/usr/bin/env bash
# Builds the Go client's conformance CLI offline against Debian's packaged Go sources
# (golang-google-grpc-dev, golang-google-protobuf-dev, ... in /usr/share/gocode/src).
#
#   clients/go/build.sh [OUTPUT]      (default OUTPUT: clients/go/bin/cellblock-conformance)
#   clients/go/build.sh --test        run the client package's tests instead (go test)
#
# GOPATH mode (GO111MODULE=off): Debian's grpc (1.33) declares module requirements that
# Debian does not package (envoyproxy, cncf/udpa, ...), so module mode cannot resolve a
# build list without a module proxy; GOPATH mode compiles exactly the imported packages.
# The client's import path is cellblock/clients/go/..., linked into a throw-away GOPATH.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
test_only=""
if [ "${1:-}" = "--test" ]; then test_only=1; shift; fi
out="${1:-$here/bin/cellblock-conformance}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
command -v go >/dev/null 2>&1 || { echo "build.sh: go not found; run \`make client-deps\`" >&2; exit 1; }
[ -d /usr/share/gocode/src/google.golang.org/grpc ] \
  || { echo "build.sh: /usr/share/gocode/src/google.golang.org/grpc missing; run \`make client-deps\`" >&2; exit 1; }
gopath="$(mktemp -d)"
trap 'rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src/cellblock/clients"
ln -s "$here" "$gopath/src/cellblock/clients/go"
mkdir -p "$(dirname "$out")"
cd "$gopath/src/cellblock/clients/go"
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS= GOPROXY=off \
  GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/go-build}"
if [ -n "$test_only" ]; then go test -count=1 ./cellblock/; exit; fi
go build -o "$out" ./cmd/cellblock-conformance
