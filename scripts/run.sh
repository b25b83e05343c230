#!/usr/bin/env bash
# The main job on the bundled default: set-up, build if needed, then run the bundled target
# model on a sample prompt, streaming the completion.
#
#   scripts/run.sh [--prompt TEXT] [--max-tokens N] [--build-dir DIR]
#
# The local cluster (`tandem up`: router, verifier and drafter as separate processes) replaces
# the in-process run here once the services are built.
set -euo pipefail

readonly repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build"
prompt='def fibonacci(n):'
max_tokens=96
while (($# > 0)); do
  case "$1" in
    --prompt) prompt="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    --build-dir) build="$(realpath -m "$2")"; shift 2 ;;
    -h | --help) sed -n '2,9s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run: unknown option '$1'" >&2; exit 2 ;;
  esac
done

"$repo/scripts/setup.sh"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
echo "run: building tandem"
cmake --build "$build" --target tandem --parallel "$(nproc)" >/dev/null
tandem="$build/services/cli/tandem"
model="$repo/models/tandem-target"

echo "run: $("$tandem" version)"
echo "run: model $model, prompt: $prompt"
"$tandem" generate --model "$model" --prompt "$prompt" --max-tokens "$max_tokens"
