#!/usr/bin/env bash
# Make gVisor's runsc available to Docker as the OCI runtime "runsc" (DESIGN.md §3, optional layer).
#
# Idempotent, called by `make engine` after scripts/ensure-docker.sh:
#  1. installs Debian's runsc package when runsc is missing;
#  2. merges {"runtimes": {"runsc": {...}}} into /etc/docker/daemon.json, keeping every other key;
#  3. when the running dockerd does not list runsc yet, reloads it with SIGHUP (runtimes are a
#     live-reloadable dockerd option: running containers are not touched, dockerd is not restarted);
#  4. waits (bounded) until `docker info` lists the runtime.
#
# runtimeArgs (RUNSC_ARGS below):
#   --host-uds=open   cells connect to their bridge over a bind-mounted unix socket; gVisor refuses
#                     to open host unix sockets unless told to ("open" = connect only, never create).
#   --network=none    no network stack in the sandbox at all (cells never have one). Needed too:
#                     this runsc refuses Docker's "none" network ("cannot run with network enabled
#                     in root network namespace").
# Not --oci-seccomp: this runsc (Debian 0.0~20221219) answers EPERM for every filtered call and
# ignores errnoRet/defaultErrnoRet, so clone3 gets EPERM instead of the profile's ENOSYS, glibc does
# not fall back to clone(2), and no thread can start. Under runsc the cell's syscalls reach gVisor's
# Sentry, not the host kernel; the Sentry itself runs under gVisor's own host seccomp filter.
#
# Environment:
#   CELLBLOCK_DOCKER_CONFIG   daemon.json path   (default /etc/docker/daemon.json)
#   CELLBLOCK_RUNSC_WAIT      seconds to wait    (default 30)
set -euo pipefail

config="${CELLBLOCK_DOCKER_CONFIG:-/etc/docker/daemon.json}"
wait_seconds="${CELLBLOCK_RUNSC_WAIT:-30}"
runtime_name=runsc
RUNSC_ARGS='["--host-uds=open", "--network=none"]'

say() { printf 'ensure-runsc: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# True when the engine lists the runtime with exactly RUNSC_ARGS.
engine_lists_runsc() {
    local have
    have="$(docker info --format "{{json (index .Runtimes \"$runtime_name\")}}" 2>/dev/null)" || return 1
    python3 -c 'import json, sys; have = json.loads(sys.argv[1] or "null") or {}; sys.exit(have.get("runtimeArgs") != json.loads(sys.argv[2]))' "$have" "$RUNSC_ARGS"
}

if command -v runsc >/dev/null 2>&1 && engine_lists_runsc; then
    exit 0
fi

need_root "runsc is not registered with Docker (see scripts/ensure-runsc.sh for the steps)"
command -v runsc >/dev/null 2>&1 || apt_install runsc
runsc_path="$(command -v runsc)"

say "registering $runsc_path as the Docker runtime '$runtime_name' in $config"
"${as_root[@]}" mkdir -p "$(dirname "$config")"
"${as_root[@]}" python3 - "$config" "$runtime_name" "$runsc_path" "$RUNSC_ARGS" <<'PY'
import json, os, sys
path, name, binary, args = sys.argv[1:5]
try:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
except FileNotFoundError:
    data = {}
if not isinstance(data, dict):
    sys.exit(f"{path} is not a JSON object")
data.setdefault("runtimes", {})[name] = {"path": binary, "runtimeArgs": json.loads(args)}
tmp = path + ".cellblock-tmp"
with open(tmp, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
PY

if ! docker info >/dev/null 2>&1; then
    say "no Docker engine answers; the runtime is registered for the next dockerd start"
    exit 0
fi
if engine_lists_runsc; then
    exit 0
fi
# SIGHUP makes dockerd re-read daemon.json; runtimes are reloaded live.
pid=""
for stat in /proc/[0-9]*/stat; do
    case "$(cat "$stat" 2>/dev/null)" in
        *"(dockerd) Z"*) ;;
        *"(dockerd) "*) pid="$(basename "$(dirname "$stat")")"; break ;;
    esac
done
[ -n "$pid" ] || die "docker answers but no local dockerd process was found (remote DOCKER_HOST?); register runsc on that engine"
say "reloading dockerd (pid $pid) with SIGHUP"
"${as_root[@]}" kill -HUP "$pid"
deadline=$((SECONDS + wait_seconds))
until engine_lists_runsc; do
    [ "$SECONDS" -lt "$deadline" ] || die "dockerd did not list the runtime $runtime_name within ${wait_seconds}s after reload"
    sleep 1
done
say "Docker lists the runtime $runtime_name ($("$runsc_path" --version 2>/dev/null | head -n1))"
