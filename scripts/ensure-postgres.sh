#!/usr/bin/env bash
# Makes sure PostgreSQL's server binaries (initdb, pg_ctl) are installed: the run-store tests
# start throwaway clusters with them (tests/support/postgres.py). Installs Debian's `postgresql`
# package when missing; as root the tests run clusters as its unprivileged `postgres` user.
# No cluster is created or started here.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && id postgres >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then exec sudo -n "$0" "$@"; fi
    echo "ensure-postgres: PostgreSQL is missing and installing it needs root (apt-get install postgresql)" >&2
    exit 1
fi
echo "ensure-postgres: installing postgresql from Debian packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# policy-rc.d keeps the package from starting its own cluster service.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -q --no-install-recommends postgresql
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || { echo "ensure-postgres: initdb still missing" >&2; exit 1; }
