#!/usr/bin/env bash
# Packs what the GPU checks (scripts/gpu/check.sh) run on a machine that has a GPU but none of
# our Debian libraries: every cuda-labelled test binary and the tandem binaries, built with CUDA
# for Hopper, stripped, with every shared library they load that such a machine lacks. See
# docs/GPU.md.
#
#   scripts/gpu/pack.sh DIR [--build-dir B] [--no-build] [--fast] [--limit-mib N]
#
# DIR gets tandem-gpu-kit.tar.xz and manifest.json. DIR must be ignored by git (it travels to
# the GPU machine as a carried path, beside the working tree); .gpu-kit is.
#   --build-dir B  the build to pack (default build-gpu: Release, CUDA for sm_90a only, configured
#                  here when missing); any build configured with CUDA will do, e.g. build/
#   --no-build     pack what B holds without building (the test suite's dry run)
#   --fast         xz -0 instead of -9e (the dry run; a larger archive)
#   --limit-mib N  fail when the working tree plus DIR pass N MiB (default 60; 0 = no check)
# Never packed: glibc and the loader, and the CUDA libraries (driver, cudart, cuBLAS, cuBLASLt,
# NCCL), which the GPU machine provides; check.sh finds them there.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly repo
usage() { sed -n '2,18s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
die() { echo "pack: $*" >&2; exit 1; }

out=""
build="$repo/build-gpu"
do_build=1
xz_level=(-9e)
limit_mib=60
while (($# > 0)); do
  case "$1" in
    --build-dir)
      (($# >= 2)) || die "--build-dir needs a directory"
      build="$(realpath -m "$2")"
      shift 2
      ;;
    --no-build) do_build=0; shift ;;
    --fast) xz_level=(-0); shift ;;
    --limit-mib)
      (($# >= 2)) || die "--limit-mib needs a number"
      limit_mib="$2"
      shift 2
      ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option '$1'" ;;
    *)
      [[ -z "$out" ]] || die "one output directory only (got '$out' and '$1')"
      out="$1"
      shift
      ;;
  esac
done
[[ -n "$out" ]] || { usage >&2; die "missing the output directory"; }
[[ "$limit_mib" =~ ^[0-9]+$ ]] || die "--limit-mib takes a whole number of MiB, got '$limit_mib'"
for tool in strip ldd xz tar python3 readelf; do
  command -v "$tool" >/dev/null || die "'$tool' is missing (binutils, xz-utils, python3)"
done
mkdir -p "$out"
out="$(realpath "$out")"

# --- Build ------------------------------------------------------------------------------------
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  ((do_build)) || die "$build is not a configured build (and --no-build was given)"
  echo "pack: configuring $build (Release, CUDA sm_90a)"
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_TESTS=ON \
    -DTANDEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real
fi
grep -q '^TANDEM_NCCL_LIBRARY:FILEPATH=.*nccl' "$build/CMakeCache.txt" ||
  die "$build was configured without CUDA (no nvcc or NCCL found there); the kit needs both"
if ((do_build)); then
  echo "pack: building the kit's targets in $build"
  cmake --build "$build" --target tandem_gpu_kit --parallel "$(nproc)"
fi
list="$build/gpu-kit.tsv"
[[ -f "$list" ]] || die "$list is missing: reconfigure $build with -DTANDEM_TESTS=ON"

# --- Stage binaries, stripped -----------------------------------------------------------------
stage="$(mktemp -d -t tandem-gpu-kit.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
kit="$stage/tandem-gpu-kit"
mkdir -p "$kit/bin" "$kit/lib"
binaries=()
while IFS=$'\t' read -r kind name path; do
  [[ -n "$kind" ]] || continue
  [[ -x "$path" ]] || die "$kind $name is not built ($path); build the target tandem_gpu_kit"
  cp "$path" "$kit/bin/$name"
  strip --strip-unneeded "$kit/bin/$name"
  binaries+=("$kit/bin/$name")
done <"$list"
((${#binaries[@]} > 0)) || die "$list names no binaries"

# --- Shared libraries -------------------------------------------------------------------------
# Provided by the GPU machine: glibc and its loader, the GPU driver, and the CUDA libraries.
provided='^(linux-vdso|ld-linux[^ ]*|libc|libm|libpthread|libdl|librt|libresolv|libutil|libanl|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[^ ]*)\.so'
declare -A packed=() gpu_needed=()
for binary in "${binaries[@]}"; do
  while read -r soname arrow resolved _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$resolved" != "not" ]] || die "$(basename "$binary") needs $soname, which is not found here"
    if [[ "$soname" =~ $provided ]]; then
      case "$soname" in libcudart* | libcublas* | libnccl*) gpu_needed[$soname]=1 ;; esac
      continue
    fi
    if [[ -z "${packed[$soname]:-}" ]]; then
      cp -L "$resolved" "$kit/lib/$soname"
      chmod u+w "$kit/lib/$soname"
      strip --strip-unneeded "$kit/lib/$soname"
      packed[$soname]="$resolved"
    fi
  done < <(ldd "$binary")
done

# Every packed file must find every library it needs in the kit or among the provided ones.
for file in "${binaries[@]}" "$kit"/lib/*; do
  while read -r soname arrow resolved _; do
    [[ "$arrow" == "=>" ]] || continue
    [[ "$soname" =~ $provided || -n "${packed[$soname]:-}" ]] ||
      die "$(basename "$file") needs $soname, which the kit did not pack"
  done < <(LD_LIBRARY_PATH="$kit/lib" ldd "$file")
done

# --- Manifest ---------------------------------------------------------------------------------
[[ -f "$build/gpu-kit-build.txt" ]] || die "$build/gpu-kit-build.txt is missing: reconfigure $build"
{
  cat "$build/gpu-kit-build.txt"
  echo "commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
  for soname in "${!packed[@]}"; do echo "packed=$soname"; done
  for soname in "${!gpu_needed[@]}"; do echo "gpu_needed=$soname"; done
} >"$stage/facts"
# The newest glibc and libstdc++ symbol versions any packed file needs.
for file in "${binaries[@]}" "$kit"/lib/*; do
  readelf --version-info --wide "$file" 2>/dev/null | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*' || true
done | sort -u >"$stage/versions"
python3 - "$kit" "$list" "$stage/facts" "$stage/versions" >"$kit/manifest.json" <<'PYTHON'
import json, os, sys, time
kit, listing, facts_path, versions_path = sys.argv[1:5]
facts = {"packed": [], "gpu_needed": []}
for line in open(facts_path):
    key, _, value = line.rstrip("\n").partition("=")
    if key in ("packed", "gpu_needed"):
        facts[key].append(value)
    else:
        facts[key] = value
def newest(prefix):
    found = [l.strip()[len(prefix):] for l in open(versions_path) if l.startswith(prefix)]
    found = [v for v in found if v and all(p.isdigit() for p in v.split("."))]
    return max(found, key=lambda v: tuple(int(p) for p in v.split(".")), default=None)
entries = []
for line in open(listing):
    kind, name, _ = line.rstrip("\n").split("\t")
    entries.append({"kind": kind, "name": name, "file": "bin/" + name,
                    "bytes": os.path.getsize(os.path.join(kit, "bin", name))})
libs = [{"soname": s, "file": "lib/" + s, "bytes": os.path.getsize(os.path.join(kit, "lib", s))}
        for s in sorted(facts["packed"])]
print(json.dumps({
    "format": 1,
    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": facts["commit"],
    "uncommitted_changes": int(facts["dirty"]),
    "build_type": facts["build_type"],
    "cuda_architectures": facts["cuda_architectures"],
    "cuda_compiler": facts["cuda_compiler"],
    "binaries": entries,
    "libraries": libs,
    "gpu_libraries_needed": sorted(facts["gpu_needed"]),
    "glibc_required": newest("GLIBC_"),
    "glibcxx_required": newest("GLIBCXX_"),
}, indent=2))
PYTHON

# --- Archive and sizes ------------------------------------------------------------------------
# What check.sh unpacked into DIR on an earlier run would travel too: DIR holds the kit alone.
rm -rf "$out/unpacked" "$out/tandem-gpu-kit.tar.xz"
tar -C "$stage" -cf - tandem-gpu-kit | xz -T0 "${xz_level[@]}" >"$out/tandem-gpu-kit.tar.xz"
cp "$kit/manifest.json" "$out/manifest.json"

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
unpacked=$(du -sb "$kit" | cut -f1)
kit_bytes=$(du -sb "$out" | cut -f1)
tree_bytes=$(git -C "$repo" ls-files -z --cached --others --exclude-standard |
  (cd "$repo" && xargs -0 stat -c %s 2>/dev/null || true) | awk '{ s += $1 } END { print s + 0 }')
total=$((kit_bytes + tree_bytes))
echo "pack: ${#binaries[@]} binaries, ${#packed[@]} libraries; $(mib "$unpacked") MiB unpacked"
echo "pack: $out: $(mib "$kit_bytes") MiB; working tree $(mib "$tree_bytes") MiB;" \
  "together $(mib "$total") MiB (limit ${limit_mib} MiB)"
case "$out/" in
  "$repo"/*)
    rel="${out#"$repo"/}"
    git -C "$repo" check-ignore -q "$rel" ||
      die "$rel is inside the repository but not ignored by git: it would travel twice"
    echo "pack: carry '$rel' to the GPU machine; there run: scripts/gpu/check.sh OUT --kit $rel"
    ;;
  *) echo "pack: $out is outside the repository: copy it into an ignored folder to carry it" ;;
esac
if ((limit_mib > 0 && total > limit_mib * 1048576)); then
  die "the working tree plus the kit pass ${limit_mib} MiB"
fi
