#!/usr/bin/env bash
# Build the cell's base image from Debian packages, without any container registry
# (DESIGN.md §7): debootstrap a minimal bookworm root with python3, trim it, and
# `docker import` it as $CELLBLOCK_BASE_IMAGE.
#
# Skips all work when the image already exists (set CELLBLOCK_REBUILD_BASE=1 to force).
# The debootstrapped root is cached in $CELLBLOCK_ROOTFS and reused when complete.
#
# Environment:
#   CELLBLOCK_BASE_IMAGE   image to create           (default cellblock-base:bookworm)
#   CELLBLOCK_ROOTFS       rootfs cache directory    (default /var/cache/cellblock/rootfs)
#   DEBIAN_MIRROR          Debian mirror             (default http://deb.debian.org/debian)
#   CELLBLOCK_REBUILD_BASE 1 = re-import even when the image exists
#                          (add CELLBLOCK_REBUILD_ROOTFS=1 to re-debootstrap as well)
# Needs root (debootstrap) and a running Docker engine (see scripts/ensure-docker.sh).
set -euo pipefail

image="${CELLBLOCK_BASE_IMAGE:-cellblock-base:bookworm}"
rootfs="${CELLBLOCK_ROOTFS:-/var/cache/cellblock/rootfs}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suite=bookworm

say() { printf 'bootstrap-base: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker engine answers; run scripts/ensure-docker.sh (make engine) first"

if [ "${CELLBLOCK_REBUILD_BASE:-0}" != 1 ] && docker image inspect "$image" >/dev/null 2>&1; then
    say "$image already exists; nothing to do"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || die "debootstrap needs root; rerun as root"

# A rootfs counts as complete when python3 is there and debootstrap's own work
# directory (removed at the very end of a successful run) is gone.
rootfs_complete() { [ -x "$1/usr/bin/python3" ] && [ ! -e "$1/debootstrap" ]; }

# Unmount anything a failed debootstrap left mounted (proc, sys, ...) below $1,
# deepest first, so that removing the directory cannot reach the host.
unmount_below() {
    local dir mounts
    dir="$(realpath -m "$1")"
    mounts="$(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)"
    [ -z "$mounts" ] || printf '%s\n' "$mounts" | xargs -r -n1 umount -l
}

# One build of this rootfs at a time: two at once (two checkouts' `make image`) delete each other's
# downloads. The lock is released when this script exits.
mkdir -p "$(dirname "$rootfs")"
exec 9>"$rootfs.lock"
flock 9

if [ "${CELLBLOCK_REBUILD_ROOTFS:-0}" = 1 ] || ! rootfs_complete "$rootfs"; then
    if ! command -v debootstrap >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 || die "debootstrap is not installed and apt-get is not available"
        say "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
    fi
    partial="$rootfs.partial"
    mkdir -p "$(dirname "$rootfs")"
    unmount_below "$partial"
    rm -rf --one-file-system "$partial"
    # A mirror's failed downloads can leave a run that no retry inside debootstrap recovers
    # ("file already exists" on extraction): start over from an empty directory, three times at most.
    for attempt in 1 2 3; do
        say "debootstrap $suite (minbase + python3) from $mirror into $partial (about a minute; attempt $attempt of 3)"
        debootstrap --variant=minbase --include=python3 "$suite" "$partial" "$mirror" && break
        unmount_below "$partial"
        [ "$attempt" -lt 3 ] || die "debootstrap failed 3 times (see $partial/debootstrap/debootstrap.log)"
        say "debootstrap failed; last lines of its log:"
        tail -n 5 "$partial/debootstrap/debootstrap.log" >&2 || true
        rm -rf --one-file-system "$partial"
        sleep 5
    done
    unmount_below "$partial"
    rootfs_complete "$partial" || die "debootstrap finished but $partial has no python3"
    unmount_below "$rootfs"
    rm -rf --one-file-system "$rootfs"
    mv "$partial" "$rootfs"
else
    say "reusing the complete rootfs in $rootfs"
fi

# Trim what a cell never needs. Idempotent, so it is safe on a reused rootfs.
# Keep the copyright files: they are the licences of what the image ships.
say "trimming apt caches, docs, man pages and translations"
(
    cd "$rootfs"
    rm -rf var/cache/apt/archives/*.deb var/cache/apt/archives/partial/* var/cache/apt/*.bin \
        var/lib/apt/lists/* usr/share/man/* usr/share/info/* usr/share/locale/* \
        usr/share/lintian usr/share/linda var/cache/debconf/*-old var/lib/dpkg/*-old \
        var/log/* tmp/* run/* root/.bash_history
    if [ -d usr/share/doc ]; then
        find usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
        find usr/share/doc -mindepth 1 -type d -empty -delete
    fi
)

say "importing $rootfs as $image"
tar -C "$rootfs" --numeric-owner --one-file-system \
    --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' \
    -cf - . \
  | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["/usr/bin/python3"]' \
      --change "LABEL io.cellblock.base=debootstrap-$suite-minbase-python3" \
      --message "debootstrap --variant=minbase --include=python3 $suite $mirror" \
      - "$image" >/dev/null
say "built $image ($(docker image inspect --format '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
