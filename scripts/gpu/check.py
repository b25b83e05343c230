#!/usr/bin/env python3
"""The GPU checks: every step of docs/GPU.md in one command, on a GPU machine, from the
repository root, with the kit that scripts/gpu/pack.sh made.

    scripts/gpu/check.sh OUT [--kit DIR] [--budget SECONDS] [--steps a,b,...] [--device cpu]
                          [--switch VAR=VALUE ...]

Writes OUT/summary.json (rewritten after every step, so a run cut short still leaves what it
found) and OUT/check.log (every step's command and output). Each step is time-boxed and a
failing step never stops the ones after it. Without a GPU every GPU step reports
"skipped: no GPU" and only the setup runs (the test suite's dry run). `--device cpu` is the
rehearsal: every step runs on the CPU at toy sizes (a 2-layer model, short windows), so that the
whole flow, parsing included, can be tried where there is no GPU; its numbers mean nothing.

Steps, in order (the last ones are cut first when the budget runs out):
  setup    unpack the kit, find the CUDA libraries, check that every binary loads
  tests    every cuda-labelled test binary (gtest JSON: ran, passed, failed, skipped)
  modes    `tandem bench modes` on the bundled models, on the GPU and (in the background from
           the start) on the CPU: greedy outputs compared token by token
  engine   `tandem bench engine` on a Qwen3-8B-shaped bf16 model: decode, copy bandwidth,
           verify cost, step-time grid
  switches with --switch VAR=VALUE (repeatable): the engine's batch-1 decode and verify again
           with that variable set (docs/GPU.md "Looking closer"), beside the engine step's
           numbers
  torch    tools/bench/torch_peer.py: transformers' Qwen3 of the same shape, CUDA graphs
  cluster  `tandem up --device cuda` (verifier and drafter on the GPU), OpenAI HTTP streaming,
           `tandem bench serve` at C = 1, 4, 16, 64 with auto against the fixed modes
Only the standard library: the GPU machine's python3 runs it.
"""

import argparse
import glob
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, needs a GPU, time box in seconds, the least time worth starting it with). Correctness
# first; when the budget runs out the last steps are cut first (docs/GPU.md, "Timing plan").
STEPS = [
    ("tests", True, 150, 30),
    ("modes", True, 90, 30),
    ("engine", True, 150, 60),
    ("switches", True, 120, 50),
    ("torch", True, 120, 45),
    ("cluster", True, 120, 60),
]
TEST_BINARY_BOX = 75  # seconds for one test binary, so that one hang cannot take the step
DEFAULT_BUDGET = 470  # seconds for all steps: under 8 minutes with the setup

# The goals of the GPU validation (docs/GPU.md).
GOAL_BANDWIDTH_EFFICIENCY = 0.85
GOAL_VERIFY_COST_16 = 1.15
GOAL_TORCH_RATIO = 1.0
GOAL_AUTO_RATIO = 0.95

CLUSTER_GRPC = "127.0.0.1:18470"
CLUSTER_HTTP = "127.0.0.1:18471"


class Run:
    """State shared by the steps: where things are, the log, the summary, the clock."""

    def __init__(self, out, kit_dir, budget, device):
        self.out = out
        self.device = device  # "cuda", or "cpu" for the rehearsal
        self.kit_dir = kit_dir
        self.budget = budget
        self.switches = []  # VAR=VALUE settings for the switches step
        self.started = time.monotonic()
        self.log = open(os.path.join(out, "check.log"), "w", encoding="utf-8")
        self.summary = {
            "format": 1,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "budget_seconds": budget,
            "steps": {},
        }
        self.kit = None  # the unpacked kit's folder
        self.manifest = None
        self.env = dict(os.environ)  # our binaries': the kit's libraries first (setup)
        # Python's: the machine's own libraries (the kit's libstdc++ may be older than what
        # PyTorch's extensions need).
        self.python_env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.gpu = None  # nvidia-smi's facts, or None
        self.cpu_reference = None  # the background CPU `bench modes` run

    def elapsed(self):
        return time.monotonic() - self.started

    def left(self):
        return self.budget - self.elapsed()

    def note(self, text):
        self.log.write(text + "\n")
        self.log.flush()

    def save(self):
        self.summary["elapsed_seconds"] = round(self.elapsed(), 1)
        path = os.path.join(self.out, "summary.json")
        with open(path + ".part", "w", encoding="utf-8") as f:
            json.dump(self.summary, f, indent=2)
        os.replace(path + ".part", path)

    def bin(self, name):
        return os.path.join(self.kit, "bin", name)

    def execute(self, argv, timeout, env=None, cwd=REPO):
        """Runs argv in a session of its own, killed with its children after `timeout`.
        Returns (exit code or None on timeout, stdout, seconds); stderr goes to the log."""
        self.note(f"\n$ {' '.join(argv)}   (time box {timeout:.0f} s)")
        start = time.monotonic()
        try:
            process = subprocess.Popen(argv, cwd=cwd, env=env or self.env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
        except OSError as error:
            self.note(f"cannot start: {error}")
            return 127, "", 0.0
        try:
            stdout, stderr = process.communicate(timeout=max(1.0, timeout))
            code = process.returncode
        except subprocess.TimeoutExpired:
            # SIGTERM first: a benchmark that catches it still prints what it measured.
            kill_group(process, signal.SIGTERM)
            try:
                stdout, stderr = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(process)
                stdout, stderr = process.communicate()
            code = None
        seconds = time.monotonic() - start
        self.note(stderr[-200000:] if stderr else "")
        if stdout and not stdout.lstrip().startswith("{"):
            self.note(stdout[-200000:])
        self.note(f"-> {'timed out' if code is None else f'exit {code}'} after {seconds:.1f} s")
        return code, stdout, seconds


def kill_group(process, sig=signal.SIGKILL):
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def parse_json(text):
    """The JSON document that starts at the first '{' of stdout, or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


# --- setup ------------------------------------------------------------------------------------

def find_gpu(run):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = "name,driver_version,memory.total,compute_cap,clocks.max.sm,clocks.max.memory"
    try:
        text = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    fields = [f.strip() for f in lines[0].split(",")]
    keys = ["name", "driver", "memory", "compute_capability", "max_sm_clock", "max_memory_clock"]
    gpu = dict(zip(keys, fields))
    gpu["count"] = len(lines)
    run.note("nvidia-smi: " + "; ".join(lines))
    return gpu


def cuda_library_dirs():
    """Where a GPU machine keeps cudart, cuBLAS and NCCL: the CUDA toolkit, the Python
    packages nvidia-* (PyTorch's), the system's library folders."""
    dirs = [d for d in os.environ.get("TANDEM_CUDA_LIB_DIRS", "").split(":") if d]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            dirs += [os.path.join(home, d) for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    packages = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    packages += [p for p in sys.path if p.endswith("site-packages")]
    for root in packages:
        dirs += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib")))
        dirs += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib")))
    dirs += sorted(glob.glob("/usr/local/cuda-*/lib64")) + sorted(glob.glob("/usr/local/cuda-*/lib"))
    dirs += ["/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64"]
    seen, unique = set(), []
    for d in dirs:
        if os.path.isdir(d) and d not in seen:
            seen.add(d)
            unique.append(d)
    return unique


def ldconfig_paths():
    """soname -> path from the loader's cache (ldconfig -p)."""
    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    paths = {}
    for line in text.splitlines():
        match = re.match(r"\s*(\S+) \(.*x86-64.*\) => (\S+)", line)
        if match:
            paths.setdefault(match.group(1), match.group(2))
    return paths


def locate_cuda_libraries(needed):
    found = {}
    dirs = cuda_library_dirs()
    cached = ldconfig_paths()
    for soname in needed:
        found[soname] = next((os.path.join(d, soname) for d in dirs
                              if os.path.exists(os.path.join(d, soname))), cached.get(soname))
    return found


def glibc_version():
    try:
        text = subprocess.run(["getconf", "GNU_LIBC_VERSION"], capture_output=True, text=True,
                              timeout=10).stdout
        return text.split()[-1]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def version_tuple(text):
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def unpack(run):
    archive = os.path.join(run.kit_dir, "tandem-gpu-kit.tar.xz")
    if not os.path.exists(archive):
        raise RuntimeError(f"{archive} is missing: run scripts/gpu/pack.sh {run.kit_dir} first "
                           "and carry that folder")
    target = os.path.join(run.kit_dir, "unpacked")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)
    run.kit = os.path.join(target, "tandem-gpu-kit")
    with open(os.path.join(run.kit, "manifest.json"), encoding="utf-8") as f:
        run.manifest = json.load(f)


def check_loading(run):
    """ldd of every packed binary with the kit's environment: what is not found, and where
    each library comes from."""
    missing = {}
    for entry in run.manifest["binaries"]:
        path = os.path.join(run.kit, entry["file"])
        text = subprocess.run(["ldd", path], capture_output=True, text=True, env=run.env,
                              timeout=60).stdout
        lost = [line.split()[0] for line in text.splitlines() if "not found" in line]
        if lost:
            missing[entry["name"]] = lost
    return missing


def smoke(run):
    """Each binary starts: --gtest_list_tests for the tests, --help for the tools."""
    failed = {}
    for entry in run.manifest["binaries"]:
        flag = "--gtest_list_tests" if entry["kind"] == "test" else "--help"
        argv = [os.path.join(run.kit, entry["file"]), flag]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=run.env, timeout=60,
                                  cwd=REPO)
        except (OSError, subprocess.TimeoutExpired) as error:
            failed[entry["name"]] = str(error)
            continue
        if done.returncode != 0:
            failed[entry["name"]] = (done.stderr or done.stdout)[-2000:]
    return failed


def setup(run):
    result = {"status": "ok", "problems": []}
    run.gpu = find_gpu(run)
    result["gpu"] = run.gpu
    unpack(run)
    result["kit"] = {k: run.manifest.get(k) for k in
                     ("commit", "uncommitted_changes", "created", "build_type",
                      "cuda_architectures", "glibc_required", "glibcxx_required")}
    result["kit"]["binaries"] = len(run.manifest["binaries"])
    result["kit"]["libraries"] = len(run.manifest["libraries"])
    glibc = glibc_version()
    result["glibc"] = glibc
    required = run.manifest.get("glibc_required")
    if glibc and required and version_tuple(glibc) < version_tuple(required):
        result["problems"].append(f"glibc {glibc} is older than the kit's {required}")
    libraries = locate_cuda_libraries(run.manifest.get("gpu_libraries_needed", []))
    result["cuda_libraries"] = libraries
    for soname, path in libraries.items():
        if path is None:
            result["problems"].append(f"{soname} not found (set TANDEM_CUDA_LIB_DIRS)")
    dirs = []
    for path in libraries.values():
        if path and os.path.dirname(path) not in dirs:
            dirs.append(os.path.dirname(path))
    parts = [os.path.join(run.kit, "lib")] + dirs
    if run.env.get("LD_LIBRARY_PATH"):
        parts.append(run.env["LD_LIBRARY_PATH"])
    run.env["LD_LIBRARY_PATH"] = ":".join(parts)
    run.env["TANDEM_SOURCE_DIR"] = REPO  # the tests' models and fixtures
    # The bundled model for `tandem up` and `bench serve` (they look above their executable).
    run.env["TANDEM_MODEL_DIR"] = os.path.join(REPO, "models", "tandem-target")
    result["ld_library_path"] = run.env["LD_LIBRARY_PATH"]
    missing = check_loading(run)
    result["unresolved_libraries"] = missing
    if missing:
        result["problems"].append(f"libraries not found: {missing}")
    failed = smoke(run)
    result["failed_to_start"] = failed
    if failed:
        result["problems"].append(f"binaries that do not start: {sorted(failed)}")
    if result["problems"]:
        result["status"] = "problems"
    return result


# --- tests ------------------------------------------------------------------------------------

def gtest_results(path):
    """(finished test names, [{test, result, message}]) from a gtest JSON report."""
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    done, results = [], []
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            name = f"{suite['name']}.{test['name']}"
            if test.get("status") == "NOTRUN":
                continue
            done.append(name)
            failures = [f.get("failure", "") for f in test.get("failures", [])]
            if failures:
                outcome = "failed"
            elif test.get("result") == "SKIPPED":
                outcome = "skipped"
            else:
                outcome = "passed"
            message = "\n".join(failures)[-4000:]
            results.append({"test": name, "result": outcome, "message": message})
    return done, results


def run_test_binary(run, entry, deadline):
    """Runs one test binary; after a crash, runs the tests it had not reached (three times
    at most). Returns its results."""
    results, excluded = [], []
    for attempt in range(4):
        left = deadline - time.monotonic()
        if left < 5:
            results.append({"test": f"{entry['name']} (rest)", "result": "timeout",
                            "message": "the tests step's time box ran out"})
            break
        report = os.path.join(run.kit, f"{entry['name']}.{attempt}.json")
        argv = [os.path.join(run.kit, entry["file"]), f"--gtest_output=json:{report}"]
        if excluded:
            argv.append("--gtest_filter=-" + ":".join(excluded))
        code, stdout, _ = run.execute(argv, min(left, TEST_BINARY_BOX))
        if os.path.exists(report):
            _, found = gtest_results(report)
            # gtest's JSON has no skip message; its console output has one before each skip.
            reasons = dict((name, why.strip()) for why, name in re.findall(
                r": Skipped\n(.*?)\n\[  SKIPPED \] (\S+)", stdout, re.S))
            for r in found:
                if r["result"] == "skipped":
                    r["message"] = reasons.get(r["test"], "")[-500:]
            results += found
            break
        # No report: the binary died. The test it was in is the last one started.
        started = re.findall(r"^\[ RUN      \] (\S+)", stdout, re.M)
        ended = set(re.findall(r"^\[ +(?:OK|FAILED|SKIPPED) +\] (\S+)", stdout, re.M))
        for name in ended:
            if name not in excluded:
                excluded.append(name)
                results.append({"test": name, "result": "passed" if re.search(
                    rf"^\[ +OK +\] {re.escape(name)}", stdout, re.M) else "failed",
                    "message": "" if code is not None else "timed out"})
        crashed = [name for name in started if name not in ended]
        what = "timed out" if code is None else f"exit {code}"
        if not crashed:
            results.append({"test": f"{entry['name']} (process)", "result": "failed",
                            "message": f"{what} before any test ran: {stdout[-2000:]}"})
            break
        results.append({"test": crashed[-1], "result": "crashed",
                        "message": f"{what}; output tail:\n{stdout[-3000:]}"})
        excluded.append(crashed[-1])
    return results


def tests(run, deadline):
    per_binary, counts, failures = {}, {}, []
    for entry in run.manifest["binaries"]:
        if entry["kind"] != "test":
            continue
        results = run_test_binary(run, entry, deadline)
        tally = {}
        for r in results:
            tally[r["result"]] = tally.get(r["result"], 0) + 1
            counts[r["result"]] = counts.get(r["result"], 0) + 1
            if r["result"] not in ("passed", "skipped"):
                failures.append({"binary": entry["name"], **r})
        per_binary[entry["name"]] = tally
        skips = sorted({r["message"] for r in results if r["result"] == "skipped"})
        if skips:
            per_binary[entry["name"]]["skip_reasons"] = skips[:5]
    bad = sum(v for k, v in counts.items() if k not in ("passed", "skipped"))
    return {"status": "passed" if bad == 0 else "failed", "counts": counts,
            "binaries": per_binary, "failures": failures}


# --- engine and torch -------------------------------------------------------------------------

def engine_argv(run):
    """`tandem bench engine` on the step's model: on a GPU without the grid (the caller adds
    the one it wants); the rehearsal's toy settings carry a small grid."""
    argv = [run.bin("tandem"), "bench", "engine", "--json", "--device", run.device]
    if run.device == "cpu":
        return argv + ["--shape", "small", "--layers", "2", "--decode-steps", "8",
                       "--prefill-tokens", "64", "--grid-batches", "1,2", "--grid-extends",
                       "1,16", "--grid-contexts", "512", "--grid-reps", "2"]
    return argv + ["--shape", "qwen3-8b", "--decode-steps", "128", "--prefill-tokens", "512"]


def engine(run, deadline):
    left = deadline - time.monotonic()
    argv = engine_argv(run)
    if run.device != "cpu":
        # Cut first: the grid's long context, then the grid.
        contexts = "512,4096" if left > 110 else "512"
        if left > 80:
            argv += ["--grid-batches", "1,2,4,8,16,32,64", "--grid-extends", "1,2,4,8,16",
                     "--grid-contexts", contexts, "--grid-reps", "5"]
    code, stdout, seconds = run.execute(argv, left)
    result = parse_json(stdout) if code == 0 else None
    if result is None:
        return {"status": "timeout" if code is None else "failed", "seconds": seconds}
    return {"status": "ok", "seconds": seconds, "result": result}


def batch1_points(result):
    """{extend: step ms} of the grid's batch-1 points at its first context."""
    points = (result.get("grid") or {}).get("points") or []
    first = min((p["context"] for p in points), default=None)
    return {str(p["extend"]): p["step_ms"] for p in points
            if p["batch"] == 1 and p["context"] == first}


def switches(run, deadline):
    """The engine's decode and batch-1 verify again under each --switch, beside the engine
    step's (the same decode measurement; the same grid points and repetitions)."""
    base = run.summary["steps"].get("engine", {}).get("result")
    base_points = batch1_points(base) if base else {}
    found = []
    for setting in run.switches:
        name, _, value = setting.partition("=")
        left = deadline - time.monotonic()
        if left < 30:
            found.append({"switch": setting, "status": "skipped: out of time"})
            continue
        argv = engine_argv(run)
        if run.device != "cpu":
            argv += ["--grid-batches", "1", "--grid-extends", "1,2,16", "--grid-contexts", "512",
                     "--grid-reps", "5"]
        env = dict(run.env)
        env[name] = value
        code, stdout, seconds = run.execute(argv, left, env=env)
        result = parse_json(stdout) if code == 0 else None
        if result is None:
            found.append({"switch": setting, "seconds": seconds,
                          "status": "timeout" if code is None else "failed"})
            continue
        entry = {"switch": setting, "status": "ok", "seconds": seconds,
                 "decode_tokens_per_second": result["decode"]["tokens_per_second"],
                 "batch1_step_ms": batch1_points(result)}
        if base:
            # Above 1: the default (the engine step) is faster than with the switch.
            entry["default_over_switch"] = (base["decode"]["tokens_per_second"] /
                                            result["decode"]["tokens_per_second"])
            entry["default_batch1_step_ms"] = base_points
        found.append(entry)
    bad = [f for f in found if f["status"] != "ok"]
    return {"status": "ok" if not bad else bad[0]["status"], "switches": found}


def torch_peer(run, deadline):
    left = deadline - time.monotonic()
    if run.device == "cpu":
        try:
            subprocess.run([sys.executable, "-c", "import torch, transformers"], check=True,
                           capture_output=True, timeout=120, env=run.python_env)
        except (OSError, subprocess.SubprocessError):
            return {"status": "skipped: no torch and transformers for this python3"}
        shape = ["--shape", "tiny", "--device", "cpu", "--method", "eager", "--context", "64",
                 "--tokens", "16"]
    else:
        shape = ["--shape", "qwen3-8b", "--device", "cuda", "--context", "512", "--tokens", "128"]
    argv = [sys.executable, os.path.join(REPO, "tools/bench/torch_peer.py"), *shape, "--json",
            "--check", "--time-limit", f"{max(10, left - 15):.0f}"]
    code, stdout, seconds = run.execute(argv, left, env=run.python_env)
    result = parse_json(stdout)
    if result is None:
        return {"status": "timeout" if code is None else "failed", "seconds": seconds}
    return {"status": "ok" if code == 0 else "failed", "seconds": seconds, "result": result}


# --- modes ------------------------------------------------------------------------------------

def modes_args(run):
    """`bench modes` for the GPU and its CPU reference alike; the rehearsal runs both on the CPU,
    at once, so it asks for one prompt per category and short outputs."""
    size = ["--prompts", "1", "--max-tokens", "16"] if run.device == "cpu" else [
        "--prompts", "2", "--max-tokens", "48"]
    return ["bench", "modes", "--json", "--tokens", *size]


def start_cpu_reference(run):
    """`bench modes` on the CPU in the background, from the start of the run: the reference
    the GPU's greedy outputs are compared with. Eight threads (at most the machine's cores), so
    the tests step keeps cores; it is done before the timed steps start."""
    threads = str(min(8, os.cpu_count() or 1))
    argv = [run.bin("tandem")] + modes_args(run) + ["--device", "cpu", "--threads", threads]
    run.note(f"\n$ {' '.join(argv)}   (background: the CPU reference of the modes step)")
    holder = {"argv": argv, "started": time.monotonic()}

    def work():
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=run.env, cwd=REPO,
                                  timeout=600)
            holder["code"], holder["stdout"], holder["stderr"] = (done.returncode, done.stdout,
                                                                  done.stderr)
        except (OSError, subprocess.TimeoutExpired) as error:
            holder["code"], holder["stdout"], holder["stderr"] = None, "", str(error)
        holder["seconds"] = time.monotonic() - holder["started"]

    holder["thread"] = threading.Thread(target=work, daemon=True)
    holder["thread"].start()
    run.cpu_reference = holder


def compare_outputs(gpu, cpu):
    """Per variant: prompts whose tokens equal the CPU's, and where the first one differs."""
    cpu_tokens = {(o["variant"], o["prompt"]): o["tokens"] for o in cpu.get("outputs", [])}
    table = {}
    for o in gpu.get("outputs", []):
        row = table.setdefault(o["variant"], {"prompts": 0, "equal": 0, "first_divergence": []})
        row["prompts"] += 1
        want = cpu_tokens.get((o["variant"], o["prompt"]))
        if want == o["tokens"]:
            row["equal"] += 1
        elif want is not None:
            n = next((i for i, (a, b) in enumerate(zip(o["tokens"], want)) if a != b),
                     min(len(o["tokens"]), len(want)))
            row["first_divergence"].append(n)
    return table


def modes(run, deadline):
    argv = [run.bin("tandem")] + modes_args(run) + ["--device", run.device]
    code, stdout, seconds = run.execute(argv, deadline - time.monotonic())
    gpu = parse_json(stdout) if code == 0 else None
    if gpu is None:
        return {"status": "timeout" if code is None else "failed", "seconds": seconds}
    lossless = {}
    for row in gpu["results"]:
        if row["lossless"]:
            v = lossless.setdefault(row["variant"], {"prompts": 0, "exact": 0.0})
            v["prompts"] += row["prompts"]
            v["exact"] += row["exact_match_sequences"] * row["prompts"]
    not_exact = sorted(k for k, v in lossless.items() if v["exact"] < v["prompts"])
    result = {"status": "ok" if not not_exact else "failed", "seconds": seconds,
              "gpu_results": gpu["results"], "skipped_variants": gpu.get("skipped", []),
              "lossless_not_exact_vs_gpu_ar": not_exact}
    reference = run.cpu_reference
    reference["thread"].join(timeout=max(1.0, deadline - time.monotonic()))
    if reference["thread"].is_alive() or reference.get("code") != 0:
        result["cpu_reference"] = ("still running when the step's time ran out"
                                   if reference["thread"].is_alive() else
                                   f"failed: {reference.get('stderr', '')[-2000:]}")
        return result
    cpu = parse_json(reference["stdout"])
    result["cpu_reference_seconds"] = round(reference["seconds"], 1)
    result["gpu_vs_cpu"] = compare_outputs(gpu, cpu or {})
    return result


# --- cluster ----------------------------------------------------------------------------------

def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout)


def openai_stream(prompt):
    """A streamed /v1/completions request as an OpenAI client sends it: the text of its SSE
    chunks and whether the stream ended with [DONE]."""
    body = {"model": "tandem-target", "prompt": prompt, "max_tokens": 32, "temperature": 0,
            "stream": True}
    text, chunks, done = "", 0, False
    with http("POST", f"http://{CLUSTER_HTTP}/v1/completions", body, timeout=60) as response:
        for raw in response:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                done = True
                break
            chunks += 1
            for choice in json.loads(payload).get("choices", []):
                text += choice.get("text", "")
    return {"chunks": chunks, "done": done, "text": text}


def cluster(run, deadline):
    up = [run.bin("tandem"), "up", "--device", run.device, "--listen", CLUSTER_GRPC,
          "--http-listen", CLUSTER_HTTP, "--start-timeout", "60"]
    run.note(f"\n$ {' '.join(up)}   (background)")
    log = open(os.path.join(run.kit, "cluster.log"), "w", encoding="utf-8")
    process = subprocess.Popen(up, cwd=REPO, env=run.env, stdout=log, stderr=log, text=True,
                               start_new_session=True)
    result = {"status": "failed"}
    start = time.monotonic()
    try:
        ready = False
        while time.monotonic() < deadline - 30 and process.poll() is None:
            try:
                with http("GET", f"http://{CLUSTER_HTTP}/ready", timeout=2) as r:
                    ready = r.status == 200
            except OSError:
                pass
            if ready:
                break
            time.sleep(1)
        result["ready_seconds"] = round(time.monotonic() - start, 1)
        if not ready:
            result["error"] = "the cluster did not become ready"
            return result
        try:
            result["openai_stream"] = openai_stream("def fibonacci(n):")
        except (OSError, ValueError) as error:
            result["openai_stream"] = {"error": str(error)}
        levels, seconds = ("1,4", "1") if run.device == "cpu" else ("1,4,16,64", "3")
        serve = [run.bin("tandem"), "bench", "serve", "--server", CLUSTER_GRPC, "--modes",
                 "ar,spec,auto", "--concurrency", levels, "--duration", seconds, "--rounds",
                 "1", "--pair-rounds", "1", "--warmup", "1", "--json", "--out-dir", ""]
        code, stdout, seconds = run.execute(serve, deadline - time.monotonic() - 10)
        served = parse_json(stdout)
        if served is None:
            result["status"] = "timeout" if code is None else "failed"
            return result
        result["serve"] = {"auto_vs_best": served.get("auto_vs_best"),
                           "levels": served.get("levels")}
        result["crossover"] = crossover(served.get("levels", []))
        stream = result.get("openai_stream", {})
        result["status"] = "ok" if stream.get("done") and stream.get("chunks") else "failed"
        return result
    finally:
        kill_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_group(process)
        log.close()
        with open(os.path.join(run.kit, "cluster.log"), encoding="utf-8") as f:
            run.note("cluster log:\n" + f.read()[-100000:])


def crossover(levels):
    """The lowest concurrency at which ar's throughput reaches spec's (spec stops paying)."""
    tps = {}
    for level in levels:
        mode, c = level.get("mode"), level.get("concurrency")
        value = level.get("tokens_per_second")  # the median over the level's windows
        if mode in ("ar", "spec") and value is not None:
            tps.setdefault(c, {})[mode] = value
    for c in sorted(tps):
        if "ar" in tps[c] and "spec" in tps[c] and tps[c]["ar"] >= tps[c]["spec"]:
            return {"concurrency": c, "per_level": tps}
    return {"concurrency": None, "per_level": tps}


# --- goals and the closing table --------------------------------------------------------------

def goals(summary):
    steps = summary["steps"]
    found = {}
    engine_result = steps.get("engine", {}).get("result")
    torch_result = steps.get("torch", {}).get("result")
    if engine_result:
        decode = engine_result["decode"]
        found["bandwidth_efficiency"] = (decode["bandwidth_efficiency"],
                                         GOAL_BANDWIDTH_EFFICIENCY, ">=")
        cost = (engine_result.get("grid") or {}).get("verify_cost", {}).get("512", {})
        if "16" in cost:
            found["verify_cost_16_over_1"] = (cost["16"], GOAL_VERIFY_COST_16, "<=")
    if engine_result and torch_result and torch_result.get("tokens_per_second"):
        ratio = engine_result["decode"]["tokens_per_second"] / torch_result["tokens_per_second"]
        found["tokens_per_second_over_torch"] = (ratio, GOAL_TORCH_RATIO, ">=")
    for level in (steps.get("cluster", {}).get("serve") or {}).get("auto_vs_best") or []:
        found[f"auto_over_best_c{level['concurrency']}"] = (
            level.get("paired_ratio_median") or level["ratio"], GOAL_AUTO_RATIO, ">=")
    return {k: {"value": v, "goal": g, "met": v >= g if op == ">=" else v <= g}
            for k, (v, g, op) in found.items()}


def closing_table(summary):
    if summary.get("device") == "cpu":
        where = " (rehearsal on the CPU: the numbers mean nothing)"
    elif summary.get("gpu"):
        where = f" on {summary['gpu']['name']}"
    else:
        where = " (no GPU)"
    lines = ["", "tandem GPU checks" + where]
    for name, step in summary["steps"].items():
        detail = ""
        if name == "tests" and "counts" in step:
            detail = ", ".join(f"{k} {v}" for k, v in sorted(step["counts"].items()))
        if name == "engine" and "result" in step:
            d = step["result"]["decode"]
            detail = (f"decode {d['tokens_per_second']:.1f} tok/s, bandwidth efficiency "
                      f"{d['bandwidth_efficiency']:.3f}")
        if name == "switches":
            detail = "; ".join(
                f"{f['switch']}: default {f['default_over_switch']:.3f}x as fast"
                if "default_over_switch" in f else f"{f['switch']}: {f['status']}"
                for f in step.get("switches", []))
        if name == "torch" and "result" in step:
            detail = f"{step['result'].get('tokens_per_second') or 0:.1f} tok/s"
        if name == "modes" and "lossless_not_exact_vs_gpu_ar" in step:
            detail = f"lossless but not exact: {step['lossless_not_exact_vs_gpu_ar'] or 'none'}"
        seconds = step.get("seconds")
        timing = f" ({seconds:.0f} s)" if isinstance(seconds, (int, float)) else ""
        lines.append(f"  {name:8s} {step['status']}{timing}  {detail}")
    for name, goal in summary.get("goals", {}).items():
        lines.append(f"  goal {name}: {goal['value']:.3f} (goal {goal['goal']}) "
                     f"{'met' if goal['met'] else 'MISSED'}")
    lines.append(f"  elapsed {summary['elapsed_seconds']} s of a {summary['budget_seconds']} s "
                 "budget; summary.json and check.log hold the rest")
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------

RUNNERS = {"tests": tests, "modes": modes, "engine": engine, "switches": switches,
           "torch": torch_peer, "cluster": cluster}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output folder (summary.json, check.log)")
    parser.add_argument("--kit", default=os.path.join(REPO, ".gpu-kit"),
                        help="the folder scripts/gpu/pack.sh wrote (default .gpu-kit)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help="seconds for all steps after the setup")
    parser.add_argument("--steps", default=",".join(s[0] for s in STEPS),
                        help="comma-separated steps to run (default: all)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the rehearsal, every step on the CPU at toy sizes")
    parser.add_argument("--switch", action="append", default=[], metavar="VAR=VALUE",
                        help="the switches step: measure the engine again with VAR=VALUE")
    args = parser.parse_args()
    bad_switches = [s for s in args.switch if not re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", s)]
    if bad_switches:
        parser.error(f"--switch takes VAR=VALUE, got {bad_switches}")
    wanted = [s for s in args.steps.split(",") if s]
    if not args.switch and "switches" in wanted:
        wanted.remove("switches")  # nothing to switch
    unknown = [s for s in wanted if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {list(RUNNERS)}")
    os.makedirs(args.out, exist_ok=True)
    run = Run(os.path.abspath(args.out), os.path.abspath(args.kit), args.budget, args.device)
    run.switches = args.switch
    try:
        run.summary["steps"]["setup"] = setup(run)
    except Exception as error:  # noqa: BLE001 - the summary must say what broke
        run.summary["steps"]["setup"] = {"status": f"error: {error}"}
        run.save()
        print(closing_table(run.summary))
        return 1
    run.summary["gpu"] = run.gpu
    run.summary["device"] = run.device
    run.save()
    run.started = time.monotonic()  # the budget counts the steps, not the unpacking
    runs_gpu_steps = run.gpu is not None or run.device == "cpu"
    if runs_gpu_steps and "modes" in wanted:
        start_cpu_reference(run)
    for name, needs_gpu, box, least in STEPS:
        if name not in wanted:
            continue
        if needs_gpu and not runs_gpu_steps:
            run.summary["steps"][name] = {"status": "skipped: no GPU"}
        elif run.left() < least:
            run.summary["steps"][name] = {"status": "skipped: out of time"}
        else:
            # The boxes are sized for a GPU; the rehearsal's CPU, often beside a test run,
            # gets twice as long (its modes step once ran out of 90 s under a loaded suite).
            if run.device == "cpu":
                box *= 2
            deadline = time.monotonic() + min(box, run.left())
            run.note(f"\n=== {name} (time box {min(box, run.left()):.0f} s)")
            try:
                run.summary["steps"][name] = RUNNERS[name](run, deadline)
            except Exception as error:  # noqa: BLE001 - one step's bug must not stop the rest
                run.summary["steps"][name] = {"status": f"error: {type(error).__name__}: {error}"}
        run.summary["goals"] = goals(run.summary)
        run.save()
    run.save()
    print(closing_table(run.summary))
    setup_ok = run.summary["steps"]["setup"]["status"] == "ok"
    return 0 if setup_ok else 1


if __name__ == "__main__":
    sys.exit(main())
