#!/usr/bin/env bash
# Runs TOOL ARGS...; exits 77 (the deploy tests' SKIP_RETURN_CODE) when TOOL is not installed,
# so that a machine without the deploy tools skips these tests instead of failing them.
#   run_tool.sh TOOL [ARGS...]    TOOL: a command on PATH or a path to an executable
set -euo pipefail
tool="$1"
shift
if ! command -v "$tool" >/dev/null 2>&1; then
  echo "SKIP: $tool is not installed (scripts/setup.sh --deploy-tools installs it)"
  exit 77
fi
exec "$tool" "$@"
