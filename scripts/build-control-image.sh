#!/usr/bin/env bash
# Build the control-service image (make control-image), like sandbox-image/build.sh builds the cell image:
#  1. app/: the cellblock packages of this checkout (proto/, server/, client/ merged: one PEP 420 tree);
#  2. lib/: pip install --target of pyproject.toml's dependencies and [server] extra, for the base
#     image's CPython 3.11 (binary wheels only, so no compiler is needed);
#  3. hash the context with the base image id, docker build unless that hash exists, tag :dev.
# Load it into a local cluster with `kind load docker-image cellblock-control:dev` (k8s/README.md).
#
# Environment:
#   CELLBLOCK_CONTROL_IMAGE_REPO  image repository (default cellblock-control)
#   CELLBLOCK_BASE_IMAGE          base image       (default cellblock-base:bookworm)
#   PYTHON                        host python used for pip (default python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ctx="$root/build/control-context"
image="${CELLBLOCK_CONTROL_IMAGE_REPO:-cellblock-control}"
base_image="${CELLBLOCK_BASE_IMAGE:-cellblock-base:bookworm}"
python="${PYTHON:-python3}"

say() { printf 'build-control-image: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
# shellcheck source=lib.sh
. "$root/scripts/lib.sh"

docker info >/dev/null 2>&1 || die "no Docker engine answers; run make engine first"
docker image inspect "$base_image" >/dev/null 2>&1 || CELLBLOCK_BASE_IMAGE="$base_image" "$root/sandbox-image/bootstrap-base.sh"
cp311_wheel_args
arch="$(uname -m)"
umask 022
rm -rf "$ctx" && mkdir -p "$ctx/app"
for part in proto server client; do cp -R "$root/$part/cellblock" "$ctx/app/"; done
# The cell profile the replica annotates its pods with (the nodes hold the same file, k8s/base/seccomp).
cp "$root/sandbox-image/seccomp.json" "$ctx/app/cellblock-cell-seccomp.json"
find "$ctx/app" \( -name __pycache__ -o -name '*.pyc' -o -name '*.pyi' \) -prune -exec rm -rf {} +
"$python" - "$root/pyproject.toml" > "$ctx/requirements.txt" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["server"]))
PY
say "installing the server's pinned dependencies for CPython 3.11 / $arch"
"$python" -m pip install --quiet --disable-pip-version-check --no-compile "${wheel_args[@]}" --target "$ctx/lib" -r "$ctx/requirements.txt" || die "pip install of the server wheels failed"
rm -rf "$ctx/lib/bin"
find "$ctx/lib" -name __pycache__ -type d -prune -exec rm -rf {} +
cp "$root/k8s/control-image/Dockerfile" "$ctx/Dockerfile"
chmod -R a+rX,go-w "$ctx"

base_id="$(docker image inspect --format '{{.Id}}' "$base_image")"
hash="$( cd "$ctx" && { printf 'base %s\n' "$base_id"; find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-64 )"
tag="$image:${hash:0:12}"
if docker image inspect "$tag" >/dev/null 2>&1; then
    say "$tag is up to date"
else
    say "docker build $image:dev ($tag)"
    docker build --quiet --build-arg "BASE_IMAGE=$base_image" --build-arg "CONTEXT_HASH=$hash" -t "$tag" "$ctx" >/dev/null \
        || die "docker build failed (rerun: docker build $ctx)"
fi
docker tag "$tag" "$image:dev"
say "smoke test: the service imports under the image's read-only, non-root settings"
docker run --rm --read-only --network none --cap-drop ALL --security-opt no-new-privileges --user 65532:65532 \
    --entrypoint python3 "$image:dev" -s -P -c 'import cellblock.server.app, cellblock.server.cells, kubernetes_asyncio; print("ok")' \
    || die "smoke test failed"
say "$image:dev = $tag"
