#!/usr/bin/env bash
# Installs everything Tandem needs to build and test on Debian 12 (the CUDA toolkit excepted: it
# is optional, and the build uses nvcc when it finds one). Safe to run again: it only calls apt
# when a package is missing, and prints a single line when there is nothing to do.
#
#   scripts/setup.sh            Debian packages (as root, or through sudo)
#   scripts/setup.sh --python   also the tools virtualenv at .venv (tools/requirements.txt)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly repo

# Build toolchain, the libraries of cmake/TandemDependencies.cmake, the libFuzzer runtime for the
# clang fuzz build, redis for the router tests, Python for tools/ and the Python gRPC end-to-end
# test, clang-format for style checks.
readonly packages=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libhiredis-dev libopenblas-dev
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev
  redis-server
  python3 python3-venv python3-grpcio python3-protobuf
  openssl
)

usage() { sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

with_python=0
for arg in "$@"; do
  case "$arg" in
    --python) with_python=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "setup: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

log="$(mktemp -t tandem-setup.XXXXXX)"
trap 'rm -f "$log"' EXIT

# Runs a command with its output in the log; on failure shows the log and stops.
quietly() {
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: '$*' failed; its output:" >&2
    cat "$log" >&2
    exit 1
  fi
}

# --- Debian packages ------------------------------------------------------------------------
missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Abbrev}' "$package" 2>/dev/null || true)"
  [[ "$status" == ii* ]] || missing+=("$package")
done

did_something=0
if ((${#missing[@]} > 0)); then
  if ((EUID == 0)); then
    as_root=()
  elif command -v sudo >/dev/null; then
    as_root=(sudo)
  else
    echo "setup: missing packages (${missing[*]}); run as root or install sudo" >&2
    exit 1
  fi
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y
       -o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
  quietly "${apt[@]}" update
  quietly "${apt[@]}" install --no-install-recommends "${missing[@]}"
  did_something=1
fi

# --- Python tools virtualenv ----------------------------------------------------------------
if ((with_python)); then
  venv="$repo/.venv"
  requirements="$repo/tools/requirements.txt"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating $venv"
    quietly python3 -m venv "$venv"
    did_something=1
  fi
  if [[ -f "$requirements" ]]; then
    # The stamp holds the hash of the requirements last installed, so an unchanged file costs
    # no pip run (and no network).
    stamp="$venv/.tandem-requirements.sha256"
    wanted="$(sha256sum <"$requirements" | cut -d' ' -f1)"
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
      echo "setup: installing tools/requirements.txt into .venv"
      quietly "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
      echo "$wanted" >"$stamp"
      did_something=1
    fi
  else
    echo "setup: no tools/requirements.txt; .venv has no tool packages" >&2
  fi
fi

if ((did_something)); then
  echo "setup: done"
else
  echo "setup: all dependencies present"
fi
