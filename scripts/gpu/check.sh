#!/usr/bin/env bash
# The GPU checks, on a machine with a GPU, from the repository root, with the kit that
# scripts/gpu/pack.sh made (docs/GPU.md):
#
#   scripts/gpu/check.sh OUT [--kit DIR] [--budget SECONDS] [--steps tests,engine,...]
#                        [--switch VAR=VALUE ...]
#
# OUT gets summary.json and check.log. Without a GPU every GPU step reports "skipped: no GPU".
# The work is scripts/gpu/check.py's (the standard library of any python3 >= 3.8).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="$(command -v python3 || true)"
[[ -n "$python" ]] || { echo "check: python3 is missing" >&2; exit 1; }
exec "$python" "$repo/scripts/gpu/check.py" "$@"
