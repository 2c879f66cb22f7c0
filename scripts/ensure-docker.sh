#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
#
# Idempotent: when `docker info` already works, this exits 0 at once. Otherwise it
# installs Debian's docker.io (engine + client) when dockerd is missing, starts dockerd
# in the background with its log in $CELLBLOCK_DOCKERD_LOG, and waits (bounded) until
# `docker info` answers. Exits non-zero with a clear message when it cannot.
#
# Environment:
#   CELLBLOCK_DOCKERD_LOG      dockerd log file   (default /var/log/cellblock-dockerd.log)
#   CELLBLOCK_DOCKERD_WAIT     seconds to wait    (default 60)
set -euo pipefail

log_file="${CELLBLOCK_DOCKERD_LOG:-/var/log/cellblock-dockerd.log}"
wait_seconds="${CELLBLOCK_DOCKERD_WAIT:-60}"

say() { printf 'ensure-docker: %s\n' "$*" >&2; }
die() { say "ERROR: $*"; exit 1; }
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

engine_answers() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

# pgrep (procps) is not on every minimal machine; read /proc instead.
# /proc/PID/stat is "PID (COMM) STATE ..."; a zombie (Z) dockerd has already exited.
dockerd_running() {
    local stat
    for stat in /proc/[0-9]*/stat; do
        case "$(cat "$stat" 2>/dev/null)" in
            *"(dockerd) Z"*) ;;
            *"(dockerd) "*) return 0 ;;
        esac
    done
    return 1
}

if engine_answers; then
    exit 0
fi

# Installing packages and starting dockerd both need root.
need_root "no Docker engine answers (start dockerd yourself or rerun as root)"

command -v dockerd >/dev/null 2>&1 || apt_install docker.io

if dockerd_running; then
    say "dockerd is already running but does not answer yet; waiting for it"
else
    say "starting dockerd in the background (log: $log_file)"
    "${as_root[@]}" mkdir -p "$(dirname "$log_file")"
    # setsid + nohup: dockerd must outlive this script and the caller's shell.
    "${as_root[@]}" sh -c 'nohup setsid dockerd >"$1" 2>&1 </dev/null &' sh "$log_file" \
        || die "could not start dockerd"
fi

deadline=$((SECONDS + wait_seconds))
until engine_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "ERROR: the Docker engine did not answer within ${wait_seconds}s"
        if [ -r "$log_file" ]; then
            say "last lines of $log_file:"
            tail -n 20 "$log_file" >&2 || true
        fi
        if ! command -v docker >/dev/null 2>&1; then
            say "note: no 'docker' client is on PATH"
        fi
        if [ -n "${DOCKER_HOST:-}" ]; then
            say "note: DOCKER_HOST=$DOCKER_HOST (the client talks to that engine, not to the local dockerd)"
        fi
        exit 1
    fi
    if ! dockerd_running && [ "$SECONDS" -ge $((deadline - wait_seconds + 5)) ]; then
        say "ERROR: dockerd exited during start-up"
        [ -r "$log_file" ] && tail -n 20 "$log_file" >&2
        exit 1
    fi
    sleep 1
done
say "Docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo unknown))"
