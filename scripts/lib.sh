# Shell helpers shared by the setup and image scripts (sourced; they define say/die first).

# Sets the array as_root to what runs a command as root (empty when already root, else sudo -n),
# or dies with "$1" as the reason root is needed.
need_root() {
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        die "$1 and this user ($(id -un)) is not root (and has no password-less sudo)"
    fi
}

# apt_install PACKAGE: installs one Debian package (after apt-get update) with as_root, or dies.
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "$1 is not installed and apt-get is not available"
    say "installing $1 from Debian packages"
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get update -q || die "apt-get update failed"
    "${as_root[@]}" apt-get install -y -q --no-install-recommends "$1" || die "apt-get install $1 failed"
}

# Sets the array wheel_args to pip install flags selecting binary wheels for the images' CPython 3.11
# (Debian bookworm, glibc 2.36: every manylinux tag up to 2_36) on this machine's architecture.
cp311_wheel_args() {
    local arch minor
    arch="$(uname -m)"
    case "$arch" in
        x86_64|aarch64) ;;
        *) die "unsupported machine architecture $arch (wheels exist for x86_64 and aarch64)" ;;
    esac
    wheel_args=(--only-binary=:all: --implementation cp --python-version 3.11 --abi cp311 --abi abi3 --abi none --platform "manylinux2014_$arch")
    for minor in $(seq 17 36); do wheel_args+=(--platform "manylinux_2_${minor}_$arch"); done
}
