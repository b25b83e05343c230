#!/usr/bin/env python3
"""Measures the decode speed of the peer a user would otherwise run: Hugging Face transformers'
Qwen3 (`Qwen3ForCausalLM`), batch 1, greedy, with a static KV cache.

The model has random bf16 weights (normal, std 0.02; norms 1; seeded) in a given shape, built
directly on the target device (`from_config` under `with torch.device(...)`, no CPU copy).
A prompt of --context random token ids is prefilled into a `transformers.StaticCache` sized
for the prompt, the decode steps and a margin; the prefill's argmax is the first generated
token. Then --tokens decode steps run: each is the forward of one token at the next position,
an argmax on the device, and the argmax fed back as the next input, with no host
synchronisation inside the timed loop. The timed run starts at position --context (the cache
is reset and the prompt prefilled again after the warmup).

Methods (one decode step each):
  graph    the step (forward, argmax, argmax copied into the input buffer) captured once in a
           torch.cuda.CUDAGraph and replayed; CUDA only. transformers 5.17 keeps the cache
           position in a device tensor inside each StaticCache layer (`cumulative_length`,
           advanced in place by every update), so each replay writes the next slot and the
           captured graph needs no position input.
  compile  the step under torch.compile (mode "reduce-overhead" on CUDA, i.e. inductor with
           CUDA graphs; "default" on CPU; fullgraph unless --no-fullgraph).
  eager    a plain Python loop over the step.
A failing method is reported as an error (exit 1), never replaced by another.

It also measures the device's copy bandwidth (`dst.copy_(src)` of a 1 GiB bf16 tensor on CUDA,
256 MiB on CPU; median of 10 after 3 warmups; bytes read plus bytes written), so the decode's
weight bandwidth (bytes of every parameter a step reads / step time) can be given as a fraction
of what the memory system delivers. The input embedding table is not counted (one row of it
is read); the untied LM head is. KV cache reads are not counted.

--check verifies the generated tokens against references on the same weights and prompt:
transformers' own `generate(do_sample=False)` with a dynamic cache (exact agreement is
reported), and one forward of the prompt plus the generated tokens without a cache
(teacher-forced): every generated token must be the reference's argmax, or within a small
tolerance of its maximum logit (bf16 near-ties can flip between kernels). Exit 1 otherwise.

Run (GPU): python3 tools/bench/torch_peer.py --json
     (CPU): python3 tools/bench/torch_peer.py --shape tiny --device cpu --method eager --check
Output: one JSON object on stdout with --json (logs on stderr), else a short table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

SHAPES = {
    # Qwen3-8B (config.json of Qwen/Qwen3-8B).
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                     vocab_size=151936, tie_word_embeddings=False, rms_norm_eps=1e-6,
                     rope_theta=1e6, max_position_embeddings=40960),
    # A small Qwen3 for tests on a CPU.
    "tiny": dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, intermediate_size=512, vocab_size=1024,
                 tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=4096),
}
CACHE_MARGIN = 16          # extra static-cache slots beyond the prompt and the decode steps
FIRST_TOKENS = 16          # generated token ids reported (and checked with --check)
COPY_BYTES = {"cuda": 1 << 30, "cpu": 256 << 20}
COPY_WARMUP, COPY_REPEATS = 3, 10
CHECK_TOLERANCE = 0.1      # of the reference logits' standard deviation (near-tie allowance)
INIT_STD = 0.02
_T0 = time.perf_counter()


class BenchError(RuntimeError):
    """A failure with a message meant for the report as it is."""


class Terminated(BaseException):
    """SIGTERM arrived (the caller's timeout): report what was measured so far."""


def log(message: str) -> None:
    print(f"[torch_peer {time.perf_counter() - _T0:7.1f}s] {message}", file=sys.stderr,
          flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Decode speed of transformers' Qwen3 (random bf16 weights, batch 1).")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=128, help="timed decode steps")
    parser.add_argument("--method", choices=["graph", "compile", "eager"], default=None,
                        help="default: graph on cuda, eager on cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="stop before the timed loop when setup + warmup took longer")
    parser.add_argument("--check", action="store_true",
                        help="verify the generated tokens against transformers' references")
    parser.add_argument("--warmup-steps", type=int, default=4,
                        help="untimed decode steps before the timed run (default 4)")
    parser.add_argument("--compile-mode", default=None,
                        help='torch.compile mode (default: "reduce-overhead" on cuda, '
                             '"default" on cpu)')
    parser.add_argument("--no-fullgraph", action="store_true",
                        help="torch.compile without fullgraph=True")
    args = parser.parse_args(argv)
    if args.method is None:
        args.method = "graph" if args.device == "cuda" else "eager"
    if args.compile_mode is None:
        args.compile_mode = "reduce-overhead" if args.device == "cuda" else "default"
    return args


def validate(args: argparse.Namespace) -> None:
    if args.context < 1 or args.tokens < 1 or args.warmup_steps < 1:
        raise BenchError("--context, --tokens and --warmup-steps must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"--device cuda but torch {torch.__version__} sees no CUDA device "
                         f"(torch.version.cuda={torch.version.cuda})")
    if args.method == "graph" and args.device != "cuda":
        raise BenchError("--method graph needs --device cuda (torch.cuda.CUDAGraph)")
    if not hasattr(transformers, "StaticCache"):
        raise BenchError(f"transformers {transformers.__version__} has no StaticCache")


# ---------------------------------------------------------------------------------------------
# Timing helpers


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Wall time of a region on the device: CUDA events on CUDA, perf_counter on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = float("nan")

    def __enter__(self) -> "Timer":
        if self.device.type == "cuda":
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            return
        if self.device.type == "cuda":
            self.end.record()
            self.end.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.start


def copy_bandwidth_gbs(device: torch.device) -> float:
    """dst.copy_(src) of a bf16 tensor: median (bytes read + bytes written) / time, in GB/s."""
    nbytes = COPY_BYTES[device.type]
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).fill_(1.5)
    dst = torch.empty_like(src).fill_(0.5)
    times = []
    for i in range(COPY_WARMUP + COPY_REPEATS):
        with Timer(device) as timer:
            dst.copy_(src)
        if i >= COPY_WARMUP:
            times.append(timer.seconds)
    del src, dst
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times) / 1e9


# ---------------------------------------------------------------------------------------------
# Model


def make_config(shape_name: str, min_positions: int) -> transformers.PretrainedConfig:
    shape = dict(SHAPES[shape_name])
    shape["max_position_embeddings"] = max(shape["max_position_embeddings"], min_positions)
    rope_theta = shape.pop("rope_theta")
    common = dict(shape, hidden_act="silu", attention_bias=False, use_sliding_window=False,
                  initializer_range=INIT_STD, use_cache=True)
    try:  # transformers >= 5: RoPE settings live in rope_parameters
        config = transformers.Qwen3Config(
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, **common)
    except TypeError:  # older releases take rope_theta directly
        config = transformers.Qwen3Config(rope_theta=rope_theta, **common)
    got_theta = (getattr(config, "rope_parameters", None) or {}).get(
        "rope_theta", getattr(config, "rope_theta", None))
    if got_theta != rope_theta:
        raise BenchError(f"config ignored rope_theta={rope_theta} (got {got_theta})")
    return config


def shape_report(config, shape_name: str) -> dict:
    report = {"name": shape_name}
    for key in SHAPES[shape_name]:
        if key == "rope_theta":
            params = getattr(config, "rope_parameters", None) or {}
            report[key] = params.get("rope_theta", getattr(config, "rope_theta", None))
        else:
            report[key] = getattr(config, key)
    return report


def build_model(config, device: torch.device, seed: int):
    """Qwen3ForCausalLM with random bf16 weights initialised on `device`."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    model.requires_grad_(False)
    check_weights(model, device)
    return model


def check_weights(model, device: torch.device) -> None:
    params = list(model.named_parameters())
    wrong = [name for name, p in params if p.device.type != device.type
             or p.dtype != torch.bfloat16]
    if wrong:
        raise BenchError(f"parameters not bf16 on {device}: {wrong[:5]}")
    elsewhere = [name for name, b in model.named_buffers() if b.device.type != device.type]
    if elsewhere:  # a host buffer would mean a host-to-device copy in every step
        raise BenchError(f"buffers not on {device}: {elsewhere[:5]}")
    with torch.no_grad():
        amax = torch.stack([p.detach().abs().amax().float() for _, p in params]).cpu()
        std = model.lm_head.weight[:4096].float().std().item()
    zero = [name for (name, _), m in zip(params, amax.tolist()) if not m > 0]
    if zero:
        raise BenchError(f"parameters left at zero (not initialised): {zero[:5]}")
    if not 0.5 * INIT_STD < std < 2 * INIT_STD:
        raise BenchError(f"lm_head weight std {std:.4g}, expected about {INIT_STD}")


def weight_bytes_per_step(model) -> int:
    """Bytes of every parameter a decode step reads: all but the input embedding table."""
    embed = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if model.lm_head.weight is embed:
        raise BenchError("the LM head is tied to the input embeddings; expected untied")
    return total - embed.numel() * embed.element_size()


def random_prompt(config, context: int, seed: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (1, context), generator=generator)
    return ids.to(device)


# ---------------------------------------------------------------------------------------------
# Decoding with a static cache


def new_static_cache(model, max_cache_len: int):
    cache = transformers.StaticCache(config=model.config, max_cache_len=max_cache_len)
    if not all(hasattr(layer, "cumulative_length") for layer in cache.layers):
        raise BenchError(f"transformers {transformers.__version__}: StaticCache layers have no "
                         "`cumulative_length` position tensor; this script expects the 5.x API")
    return cache


def prefill(model, cache, prompt: torch.Tensor) -> torch.Tensor:
    """Reset the cache, prefill the prompt; the (1, 1) argmax of its last position."""
    cache.reset()
    out = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return torch.argmax(out.logits[:, -1:, :], dim=-1)


def decode_step(model, cache, ids: torch.Tensor) -> torch.Tensor:
    """Forward of one token at the cache's next position; the (1, 1) argmax."""
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return torch.argmax(out.logits[:, -1:, :], dim=-1)


def cache_length(cache) -> int:
    """The cache's current length; it must be a tensor (a Python int would be frozen in a
    captured graph)."""
    length = cache.get_seq_length()
    if not isinstance(length, torch.Tensor):
        raise BenchError(f"StaticCache.get_seq_length() returned {type(length).__name__}, not "
                         "a tensor: the cache position is not on the device")
    return int(length.item())


def expect_cache_length(cache, expected: int, when: str) -> None:
    got = cache_length(cache)
    if got != expected:
        raise BenchError(f"cache length {got} {when}, expected {expected}")


class EagerStepper:
    """advance(): one decode step reading `ids` and writing the next token into it."""

    name = "eager"

    def __init__(self, model, cache, ids: torch.Tensor, args: argparse.Namespace):
        self.model, self.cache, self.ids = model, cache, ids

    def warm_up(self, steps: int) -> None:
        for _ in range(steps):
            self.advance()

    def advance(self) -> None:
        self.ids.copy_(decode_step(self.model, self.cache, self.ids))


class CompileStepper(EagerStepper):
    """The decode step under torch.compile; the prefill stays eager."""

    name = "compile"

    def __init__(self, model, cache, ids: torch.Tensor, args: argparse.Namespace):
        super().__init__(model, cache, ids, args)
        self.mode, self.fullgraph = args.compile_mode, not args.no_fullgraph
        try:  # say on stderr why CUDA graphs were skipped and why anything recompiled
            torch._logging.set_logs(perf_hints=True, recompiles=True)
        except (AttributeError, TypeError, ValueError) as error:
            log(f"torch._logging.set_logs failed ({error}); continuing without those logs")
        self.step = torch.compile(self._step, mode=self.mode, fullgraph=self.fullgraph)
        self.mark_step = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

    def _step(self, ids: torch.Tensor) -> torch.Tensor:
        return decode_step(self.model, self.cache, ids)

    def advance(self) -> None:
        if self.mark_step is not None:
            self.mark_step()  # the previous step's output is consumed: new cudagraph step
        self.ids.copy_(self.step(self.ids))


class GraphStepper(EagerStepper):
    """The decode step captured in a torch.cuda.CUDAGraph and replayed.

    The graph reads the static `ids` buffer, runs the forward (which writes K/V into the
    static cache at the position held in the cache's device tensors and advances them) and
    copies the argmax back into `ids`, so each replay is the next step.
    """

    name = "graph"

    def __init__(self, model, cache, ids: torch.Tensor, args: argparse.Namespace):
        super().__init__(model, cache, ids, args)
        self.graph = None

    def warm_up(self, steps: int) -> None:
        # Warm up on a side stream (lazy inits, cuBLAS / SDPA workspaces), then capture on it.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(steps):
                super().advance()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            # Recorded, not run: the cache position does not move during capture.
            next_ids = decode_step(self.model, self.cache, self.ids)
            self.ids.copy_(next_ids)
        torch.cuda.synchronize()
        self.graph, self.static_next = graph, next_ids  # keep the graph's output alive
        self.graph.replay()  # one replay before timing (its step is undone by the re-prefill)
        torch.cuda.synchronize()

    def advance(self) -> None:
        self.graph.replay()


STEPPERS = {"eager": EagerStepper, "compile": CompileStepper, "graph": GraphStepper}


def compile_counters() -> dict:
    """Inductor's cudagraph skips and dynamo's graph count, when torch exposes them."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    skips = dict(counters.get("inductor", {})).get("cudagraph_skips", 0)
    return {"compile_cudagraph_skips": skips,
            "compile_unique_graphs": dict(counters.get("stats", {})).get("unique_graphs", 0)}


# ---------------------------------------------------------------------------------------------
# Reference check


def check_tokens(model, prompt: torch.Tensor, tokens: list[int]) -> dict:
    """Compare `tokens` (the first generated ids) with transformers' references."""
    n = len(tokens)
    gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                         max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    generate_tokens = gen[0, prompt.shape[1]:].tolist()
    exact = 0
    while exact < n and generate_tokens[exact] == tokens[exact]:
        exact += 1
    # Teacher-forced: one forward of prompt + tokens[:-1]; position context-1+i predicts
    # tokens[i].
    full = torch.cat([prompt, torch.tensor([tokens[:-1]], device=prompt.device)], dim=1)
    logits = model(input_ids=full, use_cache=False, logits_to_keep=n).logits[0].float()
    chosen = logits.gather(1, torch.tensor(tokens, device=logits.device).view(n, 1))[:, 0]
    deficit = (logits.max(dim=1).values - chosen).cpu()
    tolerance = CHECK_TOLERANCE * logits.std().item()
    argmax_equal = sum(1 for d in deficit.tolist() if d == 0.0)
    bad = [i for i, d in enumerate(deficit.tolist()) if d > tolerance]
    return {
        "generate_tokens": generate_tokens,
        "generate_exact_prefix": exact,
        "teacher_forced_argmax_equal": argmax_equal,
        "teacher_forced_max_deficit": round(float(deficit.max()), 5),
        "teacher_forced_tolerance": round(tolerance, 5),
        "teacher_forced_bad_positions": bad,
        "distinct_tokens": len(set(tokens)),  # few: a random model repeating itself
        "passed": not bad,
    }


# ---------------------------------------------------------------------------------------------
# The run


def check_time(args: argparse.Namespace, elapsed: float, stage: str) -> None:
    if args.time_limit is not None and elapsed > args.time_limit:
        raise BenchError(f"time limit: {stage} took {elapsed:.1f} s, over --time-limit "
                         f"{args.time_limit:g} s; the timed loop did not run")


def run(args: argparse.Namespace, report: dict) -> int:
    validate(args)
    device = torch.device(args.device)
    report["device_name"] = (torch.cuda.get_device_name(device) if device.type == "cuda"
                             else "cpu")
    log(f"device {report['device_name']}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, method {args.method}")

    report["copy_bandwidth_gbs"] = round(copy_bandwidth_gbs(device), 2)
    log(f"copy bandwidth {report['copy_bandwidth_gbs']} GB/s")

    max_cache_len = args.context + max(args.tokens, args.warmup_steps) + CACHE_MARGIN
    config = make_config(args.shape, max_cache_len)
    report["shape"] = shape_report(config, args.shape)
    started = time.perf_counter()
    model = build_model(config, device, args.seed)
    synchronize(device)
    report["setup_seconds"] = round(time.perf_counter() - started, 3)
    report["parameters"] = sum(p.numel() for p in model.parameters())
    report["weight_bytes_per_step"] = weight_bytes_per_step(model)
    report["attn_implementation"] = model.config._attn_implementation
    report["max_cache_len"] = max_cache_len
    log(f"model built in {report['setup_seconds']} s: {report['parameters']:,} parameters, "
        f"{report['weight_bytes_per_step'] / 1e9:.3f} GB read per step, "
        f"attention {report['attn_implementation']}")
    check_time(args, report["setup_seconds"], "setup")

    with torch.no_grad():
        prompt = random_prompt(config, args.context, args.seed, device)
        tokens = decode(model, prompt, device, args, report, max_cache_len, started)
        if args.check:
            log("checking the first tokens against transformers' references")
            report["check"] = check_tokens(model, prompt, tokens[:FIRST_TOKENS])
            log(f"check: {json.dumps(report['check'])}")
            if not report["check"]["passed"]:
                raise BenchError("check failed: generated tokens at positions "
                                 f"{report['check']['teacher_forced_bad_positions']} are not "
                                 "(near-)greedy under the reference forward")
    return 0


def decode(model, prompt, device, args, report, max_cache_len: int, started: float):
    """Prefill, warm up, prefill again, time --tokens steps; the generated token ids."""
    cache = new_static_cache(model, max_cache_len)
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    stepper = STEPPERS[args.method](model, cache, ids, args)

    warm_start = time.perf_counter()
    ids.copy_(prefill(model, cache, prompt))
    expect_cache_length(cache, args.context, "after the prefill")
    log(f"warming up ({args.warmup_steps} steps, method {args.method})")
    stepper.warm_up(args.warmup_steps)
    synchronize(device)
    if args.method == "compile":
        report.update(compile_counters())
    report["warmup_seconds"] = round(time.perf_counter() - warm_start, 3)
    log(f"warmed up in {report['warmup_seconds']} s")
    check_time(args, time.perf_counter() - started, "setup + warmup")

    generated = torch.zeros(args.tokens + 1, dtype=torch.long, device=device)
    ids.copy_(prefill(model, cache, prompt))
    generated[0:1].copy_(ids[0])
    expect_cache_length(cache, args.context, "after the second prefill")
    with Timer(device) as timer:
        for i in range(1, args.tokens + 1):
            stepper.advance()
            generated[i:i + 1].copy_(ids[0])
    expect_cache_length(cache, args.context + args.tokens, "after the timed steps")
    fill_timing(report, timer.seconds, args.tokens)
    if device.type == "cuda":
        report["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    tokens = generated.tolist()
    report["first_tokens"] = tokens[:FIRST_TOKENS]
    log(f"{report['tokens_per_second']} tokens/s, step {report['step_seconds'] * 1e3:.3f} ms, "
        f"weights {report['weight_bandwidth_gbs']} GB/s")
    return tokens


def fill_timing(report: dict, seconds: float, tokens: int) -> None:
    step = seconds / tokens
    report["step_seconds"] = step
    report["tokens_per_second"] = round(1.0 / step, 2)
    report["weight_bandwidth_gbs"] = round(report["weight_bytes_per_step"] / step / 1e9, 2)
    report["bandwidth_efficiency"] = round(
        report["weight_bandwidth_gbs"] / report["copy_bandwidth_gbs"], 4)


# ---------------------------------------------------------------------------------------------
# Output


def initial_report(args: argparse.Namespace) -> dict:
    report = {
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "device_name": None,
        "shape": {"name": args.shape},
        "parameters": None,
        "weight_bytes_per_step": None,
        "method": args.method,
        "context": args.context,
        "tokens": args.tokens,
        "setup_seconds": None,
        "warmup_seconds": None,
        "step_seconds": None,
        "tokens_per_second": None,
        "weight_bandwidth_gbs": None,
        "copy_bandwidth_gbs": None,
        "bandwidth_efficiency": None,
        "first_tokens": None,
        "error": None,
        "warmup_steps": args.warmup_steps,
        "seed": args.seed,
    }
    if args.method == "compile":
        report["compile_mode"] = args.compile_mode
        report["compile_fullgraph"] = not args.no_fullgraph
    return report


def print_report(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report), flush=True)
        return
    rows = [(key, report.get(key)) for key in (
        "device_name", "torch_version", "transformers_version", "method", "context", "tokens",
        "parameters", "weight_bytes_per_step", "setup_seconds", "warmup_seconds",
        "step_seconds", "tokens_per_second", "weight_bandwidth_gbs", "copy_bandwidth_gbs",
        "bandwidth_efficiency", "first_tokens", "error")]
    rows.insert(0, ("shape", report["shape"].get("name")))
    if "check" in report:
        rows.append(("check_passed", report["check"]["passed"]))
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _on_sigterm(signum, frame):
    raise Terminated(f"terminated by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = initial_report(args)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        status = run(args, report)
    except (Exception, Terminated) as error:  # noqa: BLE001 (every failure goes to the report)
        traceback.print_exc(file=sys.stderr)
        report["error"] = f"{type(error).__name__}: {error}"
        status = 1
    print_report(report, args.json)
    return status


if __name__ == "__main__":
    sys.exit(main())
