#!/usr/bin/env bash
# The main job on the bundled default: set-up, build if needed, start a local cluster (`tandem
# up`: drafter, verifier and router as separate processes), send it a sample prompt through the
# router with `tandem generate --server`, print the streamed completion, stop the cluster.
# Decoding is greedy with a repetition penalty of 1.2 (plain greedy, --repetition-penalty 1,
# loops on the small bundled model).
#
#   scripts/run.sh [--prompt TEXT] [--max-tokens N] [--mode MODE] [--repetition-penalty P]
#                  [--build-dir DIR]
#
set -euo pipefail

readonly repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build"
prompt='def fibonacci(n):'
max_tokens=96
mode=auto
repetition_penalty=1.2
while (($# > 0)); do
  case "$1" in
    --prompt) prompt="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --repetition-penalty) repetition_penalty="$2"; shift 2 ;;
    --build-dir) build="$(realpath -m "$2")"; shift 2 ;;
    -h | --help) sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run: unknown option '$1'" >&2; exit 2 ;;
  esac
done

"$repo/scripts/setup.sh"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
echo "run: building tandem and the services"
cmake --build "$build" --target tandem tandem-drafter tandem-verifier tandem-router \
  --parallel "$(nproc)" >/dev/null
tandem="$build/services/cli/tandem"
echo "run: $("$tandem" version)"

# The cluster runs in the background; its stdout goes to a file the script watches for the
# router's address. Whatever happens next, the cluster is stopped on the way out.
work="$(mktemp -d -t tandem-run.XXXXXX)"
cluster_pid=
cleanup() {
  if [[ -n "$cluster_pid" ]] && kill -0 "$cluster_pid" 2>/dev/null; then
    kill -TERM "$cluster_pid" 2>/dev/null || true
    wait "$cluster_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

echo "run: starting the local cluster (tandem up)"
"$tandem" up --listen 127.0.0.1:0 >"$work/up.out" &
cluster_pid=$!
router=
for _ in $(seq 1800); do
  router="$(sed -n 's/^tandem up listening on //p' "$work/up.out")"
  [[ -n "$router" ]] && break
  if ! kill -0 "$cluster_pid" 2>/dev/null; then
    echo "run: tandem up exited before the cluster was ready" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z "$router" ]]; then
  echo "run: the cluster did not start within 3 minutes" >&2
  exit 1
fi
grep '^tandem up: ' "$work/up.out" | grep -v Ctrl-C || true

echo "run: prompt: $prompt"
"$tandem" generate --server "$router" --mode "$mode" --max-tokens "$max_tokens" \
  --repetition-penalty "$repetition_penalty" "$prompt"

echo "run: stopping the cluster"
kill -TERM "$cluster_pid"
status=0
wait "$cluster_pid" || status=$?
cluster_pid=
if ((status != 0)); then
  echo "run: tandem up exited with status $status" >&2
  exit 1
fi
