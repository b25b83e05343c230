#!/usr/bin/env bash
# Fails when a C++/CUDA source of the project differs from what clang-format (.clang-format)
# makes of it, and lists those files. `scripts/check-format.sh --fix` formats them in place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fix=0
[[ "${1:-}" == "--fix" ]] && fix=1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    '*.h' '*.cc' '*.cu' '*.cuh' | while read -r f; do [[ -f "$f" ]] && echo "$f"; done)
else
  mapfile -t files < <(find common kernels worker services tests router \
    \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)
fi
bad=()
for f in "${files[@]}"; do
  if ((fix)); then
    clang-format -i "$f"
  elif ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    bad+=("$f")
  fi
done
if ((${#bad[@]} > 0)); then
  printf 'not clang-formatted (run scripts/check-format.sh --fix):\n'
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
