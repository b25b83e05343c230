#!/usr/bin/env bash
# Runs TOOL ARGS...; exits 77 (the deploy tests' SKIP_RETURN_CODE) when TOOL is not installed,
# so that a developer's machine without the deploy tools skips these tests instead of failing
# them. In CI (CI=true) a missing tool fails the test: scripts/setup.sh installs every one, so a
# skip there would hide a broken setup.
#   run_tool.sh TOOL [ARGS...]    TOOL: a command on PATH or a path to an executable
set -euo pipefail
tool="$1"
shift
if ! command -v "$tool" >/dev/null 2>&1; then
  if [[ "${CI:-}" == "true" ]]; then
    echo "FAIL: $tool is not installed, and CI=true: scripts/setup.sh --deploy-tools must install it"
    exit 1
  fi
  echo "SKIP: $tool is not installed (scripts/setup.sh --deploy-tools installs it)"
  exit 77
fi
exec "$tool" "$@"
