#!/usr/bin/env bash
# Build the cell image (make image).
#
#  1. Assemble the build context build/sandbox-context/:
#       lib/  pip install --target of requirements.txt for the image's CPython 3.11
#             (skipped while requirements.txt and the pip flags are unchanged: stamp file)
#       app/  cellblock/guest/ + the generated bridge stubs cellblock/bridge/v1/*_pb2*.py
#       Dockerfile
#  2. Hash the context together with the base image id; that hash is the image build id
#     (label io.cellblock.image-build, tag $CELLBLOCK_IMAGE_REPO:<hash12>).
#  3. docker build, unless an image with that hash already exists; tag it :dev either way.
#  4. After a real build, smoke-test the image under the locked-down flags and seccomp profile.
#
# Environment:
#   CELLBLOCK_IMAGE_REPO  image repository           (default cellblock-cell; the service's CELLBLOCK_IMAGE is a full reference)
#   CELLBLOCK_BASE_IMAGE  base image (BASE_IMAGE arg) (default cellblock-base:bookworm;
#                         a missing cellblock-base:* is bootstrapped from Debian packages)
#   PYTHON                host python used for pip    (default python3)
#   CELLBLOCK_SKIP_SMOKE  1 = skip the smoke test
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
ctx="$root/build/sandbox-context"
image="${CELLBLOCK_IMAGE_REPO:-cellblock-cell}"
base_image="${CELLBLOCK_BASE_IMAGE:-cellblock-base:bookworm}"
python="${PYTHON:-python3}"

say() { printf 'build-image: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
# shellcheck source=../scripts/lib.sh
. "$root/scripts/lib.sh"

docker info >/dev/null 2>&1 || die "no Docker engine answers; run scripts/ensure-docker.sh (make engine) first"
umask 022
mkdir -p "$ctx"

# ---------------------------------------------------------------- wheels (lib/)
cp311_wheel_args
arch="$(uname -m)"
pip_args=(install --quiet --disable-pip-version-check --no-compile --no-deps "${wheel_args[@]}"
          -r "$here/requirements.txt")
stamp="$( { cat "$here/requirements.txt"; printf '%s\n' "${pip_args[@]}"; } | sha256sum | cut -c1-64)"
if [ -f "$ctx/lib/.stamp" ] && [ "$(cat "$ctx/lib/.stamp")" = "$stamp" ]; then
    say "wheels unchanged; skipping pip"
else
    say "installing guest wheels for CPython 3.11 / $arch into $ctx/lib"
    rm -rf "$ctx/lib.new"
    "$python" -m pip "${pip_args[@]}" --target "$ctx/lib.new" || die "pip install of the guest wheels failed"
    rm -rf "$ctx/lib.new/bin"          # console scripts: nothing in a cell runs them
    find "$ctx/lib.new" -name __pycache__ -type d -prune -exec rm -rf {} +
    printf '%s\n' "$stamp" > "$ctx/lib.new/.stamp"
    rm -rf "$ctx/lib"
    mv "$ctx/lib.new" "$ctx/lib"
fi

# ---------------------------------------------------------------- guest code (app/)
# Rebuilt from scratch every time (it is small), so deleted files do not linger.
rm -rf "$ctx/app"
mkdir -p "$ctx/app/cellblock"
guest_src="$root/sandbox-image/guest/cellblock/guest"
if [ -n "$(find "$guest_src" -name '*.py' -print -quit 2>/dev/null)" ]; then
    cp -R "$guest_src" "$ctx/app/cellblock/guest"
else
    say "WARNING: no guest package in $guest_src yet; the image's entrypoint (python3 -m cellblock.guest) will not start"
fi
copy_stubs() {  # copy_stubs <proto dir relative to proto/>
    local src="$root/proto/$1" f copied=0
    for f in "$src"/*_pb2*.py; do
        [ -e "$f" ] || continue
        mkdir -p "$ctx/app/$1"
        cp "$f" "$ctx/app/$1/"
        copied=1
    done
    [ "$copied" = 1 ]
}
if copy_stubs cellblock/bridge/v1; then
    # The bridge stubs may import public messages; ship those stubs too when they do.
    if grep -qE '^from cellblock\.v1 import|^import cellblock\.v1' "$ctx/app/cellblock/bridge/v1/"*.py; then
        copy_stubs cellblock/v1 || die "bridge stubs import cellblock.v1 but proto/cellblock/v1 has no generated stubs (make proto)"
    fi
else
    say "WARNING: no generated bridge stubs in proto/cellblock/bridge/v1 yet (make proto)"
fi
find "$ctx/app" \( -name __pycache__ -o -name '*.pyc' \) -prune -exec rm -rf {} +
cp "$here/Dockerfile" "$ctx/Dockerfile"
chmod -R a+rX,go-w "$ctx"

# ---------------------------------------------------------------- base image
if ! docker image inspect "$base_image" >/dev/null 2>&1; then
    if [[ "$base_image" == cellblock-base:* ]]; then
        CELLBLOCK_BASE_IMAGE="$base_image" "$here/bootstrap-base.sh"
    else
        die "base image $base_image is not available (pull it, or unset CELLBLOCK_BASE_IMAGE)"
    fi
fi
base_id="$(docker image inspect --format '{{.Id}}' "$base_image")"

# ---------------------------------------------------------------- content hash
# Paths and contents of every context file (mtimes do not count) plus the base image id.
hash="$(
    cd "$ctx"
    {
        printf 'base %s %s\n' "$base_image" "$base_id"
        find . -type f ! -path ./lib/.stamp -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-64
)"
tag="$image:${hash:0:12}"

if docker image inspect "$tag" >/dev/null 2>&1; then
    say "$tag is up to date (context unchanged)"
    docker tag "$tag" "$image:dev"
else
    say "docker build $image:dev ($tag) on $base_image"
    start=$SECONDS
    docker build --quiet \
        --build-arg "BASE_IMAGE=$base_image" \
        --build-arg "CONTEXT_HASH=$hash" \
        -t "$image:dev" -t "$tag" "$ctx" >/dev/null \
        || die "docker build failed (rerun without --quiet for the log: docker build $ctx)"
    say "built in $((SECONDS - start))s"
    if [ "${CELLBLOCK_SKIP_SMOKE:-0}" != 1 ]; then
        say "smoke test: locked-down container loads the precompiled QuickJS module, imports grpc and protobuf and evaluates JS"
        docker run --rm --read-only --network none --cap-drop ALL \
            --security-opt no-new-privileges --security-opt "seccomp=$here/seccomp.json" \
            --user 65532:65532 --pids-limit 64 --memory 256m --memory-swap 256m \
            --entrypoint python3 "$tag" -S -P -c '
import grpc, google.protobuf, quickjs_rs
from cellblock.guest._engine_load import preload_engine
assert preload_engine(), "the precompiled QuickJS module was not loaded"
with quickjs_rs.Runtime() as rt, rt.new_context() as ctx:
    assert ctx.eval("[1, 2, 3].map(x => x * 2).join()") == "2,4,6"
import pkgutil, importlib, cellblock
for m in pkgutil.walk_packages(cellblock.__path__, "cellblock."):
    if m.name.startswith("cellblock.bridge.") or m.name == "cellblock.guest":
        importlib.import_module(m.name)
from importlib.metadata import version
print("smoke test ok:", ", ".join(f"{d} {version(d)}" for d in ("quickjs-rs", "wasmtime", "grpcio", "protobuf")))
' || die "smoke test failed: the image does not work under the locked-down flags"
    fi
fi
size="$(docker image inspect --format '{{.Size}}' "$tag" | awk '{ printf "%.0f MB", $1 / 1e6 }')"
say "$image:dev = $tag ($size), io.cellblock.image-build=$hash"
