#!/usr/bin/env python3
"""Peer benchmark against llama.cpp: batch-1 greedy CPU decode speed and output agreement.

What it measures
  Speed: Tandem (`tandem generate`, mode ar, greedy) and llama.cpp (llama-cpp-python, CPU
  build from the PyPI sdist) decode --tokens tokens from the same prompt token ids on the same
  weights, at each of --threads (both engines at the same thread count). --rounds paired
  rounds; each round runs both engines at every thread count, the order of the two engines
  alternating from round to round. Reported per thread count: median [min-max] tokens/s of
  each engine and the median [min-max] of the per-round ratio Tandem / llama.cpp.

  Two rates are given for each engine:
    decode  (n - 1) / time of the n - 1 single-token forwards after the prompt: the prompt's
            forward yields the first token, each later token costs one decode forward.
            llama.cpp: timed around the decode loop (eval of one token, argmax of its logits).
            Tandem: `tandem generate --json` reports the run's seconds and the first token's
            (the prompt's forward and that token's draw); decode is the time between.
    e2e     n / (prompt forward + decode), the definition of Tandem's stats-line tokens/s,
            computed the same way for llama.cpp.
  Model loading is excluded for both. Both engines compute in fp32 with the default
  --gguf-type f32 (Tandem widens the checkpoint to fp32; llama.cpp gets f32 weights and, with
  the default --llama-kv f32, an f32 KV cache). Half-width weights on both sides:
  --gguf-type f16 --llama-kv f16 --tandem-weights bf16 (Tandem's products still sum in fp32).

  The speed model is a random Qwen3 checkpoint (seeded normal weights, std 0.02, norms 1, fp32
  safetensors; hidden 768, 12 layers, 12 query / 4 KV heads of 64, MLP 2048, untied head,
  vocab of the bundled tokenizer: 81.8M parameters), written under the work directory, or the
  checkpoint named by --model.

  Agreement: greedy token ids of both engines for --agree-tokens tokens on the held-out prompts
  of `tandem bench modes` (models/tandem-target/fixtures/bench_prompts.json) with the bundled
  models/tandem-target converted to GGUF, and on the speed model's prompt (from the speed
  rounds). Prompt ids come from tokenizer.json through the `tokenizers` package; their count is
  checked against the prompt_tokens Tandem reports (a difference is an error), and they are
  compared with llama.cpp's own tokenizer (reported). A generation that stops at an EOS token is
  compared up to it.

How to run (from the repository root, with Tandem built in build/):
  python3 tools/bench/llamacpp_peer.py              # 5 rounds, 128 tokens, 1 and 2 threads
  python3 tools/bench/llamacpp_peer.py --rounds 2 --tokens 64 --json
  python3 tools/bench/llamacpp_peer.py --model DIR --threads 4   # an existing checkpoint
  python3 tools/bench/llamacpp_peer.py --work DIR    # keep the checkpoint and GGUFs in DIR
  python3 tools/bench/llamacpp_peer.py --gguf-type f16 --llama-kv f16 --tandem-weights bf16
Progress goes to stderr; the table (or the JSON object) to stdout. The machine should be
otherwise idle: the two engines run one after the other, and the ratio of each round pairs
runs a few seconds apart.

What it needs
  Python 3.11+, a C/C++ compiler and CMake (llama-cpp-python is compiled from source, with
  -march=native), access to PyPI, and build/services/cli/tandem (--tandem to change). On first
  use it creates the virtualenv --venv (default .venv-peer at the repository root) with pinned
  llama-cpp-python, gguf, numpy, safetensors and tokenizers, building llama-cpp-python under
  `nice -n 19` with CMAKE_BUILD_PARALLEL_LEVEL = the core count (several minutes on 2 cores),
  then re-executes itself inside it; later runs reuse it. The GGUF converter is to_gguf.py
  beside this file.

Exit status: 0 when every step ran (agreement below n of n is reported, not an error), 1 on any
failure (a failed build, conversion, engine run, tokenisation mismatch with Tandem, or a
timing that cannot be computed). No method is ever replaced by another.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINNED = [
    "llama-cpp-python==0.3.36",
    "gguf==0.19.0",
    "numpy==2.4.6",
    "safetensors==0.8.0",
    "tokenizers==0.23.3",
]
MARKER = "tandem-peer-requirements.txt"  # in the venv: the pins it was built with
UNSTABLE_SPREAD = 1.25  # max / min of an engine's rate over rounds above which to warn
DEFAULT_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'

# The random speed model (see the docstring); vocab_size comes from the tokenizer.
RANDOM_SHAPE = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
}


class BenchError(Exception):
    """A step failed; the benchmark exits 1."""


def log(message: str) -> None:
    print(f"[llamacpp_peer] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Virtualenv


def in_venv(venv: Path) -> bool:
    return Path(sys.prefix).resolve() == venv.resolve()


def ensure_venv_and_reexec(venv: Path) -> None:
    """Creates / completes the virtualenv, then replaces this process with itself inside it."""
    python = venv / "bin" / "python"
    if not python.exists():
        log(f"creating virtualenv {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    marker = venv / MARKER
    wanted = "\n".join(PINNED) + "\n"
    if not marker.exists() or marker.read_text() != wanted:
        cores = os.cpu_count() or 1
        log(f"installing {' '.join(PINNED)} into {venv} (llama-cpp-python is compiled from "
            f"the sdist with {cores} jobs under nice -n 19; this takes several minutes)")
        env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(cores))
        start = time.monotonic()
        subprocess.run(
            ["nice", "-n", "19", str(python), "-m", "pip", "install", "--no-binary",
             "llama-cpp-python", *PINNED],
            check=True, env=env, stdout=sys.stderr)  # stdout stays clean for --json
        log(f"install took {time.monotonic() - start:.0f} s")
        marker.write_text(wanted)
    env = dict(os.environ, TANDEM_PEER_VENV=str(venv.resolve()))
    os.execve(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]], env)


# ---------------------------------------------------------------------------------------------
# Checkpoints


def tokenizer_vocab_size(tokenizer_json: Path) -> int:
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1


def make_random_checkpoint(out: Path, tokenizer_dir: Path, seed: int) -> int:
    """Writes a random Qwen3 checkpoint into `out` (reused when present); returns its params."""
    import numpy as np
    from safetensors.numpy import save_file

    vocab = tokenizer_vocab_size(tokenizer_dir / "tokenizer.json")
    base = json.loads((tokenizer_dir / "config.json").read_text())
    eos = base.get("eos_token_id")
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        **RANDOM_SHAPE,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
        "tandem_peer_seed": seed,
    }
    h, inter = config["hidden_size"], config["intermediate_size"]
    d = config["head_dim"]
    q_out = config["num_attention_heads"] * d
    kv_out = config["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q_out, h),
            p + "self_attn.k_proj.weight": (kv_out, h),
            p + "self_attn.v_proj.weight": (kv_out, h),
            p + "self_attn.o_proj.weight": (h, q_out),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        })
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (vocab, h)
    params = sum(int(np.prod(s)) for s in shapes.values())

    config_path, weights_path = out / "config.json", out / "model.safetensors"
    if (config_path.exists() and weights_path.exists()
            and json.loads(config_path.read_text()) == config):
        log(f"reusing the random checkpoint in {out}")
        return params
    log(f"writing a random Qwen3 checkpoint ({params / 1e6:.1f}M parameters, seed {seed}) "
        f"to {out}")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            tensors[name] = np.ones(shapes[name], dtype=np.float32)
        else:
            tensors[name] = rng.standard_normal(shapes[name], dtype=np.float32) * np.float32(0.02)
    save_file(tensors, str(weights_path), metadata={"format": "pt"})
    shutil.copyfile(tokenizer_dir / "tokenizer.json", out / "tokenizer.json")
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return params


def checkpoint_shape(model_dir: Path) -> str:
    c = json.loads((model_dir / "config.json").read_text())
    heads = c["num_attention_heads"]
    return (f"hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, {heads} / "
            f"{c.get('num_key_value_heads') or heads} heads of "
            f"{c.get('head_dim') or c['hidden_size'] // heads}, MLP {c['intermediate_size']}, "
            f"vocab {c['vocab_size']}, {'tied' if c.get('tie_word_embeddings') else 'untied'} head")


def checkpoint_params(model_dir: Path) -> int:
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for dim in info["shape"]:
                    n *= dim
                total += n
    return total


def eos_ids(model_dir: Path) -> set[int]:
    """EOS ids Tandem stops on: config.json's plus generation_config.json's."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = model_dir / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(v) for v in value)
    return ids


def to_gguf(model_dir: Path, out: Path, weight_type: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import to_gguf as converter

    try:
        summary = converter.convert(model_dir, out, weight_type)
    except converter.ConversionError as error:
        raise BenchError(f"GGUF conversion of {model_dir}: {error}") from error
    log(f"converted {model_dir} -> {out.name} ({summary['tensors']} tensors, {weight_type})")
    return summary


# ---------------------------------------------------------------------------------------------
# Engines


class Tandem:
    def __init__(self, binary: Path, cpu_weights: str = "f32"):
        if not os.access(binary, os.X_OK):
            raise BenchError(f"{binary} is not an executable (build Tandem first, or --tandem)")
        self.binary = binary
        self.cpu_weights = cpu_weights

    def version(self) -> str:
        done = subprocess.run([str(self.binary), "version"], capture_output=True, text=True)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 else "unknown"

    def generate(self, model_dir: Path, prompt: str, max_tokens: int, threads: int) -> dict:
        """One `tandem generate --json` run (greedy, mode ar)."""
        cmd = [str(self.binary), "generate", "--model", str(model_dir), f"--prompt={prompt}",
               "--mode", "ar", "--temperature", "0", "--max-tokens", str(max_tokens),
               "--threads", str(threads), "--cpu-weights", self.cpu_weights, "--json"]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise BenchError(f"tandem generate exited {done.returncode}: {done.stderr.strip()}")
        try:
            result = json.loads(done.stdout)
        except json.JSONDecodeError as error:
            raise BenchError(f"tandem generate printed no JSON: {done.stdout[:200]!r}") from error
        if result.get("mode") != "ar" or not result.get("lossless", False):
            raise BenchError(f"tandem generate ran mode {result.get('mode')!r}, expected ar")
        return result


class LlamaCpp:
    """A llama.cpp context on one GGUF at one thread count; greedy decode by argmax."""

    def __init__(self, gguf_path: Path, threads: int, n_ctx: int, kv_type: str):
        import llama_cpp
        import numpy as np

        self._llama_cpp, self._np = llama_cpp, np
        kv = {"f32": llama_cpp.GGML_TYPE_F32, "f16": llama_cpp.GGML_TYPE_F16}[kv_type]
        self.llm = llama_cpp.Llama(
            model_path=str(gguf_path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
            n_batch=max(512, n_ctx), logits_all=False, flash_attn=False, type_k=kv, type_v=kv,
            n_gpu_layers=0, verbose=False)
        self.n_vocab = self.llm.n_vocab()

    def _argmax(self) -> int:
        logits = self._np.ctypeslib.as_array(
            self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
        return int(logits.argmax())

    def generate(self, prompt_ids: list[int], max_tokens: int,
                 stop_ids: set[int] | None = None) -> dict:
        """Prompt forward, then single-token forwards; times the two phases separately."""
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(prompt_ids)
        token = self._argmax()
        prefill_end = time.perf_counter()
        tokens = [token]
        while len(tokens) < max_tokens and not (stop_ids and token in stop_ids):
            self.llm.eval([token])
            token = self._argmax()
            tokens.append(token)
        end = time.perf_counter()
        return {"tokens": tokens, "prefill_s": prefill_end - start, "decode_s": end - prefill_end}

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)


# ---------------------------------------------------------------------------------------------
# Measurements


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def tandem_round(tandem: Tandem, model: Path, prompt: str, n: int, threads: int) -> dict:
    full = tandem.generate(model, prompt, n, threads)
    got = full["completion_tokens"]
    first_s = full.get("first_token_seconds", 0.0)
    decode_s = full["seconds"] - first_s
    if got < 2 or first_s <= 0 or decode_s <= 0:
        raise BenchError(f"tandem: no decode time ({got} tokens in {full['seconds']:.4f} s, "
                         f"the first after {first_s:.4f} s)")
    return {"tokens": full["tokens"], "n": got, "finish": full["finish_reason"],
            "prompt_tokens": full["prompt_tokens"], "seconds": full["seconds"],
            "prefill_s": first_s, "decode_tok_s": (got - 1) / decode_s,
            "e2e_tok_s": got / full["seconds"]}


def llama_round(llm: LlamaCpp, prompt_ids: list[int], n: int) -> dict:
    out = llm.generate(prompt_ids, n)
    got = len(out["tokens"])
    if got != n or out["decode_s"] <= 0:
        raise BenchError(f"llama.cpp decoded {got} of {n} tokens")
    return {"tokens": out["tokens"], "n": got, "prefill_s": out["prefill_s"],
            "decode_tok_s": (got - 1) / out["decode_s"],
            "e2e_tok_s": got / (out["prefill_s"] + out["decode_s"])}


def compare(a: list[int], b: list[int], stop_ids: set[int]) -> dict:
    """Exact agreement of two greedy generations, each cut after its first stop token."""
    def cut(ids: list[int]) -> list[int]:
        for i, t in enumerate(ids):
            if t in stop_ids:
                return ids[:i + 1]
        return ids
    a, b = cut(a), cut(b)
    prefix = 0
    while prefix < min(len(a), len(b)) and a[prefix] == b[prefix]:
        prefix += 1
    return {"match": a == b, "common_prefix": prefix, "len_tandem": len(a), "len_llama": len(b)}


def run_speed(args, tandem: Tandem, model: Path, gguf_path: Path, prompt_ids: list[int]) -> dict:
    n_ctx = len(prompt_ids) + args.tokens + 64
    engines = {t: LlamaCpp(gguf_path, t, n_ctx, args.llama_kv) for t in args.threads}
    llama_ids_same = engines[args.threads[0]].tokenize(args.prompt) == prompt_ids
    log("warm-up: one short run of each engine per thread count")
    for t in args.threads:
        tandem.generate(model, args.prompt, 8, t)
        engines[t].generate(prompt_ids, 8)
    rows: dict[int, list[dict]] = {t: [] for t in args.threads}
    for r in range(args.rounds):
        order = ("tandem", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "tandem")
        for t in args.threads:
            result = {}
            for engine in order:
                if engine == "tandem":
                    result[engine] = tandem_round(tandem, model, args.prompt, args.tokens, t)
                else:
                    result[engine] = llama_round(engines[t], prompt_ids, args.tokens)
            tm, ll = result["tandem"], result["llama.cpp"]
            if tm["prompt_tokens"] != len(prompt_ids):
                raise BenchError(f"tandem saw {tm['prompt_tokens']} prompt tokens, tokenizers "
                                 f"gave {len(prompt_ids)}")
            rows[t].append({"round": r, "order": list(order), "tandem": tm, "llama.cpp": ll})
            log(f"round {r + 1}/{args.rounds} threads {t}: tandem {tm['decode_tok_s']:.1f} "
                f"decode tok/s ({tm['n']} tokens), llama.cpp {ll['decode_tok_s']:.1f} "
                f"({ll['n']} tokens), ratio {tm['decode_tok_s'] / ll['decode_tok_s']:.3f}")
    del engines

    per_threads = {}
    stop = eos_ids(model)
    for t, rounds in rows.items():
        summary = {}
        for metric in ("decode_tok_s", "e2e_tok_s"):
            tm = [x["tandem"][metric] for x in rounds]
            ll = [x["llama.cpp"][metric] for x in rounds]
            summary[metric] = {"tandem": spread(tm), "llama.cpp": spread(ll),
                               "ratio": spread([a / b for a, b in zip(tm, ll)])}
        summary["tokens"] = {"tandem": sorted({x["tandem"]["n"] for x in rounds}),
                             "llama.cpp": sorted({x["llama.cpp"]["n"] for x in rounds})}
        summary["unstable"] = [
            engine for engine in ("tandem", "llama.cpp")
            if summary["decode_tok_s"][engine]["max"]
            > UNSTABLE_SPREAD * summary["decode_tok_s"][engine]["min"]]
        summary["tandem_prefill_s"] = spread([x["tandem"]["prefill_s"] for x in rounds])
        summary["llama_prefill_s"] = spread([x["llama.cpp"]["prefill_s"] for x in rounds])
        per_threads[str(t)] = summary

    # Agreement on this prompt: every run of an engine must give the same ids; then compare.
    tandem_ids = {tuple(x["tandem"]["tokens"]) for rs in rows.values() for x in rs}
    llama_ids = {tuple(x["llama.cpp"]["tokens"]) for rs in rows.values() for x in rs}
    agreement = compare(list(next(iter(tandem_ids))), list(next(iter(llama_ids))), stop)
    agreement.update({"tandem_distinct_outputs": len(tandem_ids),
                      "llama_distinct_outputs": len(llama_ids),
                      "tandem_tokens": list(next(iter(tandem_ids))),
                      "llama_tokens": list(next(iter(llama_ids)))})
    return {"per_threads": per_threads, "per_round": {str(t): rs for t, rs in rows.items()},
            "agreement": agreement, "llama_tokenizer_same": llama_ids_same}


def run_agreement(args, tandem: Tandem, target: Path, gguf_path: Path, tokenizer) -> dict:
    prompts_file = Path(args.prompts_file or target / "fixtures" / "bench_prompts.json")
    prompts = []
    for category, items in json.loads(prompts_file.read_text())["categories"].items():
        for i, item in enumerate(items):
            prompts.append((f"{category}/{i}", item["text"], item.get("prompt_tokens")))
    threads = max(args.threads)
    longest = max(len(tokenizer.encode(text, add_special_tokens=False).ids)
                  for _, text, _ in prompts)
    llm = LlamaCpp(gguf_path, threads, longest + args.agree_tokens + 64, args.llama_kv)
    stop = eos_ids(target)
    results = []
    for name, text, fixture_count in prompts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        tm = tandem.generate(target, text, args.agree_tokens, threads)
        if tm["prompt_tokens"] != len(ids):
            raise BenchError(f"{name}: tandem saw {tm['prompt_tokens']} prompt tokens, "
                             f"tokenizers gave {len(ids)}")
        ll = llm.generate(ids, args.agree_tokens, stop)
        row = compare(tm["tokens"], ll["tokens"], stop)
        row.update({"prompt": name, "prompt_tokens": len(ids),
                    "fixture_prompt_tokens": fixture_count,
                    "llama_tokenizer_same": llm.tokenize(text) == ids,
                    "tandem_tokens": tm["tokens"], "llama_tokens": ll["tokens"]})
        results.append(row)
    del llm
    return {
        "prompts_file": str(prompts_file),
        "threads": threads,
        "tokens": args.agree_tokens,
        "matches": sum(r["match"] for r in results),
        "prompts": len(results),
        "llama_tokenizer_same": sum(r["llama_tokenizer_same"] for r in results),
        "fixture_count_same": sum(r["fixture_prompt_tokens"] in (None, r["prompt_tokens"])
                                  for r in results),
        "results": results,
    }


# ---------------------------------------------------------------------------------------------
# Report


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def environment(tandem: Tandem) -> dict:
    import importlib.metadata as md

    import llama_cpp

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    return {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "tandem": tandem.version(),
        "packages": {p.split("==")[0]: md.version(p.split("==")[0]) for p in PINNED},
        "llama_cpp_system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "load_average_start": load_average(),
    }


def fmt(s: dict, digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def print_report(report: dict) -> None:
    env = report["environment"]
    print(f"command:   {env['command']}")
    print(f"cpu:       {env['cpu']} ({env['cores']} cores)")
    print(f"versions:  {env['tandem']}; python {env['python']}; "
          + ", ".join(f"{k} {v}" for k, v in env["packages"].items()))
    print(f"llama.cpp: {env['llama_cpp_system_info']}")
    print(f"load avg:  {env['load_average_start']} at the start, {env['load_average_end']} at "
          "the end (1, 5, 15 min; anything else running skews the timings)")
    s = report["speed"]
    print(f"\nspeed model: {s['model']}: {s['shape']}; {s['parameters'] / 1e6:.1f}M "
          f"parameters; GGUF {s['gguf_type']}, llama.cpp KV cache {s['llama_kv']}, "
          f"Tandem weights {s['tandem_weights']}")
    print(f"prompt {s['prompt_tokens']} tokens (llama.cpp's tokenizer "
          f"{'agrees' if s['llama_tokenizer_same'] else 'DIFFERS'}), {s['tokens']} new tokens, "
          f"{s['rounds']} paired rounds, engine order alternating")
    header = (f"{'threads':>7}  {'metric':<6}  {'tandem tok/s':>22}  {'llama.cpp tok/s':>22}  "
              f"{'tandem/llama.cpp':>22}")
    print(header)
    print("-" * len(header))
    for t, row in s["per_threads"].items():
        for metric, label in (("decode_tok_s", "decode"), ("e2e_tok_s", "e2e")):
            m = row[metric]
            print(f"{t:>7}  {label:<6}  {fmt(m['tandem']):>22}  {fmt(m['llama.cpp']):>22}  "
                  f"{fmt(m['ratio'], 3):>22}")
        if row["unstable"]:
            print(f"{'':>7}  WARNING: {' and '.join(row['unstable'])} decode rates vary more "
                  f"than {UNSTABLE_SPREAD}x over rounds: the machine was busy; rerun when idle")
        counts = row["tokens"]
        if counts["tandem"] != [s["tokens"]] or counts["llama.cpp"] != [s["tokens"]]:
            print(f"{'':>7}  tokens decoded: tandem {counts['tandem']}, "
                  f"llama.cpp {counts['llama.cpp']}")
    print("median [min-max] over rounds; ratio = per-round Tandem / llama.cpp. decode: tokens "
          "after the first / their time (Tandem: from its first_token_seconds); e2e: "
          "n / (prompt forward + decode), Tandem's stats-line definition.")
    a = s["agreement"]
    print(f"speed-model agreement ({s['tokens']} tokens): "
          f"{'identical' if a['match'] else 'differ'}, common prefix {a['common_prefix']} "
          f"(tandem {a['len_tandem']}, llama.cpp {a['len_llama']} tokens; distinct outputs "
          f"over runs: tandem {a['tandem_distinct_outputs']}, llama.cpp "
          f"{a['llama_distinct_outputs']})")
    g = report.get("agreement")
    if g:
        print(f"\nagreement on {g['prompts_file']} with {report['target']} "
              f"({g['tokens']} greedy tokens, {g['threads']} threads): "
              f"{g['matches']} of {g['prompts']} identical; llama.cpp's tokenizer gives the "
              f"same prompt ids on {g['llama_tokenizer_same']} of {g['prompts']}")
        for r in g["results"]:
            if not r["match"]:
                print(f"  {r['prompt']}: differ after {r['common_prefix']} tokens "
                      f"(tandem {r['len_tandem']}, llama.cpp {r['len_llama']} tokens)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Peer benchmark against llama.cpp (see the module docstring).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-peer",
                        help="virtualenv with the pinned packages (created if missing)")
    parser.add_argument("--tandem", type=Path, default=REPO / "build/services/cli/tandem",
                        help="the tandem CLI binary")
    parser.add_argument("--model", type=Path, help="Qwen3 checkpoint for the speed runs "
                        "(default: a random 81.8M-parameter one under the work directory)")
    parser.add_argument("--target", type=Path, default=REPO / "models/tandem-target",
                        help="checkpoint for the agreement on the held-out prompts")
    parser.add_argument("--prompts-file", type=Path,
                        help="held-out prompts (default: <target>/fixtures/bench_prompts.json)")
    parser.add_argument("--work", type=Path,
                        help="keep the random checkpoint and GGUF files here (reused across "
                        "runs); default: a temporary directory removed at exit")
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per speed run")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="speed-run prompt")
    parser.add_argument("--agree-tokens", type=int, default=32,
                        help="greedy tokens compared per held-out prompt")
    parser.add_argument("--gguf-type", choices=("f32", "f16"), default="f32",
                        help="GGUF matrix weights (norms stay f32)")
    parser.add_argument("--llama-kv", choices=("f32", "f16"), default="f32",
                        help="llama.cpp KV cache type (Tandem's is fp32)")
    parser.add_argument("--tandem-weights", choices=("f32", "bf16"), default="f32",
                        help="Tandem's CPU weights (`tandem generate --cpu-weights`)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random checkpoint")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        parser.error("--threads takes comma-separated integers")
    if not args.threads or min(args.threads) < 1:
        parser.error("--threads must name positive thread counts")
    if args.rounds < 1 or args.tokens < 2 or args.agree_tokens < 1:
        parser.error("--rounds >= 1, --tokens >= 2 and --agree-tokens >= 1 are required")
    return args


def main() -> int:
    args = parse_args(sys.argv[1:])
    if not in_venv(args.venv):
        if os.environ.get("TANDEM_PEER_VENV"):
            raise BenchError(f"re-executed into {args.venv} but sys.prefix is {sys.prefix}")
        ensure_venv_and_reexec(args.venv)  # does not return

    from tokenizers import Tokenizer

    tandem = Tandem(args.tandem.resolve(), args.tandem_weights)
    env = environment(tandem)
    temp = None
    if args.work is None:
        temp = tempfile.TemporaryDirectory(prefix="tandem-llamacpp-peer-")
        work = Path(temp.name)
    else:
        work = args.work.resolve()
        work.mkdir(parents=True, exist_ok=True)
    try:
        target = args.target.resolve()
        if args.model is None:
            model = work / "random-qwen3"
            params = make_random_checkpoint(model, target, args.seed)
        else:
            model = args.model.resolve()
            params = checkpoint_params(model)
        speed_gguf = work / f"{model.name}.{args.gguf_type}.gguf"
        to_gguf(model, speed_gguf, args.gguf_type)
        target_gguf = work / f"{target.name}.{args.gguf_type}.gguf"
        if target != model:
            if target_gguf == speed_gguf:
                target_gguf = work / f"target-{target.name}.{args.gguf_type}.gguf"
            to_gguf(target, target_gguf, args.gguf_type)

        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=False).ids
        log(f"speed: {args.rounds} rounds x threads {args.threads}, {args.tokens} tokens, "
            f"prompt {len(prompt_ids)} tokens")
        speed = run_speed(args, tandem, model, speed_gguf, prompt_ids)
        speed.update({"model": str(model) if args.model else f"random Qwen3 (seed {args.seed})",
                      "parameters": params, "shape": checkpoint_shape(model),
                      "gguf_type": args.gguf_type, "tandem_weights": args.tandem_weights,
                      "llama_kv": args.llama_kv, "prompt": args.prompt,
                      "prompt_tokens": len(prompt_ids), "tokens": args.tokens,
                      "rounds": args.rounds})
        log(f"agreement: held-out prompts, {args.agree_tokens} tokens")
        target_tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
        agreement = run_agreement(args, tandem, target, target_gguf, target_tokenizer)
        env["load_average_end"] = load_average()
        report = {"environment": env, "target": str(target), "speed": speed,
                  "agreement": agreement}
    finally:
        if temp is not None:
            temp.cleanup()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BenchError, subprocess.CalledProcessError) as error:
        print(f"llamacpp_peer: error: {error}", file=sys.stderr)
        sys.exit(1)
