#!/usr/bin/env bash
# Builds everything and runs the whole test suite; exits non-zero on any failure.
#
#   scripts/test.sh [-R REGEX] [--no-fuzz] [--build-dir DIR]
#
# 1. scripts/setup.sh --deploy-tools --e2e (installs what is missing; one line otherwise)
# 2. DIR (default build/): Ninja, RelWithDebInfo, every target, then ctest in parallel
# 3. DIR/fuzz: the clang libFuzzer build of the parsers (-DTANDEM_FUZZERS=ON) and its ctest
# -R REGEX is passed to both ctest runs; --no-fuzz skips step 3.
# With CI=true (.ci/run sets it) a skipped test fails the run unless it is a GPU test (label cuda).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly repo
readonly started=$SECONDS
jobs="$(nproc)"
readonly jobs

usage() { sed -n '2,11s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

build="$repo/build"
regex=""
fuzz=1
while (($# > 0)); do
  case "$1" in
    -R)
      (($# >= 2)) || { echo "test: -R needs a regex" >&2; exit 2; }
      regex="$2"
      shift 2
      ;;
    --no-fuzz) fuzz=0; shift ;;
    --build-dir)
      (($# >= 2)) || { echo "test: --build-dir needs a directory" >&2; exit 2; }
      build="$(realpath -m "$2")"
      shift 2
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

elapsed() { printf '%dm%02ds' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)); }
stage() { echo "=== test: $* ($(elapsed))"; }

# Without -R an empty suite is a broken build, not a pass; with -R a stage may legitimately
# have no match (the fuzz build holds only fuzz tests).
ctest_args=(--output-on-failure --parallel "$jobs")
if [[ -n "$regex" ]]; then
  ctest_args+=(-R "$regex" --no-tests=ignore)
else
  ctest_args+=(--no-tests=error)
fi

summaries=()
failed=0
total_tests=0
total_failed=0
total_skipped=0
# A failed setup, configure or build stops the script through set -e; still say so, with time.
on_exit() {
  local rc=$?
  ((rc == 0)) || echo "test: FAILED (exit $rc) after $(elapsed) wall time" >&2
}
trap on_exit EXIT

# run_ctest NAME DIR: runs the suite of DIR; keeps ctest's closing "N% tests passed" line.
run_ctest() {
  local name="$1" dir="$2" log="$2/test-summary.log" summary
  stage "ctest $name"
  if ! ctest --test-dir "$dir" "${ctest_args[@]}" 2>&1 | tee "$log"; then
    failed=1
  fi
  summary="$(grep -E '^[0-9]+% tests passed' "$log" | tail -n 1 || true)"
  summaries+=("$name: ${summary:-no ctest summary (see output above)}")
  if [[ "$summary" =~ ([0-9]+)\ tests\ failed\ out\ of\ ([0-9]+) ]]; then
    total_failed=$((total_failed + BASH_REMATCH[1]))
    total_tests=$((total_tests + BASH_REMATCH[2]))
  fi
  total_skipped=$((total_skipped + $(grep -c -E '\*\*\*Skipped' "$log" || true)))
  # In CI only the GPU tests (label cuda) may skip: setup.sh installs every other tool, so a
  # skip there would hide a broken setup.
  if [[ "${CI:-}" == "true" ]]; then
    local unexpected
    unexpected="$(comm -23 \
      <(sed -n -E 's/.*Test +#[0-9]+: ([^ ]+) .*\*\*\*Skipped.*/\1/p' "$log" | sort -u) \
      <(ctest --test-dir "$dir" -N -L cuda | sed -n -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/p' |
        sort -u))"
    if [[ -n "$unexpected" ]]; then
      echo "test: CI=true and these tests skipped (only GPU tests may):" >&2
      echo "$unexpected" | sed 's/^/  /' >&2
      failed=1
    fi
  fi
}

stage "setup"
"$repo/scripts/setup.sh" --deploy-tools --e2e

stage "configure $build"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_TESTS=ON
stage "build ($jobs jobs)"
cmake --build "$build" --parallel "$jobs"
run_ctest main "$build"

if ((fuzz)); then
  stage "configure $build/fuzz (clang, libFuzzer)"
  cmake -S "$repo" -B "$build/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTANDEM_FUZZERS=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  stage "build fuzzers ($jobs jobs)"
  cmake --build "$build/fuzz" --parallel "$jobs"
  run_ctest fuzz "$build/fuzz"
fi

echo "=== test: summary"
for line in "${summaries[@]}"; do echo "  $line"; done
echo "test: finished in $(elapsed) wall time"
# The closing line: one count over every stage.
echo "tests: $((total_tests - total_failed - total_skipped)) passed, $total_failed failed, $total_skipped skipped"
((failed == 0)) || exit 1
