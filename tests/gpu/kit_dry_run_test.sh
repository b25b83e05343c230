#!/usr/bin/env bash
# The GPU kit's dry run on this build (no second build): scripts/gpu/pack.sh packs the build's
# GPU test binaries and tools with their libraries, scripts/gpu/check.sh unpacks and runs its
# setup, and every GPU step reports "skipped: no GPU" (or, on a host with a GPU, "skipped: out
# of time" under a zero budget). Then the rehearsal (check.sh --device cpu) runs every step on
# the CPU at toy sizes from the same kit, and each must end "ok" (the PyTorch peer may skip
# where python3 has no torch). Keeps the kit from rotting between GPU windows.
#
#   tests/gpu/kit_dry_run_test.sh BUILD_DIR
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(realpath "$1")"
work="$(mktemp -d -t tandem-kit-dry-run.XXXXXX)"
trap 'rm -rf "$work"' EXIT

"$repo/scripts/gpu/pack.sh" "$work/kit" --build-dir "$build" --no-build --fast --limit-mib 0
budget=()
command -v nvidia-smi >/dev/null && budget=(--budget 0)
"$repo/scripts/gpu/check.sh" "$work/out" --kit "$work/kit" "${budget[@]}"

python3 - "$build/gpu-kit.tsv" "$work/kit/manifest.json" "$work/out/summary.json" <<'PYTHON'
import json, sys
listing, manifest_path, summary_path = sys.argv[1:4]
manifest = json.load(open(manifest_path))
summary = json.load(open(summary_path))
problems = []
def expect(ok, what):
    if not ok:
        problems.append(what)

wanted = {line.split("\t")[1] for line in open(listing) if line.strip()}
packed = {b["name"] for b in manifest["binaries"]}
expect(wanted == packed, f"packed binaries {sorted(packed)} != the build's list {sorted(wanted)}")
expect(any(b["kind"] == "test" for b in manifest["binaries"]), "no test binary packed")
expect({"tandem", "tandem-verifier", "tandem-drafter", "tandem-router"} <= packed,
       "a service binary is missing")
sonames = {l["soname"] for l in manifest["libraries"]}
for needed in ("libgrpc++", "libprotobuf", "libopenblas", "libabsl_"):
    expect(any(s.startswith(needed) for s in sonames), f"{needed}* not packed")
for provided in ("libc.so", "libcuda.so", "libcudart", "libcublas", "libnccl"):
    expect(not any(s.startswith(provided) for s in sonames), f"{provided}* must not be packed")
expect(set(manifest["gpu_libraries_needed"]) >= {"libcudart.so.13", "libnccl.so.2"},
       f"gpu_libraries_needed: {manifest['gpu_libraries_needed']}")
expect(manifest["glibc_required"], "glibc_required is not set")

setup = summary["steps"]["setup"]
expect(setup["status"] == "ok", f"setup: {setup.get('status')}: {setup.get('problems')}")
expect(not setup.get("unresolved_libraries"), f"unresolved: {setup.get('unresolved_libraries')}")
expect(not setup.get("failed_to_start"), f"failed to start: {setup.get('failed_to_start')}")
expect(all(setup["cuda_libraries"].values()), f"CUDA libraries: {setup['cuda_libraries']}")
for step in ("tests", "engine", "torch", "modes", "cluster"):
    status = summary["steps"].get(step, {}).get("status")
    expect(status in ("skipped: no GPU", "skipped: out of time"), f"{step}: {status}")
if problems:
    print("dry run FAILED:\n  " + "\n  ".join(problems))
    sys.exit(1)
print(f"dry run: {len(packed)} binaries, {len(sonames)} libraries, setup ok, GPU steps skipped")
PYTHON

"$repo/scripts/gpu/check.sh" "$work/rehearsal" --kit "$work/kit" --device cpu \
  --switch TANDEM_CUDA_PDL=0
python3 - "$work/rehearsal/summary.json" <<'PYTHON'
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
bad = {name: step.get("status") for name, step in steps.items()
       if step.get("status") not in ("ok", "passed") and not (name == "torch" and
                                              step.get("status", "").startswith("skipped: no torch"))}
switched = steps.get("switches", {}).get("switches", [])
if len(switched) != 1 or "default_over_switch" not in switched[0]:
    bad["switches"] = f"one measured switch expected, got {switched}"
if bad:
    print(f"rehearsal FAILED: {bad} (see check.log beside summary.json)")
    sys.exit(1)
print("rehearsal: every step ok on the CPU")
PYTHON
