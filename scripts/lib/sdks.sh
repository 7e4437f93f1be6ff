# shellcheck shell=bash
# Installs (when missing) the client SDKs the tests drive unchanged against a gateway: the
# official `openai` Python package and npm package, pinned (gateway/tests/openai_sdk.rs and
# tests/tests/openai_sdk.rs run gateway/tests/openai/sdk_check.py and sdk_check.cjs with them).
# Sourced by scripts/test.sh after scripts/lib/servers.sh (its apt_install and pip_install);
# fails (set -e) when the install fails.

OPENAI_PYTHON_VERSION=3.51.0

ensure_openai_python() {
  if ! python3 -c "import sys, openai; sys.exit(openai.__version__ != '$OPENAI_PYTHON_VERSION')" 2>/dev/null; then
    pip_install openai "$OPENAI_PYTHON_VERSION"
  fi
}

# The npm package, from gateway/tests/openai/package-lock.json into that folder's node_modules
# (git-ignored); Node.js and npm from Debian when missing.
ensure_openai_node() {
  local dir=gateway/tests/openai
  command -v npm >/dev/null || apt_install nodejs npm
  if ! grep -qs "\"version\": \"$(sed -n 's/.*"openai": "\(.*\)".*/\1/p' "$dir/package.json")\"" \
      "$dir/node_modules/openai/package.json"; then
    echo "installing the openai npm package (npm ci)" >&2
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error >&2
  fi
}
