# shellcheck shell=bash
# Installs (when missing) the client SDKs the tests drive unchanged against a gateway: the
# official `openai` Python package, pinned (gateway/tests/openai_sdk.rs runs
# gateway/tests/openai/sdk_check.py with it). Sourced by scripts/test.sh; fails (set -e) when
# the install fails.

OPENAI_PYTHON_VERSION=3.51.0

ensure_openai_python() {
  if ! python3 -c "import sys, openai; sys.exit(openai.__version__ != '$OPENAI_PYTHON_VERSION')" 2>/dev/null; then
    echo "installing openai==$OPENAI_PYTHON_VERSION (pip)" >&2
    python3 -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_PYTHON_VERSION" >&2
  fi
}
