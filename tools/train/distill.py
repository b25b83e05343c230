"""Distillation data for a separate drafter: the target's own greedy continuations.

A drafter is useful in proportion to how often its greedy draft equals the token the target
would emit (SimSD §3: the drafter is trained on the target's outputs, not on the raw corpus,
so that its drafts align with the verifier). This module

  - runs the target greedily, batched, with a KV cache (`greedy_continue`);
  - builds the distillation set: prompts of varied length cut from the train split at seeded
    offsets, each followed by the target's greedy continuation up to a fixed row length
    (`build_rows`), cached as an .npz file keyed by the target's weights and the settings;
  - samples training batches mixing distilled rows with raw train windows (`BatchSampler`);
  - measures alignment on held-out prompts (`alignment`): the fraction of positions where the
    drafter's greedy next token (AR) or its fully masked block draft (block diffusion) equals
    the target's greedy continuation.

    .venv/bin/python tools/train/distill.py models/tandem-drafter --target models/tandem-target

re-measures a drafter folder's alignment and stores it in its eval.json ("drafter").
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import data  # noqa: E402
import diffusion  # noqa: E402
from model import Qwen3LM  # noqa: E402


@dataclasses.dataclass(frozen=True)
class DistillSpec:
    """What the drafter is distilled from and how batches mix it with raw text."""

    target: str  # model folder, relative to the repository root
    rows: int  # distilled sequences
    # Prompt lengths (tokens, multiples of the block size so continuation blocks align with
    # the diffusion blocks) drawn uniformly per generation batch; the continuation fills the
    # row to seq_len + 1 tokens.
    prompt_lens: tuple[int, ...] = (16, 32, 48, 64)
    gen_batch: int = 64  # rows generated together
    raw_fraction: float = 0.25  # share of each training batch drawn from raw train windows
    seed: int = 11


# ---------------------------------------------------------------------------------------------
# Greedy generation with a KV cache.


def _layer_step(layer, x, cos, sin, cache, mask):
    """One decoder layer over new tokens x [B, T, H], appending their K/V to cache (a list
    [k, v] of [B, kv_heads, S, D] or None) and attending to cache + themselves."""
    attn = layer.self_attn
    h = layer.input_layernorm(x)
    b, t, _ = h.shape
    q = attn.q_norm(attn.q_proj(h).view(b, t, attn.num_heads, attn.head_dim)).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(b, t, attn.num_kv_heads, attn.head_dim)).transpose(1, 2)
    v = attn.v_proj(h).view(b, t, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    if cache[0] is not None:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    cache[0], cache[1] = k, v
    group = attn.num_heads // attn.num_kv_heads
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    y = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
    x = x + attn.o_proj(y.transpose(1, 2).reshape(b, t, attn.num_heads * attn.head_dim))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.no_grad()
def greedy_continue(model: Qwen3LM, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """int64 [B, new_tokens]: greedy continuations of equal-length prompts [B, P]. Matches
    argmax of a full causal forward at every step (tested), at O(P + new_tokens) cost/row."""
    b, p = prompts.shape
    caches = [[None, None] for _ in model.model.layers]
    out = torch.empty(b, new_tokens, dtype=torch.int64)
    x_ids, start = prompts, 0
    for i in range(new_tokens):
        t = x_ids.shape[1]
        positions = torch.arange(start, start + t).expand(b, t)
        cos, sin = model.rotary(positions)
        # New token j (absolute start + j) reads every cached key and the new keys <= itself.
        mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)
        x = model.model.embed_tokens(x_ids)
        for layer, cache in zip(model.model.layers, caches):
            x = _layer_step(layer, x, cos, sin, cache, mask)
        logits = model.lm_head(model.model.norm(x[:, -1:])).float()
        nxt = logits[:, -1].argmax(-1)
        out[:, i] = nxt
        start += t
        x_ids = nxt[:, None]
    return out


# ---------------------------------------------------------------------------------------------
# The distillation set.


def weights_digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()[:16]


def build_rows(model: Qwen3LM, stream: np.ndarray, spec: DistillSpec, row_len: int,
               log=print) -> tuple[np.ndarray, np.ndarray]:
    """(rows int32 [n, row_len], prompt_len int32 [n]): train-split prompts at seeded offsets,
    each followed by the target's greedy continuation."""
    rng = np.random.default_rng([spec.seed, row_len])
    rows = np.empty((spec.rows, row_len), dtype=np.int32)
    plens = np.empty(spec.rows, dtype=np.int32)
    t0 = time.time()
    for lo in range(0, spec.rows, spec.gen_batch):
        n = min(spec.gen_batch, spec.rows - lo)
        p = int(rng.choice(spec.prompt_lens))
        starts = rng.integers(0, len(stream) - p + 1, size=n)
        prompts = np.stack([stream[s:s + p] for s in starts]).astype(np.int64)
        cont = greedy_continue(model, torch.from_numpy(prompts), row_len - p).numpy()
        rows[lo:lo + n, :p] = prompts
        rows[lo:lo + n, p:] = cont
        plens[lo:lo + n] = p
        log(f"distill: {lo + n}/{spec.rows} rows, {time.time() - t0:.0f}s", flush=True)
    return rows, plens


def load_or_build(target_dir: Path, stream: np.ndarray, spec: DistillSpec, row_len: int,
                  work: Path, log=print) -> tuple[np.ndarray, np.ndarray, dict]:
    """The distillation rows, from work/ when a file with the same key is there."""
    import export
    key = hashlib.sha256(json.dumps(
        [weights_digest(target_dir), dataclasses.asdict(spec), row_len,
         hashlib.sha256(stream.tobytes()).hexdigest()]).encode()).hexdigest()[:16]
    path = work / f"distill-{key}.npz"
    info = {"target": spec.target, "target_weights_sha256_16": weights_digest(target_dir),
            "rows": spec.rows, "row_len": row_len, "prompt_lens": list(spec.prompt_lens),
            "raw_fraction": spec.raw_fraction, "seed": spec.seed, "cache_file": path.name}
    if path.exists():
        z = np.load(path)
        info["generation_seconds"] = float(z["seconds"])
        info["cached"] = True
        log(f"distill: {spec.rows} rows from {path}", flush=True)
        return z["rows"], z["prompt_lens"], info
    target, _, _ = export.load(target_dir)
    t0 = time.time()
    rows, plens = build_rows(target, stream, spec, row_len, log)
    seconds = time.time() - t0
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, rows=rows, prompt_lens=plens, seconds=np.float64(seconds))
    tmp.replace(path)
    info["generation_seconds"] = round(seconds, 1)
    info["cached"] = False
    return rows, plens, info


class BatchSampler:
    """Training batches [B, row_len]: round(B * (1 - raw_fraction)) distilled rows drawn
    uniformly (with replacement across steps) and the rest raw train windows, from the step's
    generator, so batches stay keyed by (seed, stage, step)."""

    def __init__(self, rows: np.ndarray, stream: np.ndarray, raw_fraction: float):
        self.rows, self.stream, self.raw_fraction = rows, stream, raw_fraction

    def __call__(self, rng: np.random.Generator, batch: int, length: int) -> torch.Tensor:
        if length != self.rows.shape[1]:
            raise ValueError(f"distilled rows have {self.rows.shape[1]} tokens, batch wants "
                             f"{length}")
        n_raw = round(batch * self.raw_fraction)
        picks = rng.integers(0, len(self.rows), size=batch - n_raw)
        distilled = torch.from_numpy(self.rows[picks].astype(np.int64))
        if n_raw == 0:
            return distilled
        return torch.cat([distilled, data.sample_windows(rng, self.stream, n_raw, length)])


# ---------------------------------------------------------------------------------------------
# Alignment of a drafter with its target.


@torch.no_grad()
def alignment(target: Qwen3LM, drafter: Qwen3LM, held_stream: np.ndarray, block_size: int,
              mask_id: int, prompts: int = 64, prompt_len: int = 64, new_tokens: int = 64,
              seed: int = 5) -> dict:
    """On held-out prompts, with g the target's greedy continuation:
      ar: fraction of positions i where argmax drafter(prompt + g[:i]) == g[i], and the mean
          accepted length of a k = block_size greedy AR draft started at every position (the
          run of agreements from there, capped at k -- what a lossless verifier accepts);
      block_diffusion: every block of g drafted in one forward from block_size <|mask|>
          tokens after the clean prefix; per-slot agreement and the mean accepted prefix."""
    if prompt_len % block_size or new_tokens % block_size:
        raise ValueError("prompt_len and new_tokens must be multiples of the block size")
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(held_stream) - prompt_len + 1, size=prompts)
    p = torch.from_numpy(np.stack([held_stream[s:s + prompt_len] for s in starts]).astype(np.int64))
    g = greedy_continue(target, p, new_tokens)
    seq = torch.cat([p, g], dim=1)  # [N, P + T]
    n_total = seq.shape[1]
    # AR: one causal forward gives every next-token draft.
    ar_pred = drafter(seq[:, :-1]).argmax(-1)[:, prompt_len - 1:]
    ar_ok = (ar_pred == g).numpy()
    # Block diffusion: dual-stream forward with every continuation block fully masked.
    noise = np.zeros(seq.shape, dtype=bool)
    noise[:, prompt_len:] = True
    x = torch.cat([seq, seq[:, :1]], dim=1)  # build_dual_stream_batch wants L + 1 tokens
    inputs, _, _ = diffusion.build_dual_stream_batch(x, noise, mask_id)
    logits = drafter(inputs, diffusion.dual_stream_positions(n_total),
                     diffusion.dual_stream_mask(n_total, block_size))
    bd_pred = logits[:, n_total + prompt_len:].argmax(-1)
    bd_ok = (bd_pred == g).numpy()

    def accepted(ok_rows: np.ndarray, starts_at) -> float:
        lens = []
        for row in ok_rows:
            for s in starts_at:
                run = 0
                while run < block_size and s + run < len(row) and row[s + run]:
                    run += 1
                lens.append(run)
        return float(np.mean(lens))

    blocks = range(0, new_tokens, block_size)
    per_slot = bd_ok.reshape(prompts, -1, block_size).mean(axis=(0, 1))
    return {
        "prompts": prompts, "prompt_len": prompt_len, "new_tokens": new_tokens,
        "block_size": block_size, "seed": seed,
        "ar": {"agreement": float(ar_ok.mean()),
               "mean_accepted_of_k": accepted(ar_ok, range(new_tokens - block_size + 1))},
        "block_diffusion": {"agreement": float(bd_ok.mean()),
                            "per_slot_agreement": [round(float(a), 4) for a in per_slot],
                            "mean_accepted_of_k": accepted(bd_ok, blocks)},
    }


def measure(folder: Path, target_dir: Path, threads: int = 1) -> dict:
    """Alignment of an exported drafter folder with target_dir, stored in eval.json."""
    import corpus as corpus_lib
    import export
    import tokenizer as tokenizer_lib
    torch.set_num_threads(threads)
    if (folder / "tokenizer.json").read_text() != (target_dir / "tokenizer.json").read_text():
        raise ValueError(f"{folder}/tokenizer.json differs from {target_dir}/tokenizer.json")
    drafter, config, tok = export.load(folder)
    target, _, _ = export.load(target_dir)
    specials = tokenizer_lib.special_ids(tok)
    corpus = corpus_lib.load()
    held = data.token_stream(tok, corpus.heldout, specials[tokenizer_lib.ENDOFTEXT])
    t0 = time.time()
    result = alignment(target, drafter, held, config["block_size"], specials[tokenizer_lib.MASK])
    result["target"] = config["tandem"]["drafter_for"]
    result["seconds"] = round(time.time() - t0, 1)
    path = folder / "eval.json"
    ev = json.loads(path.read_text()) if path.exists() else {}
    ev["drafter"] = result
    path.write_text(json.dumps(ev, indent=1) + "\n")
    print(f"alignment with {target_dir.name}: AR {result['ar']['agreement']:.3f} "
          f"(accepted {result['ar']['mean_accepted_of_k']:.2f}/{result['block_size']}), "
          f"block diffusion {result['block_diffusion']['agreement']:.3f} "
          f"(accepted {result['block_diffusion']['mean_accepted_of_k']:.2f})", flush=True)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description="Measure a drafter's alignment with its target.")
    p.add_argument("folder", type=Path)
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    measure(args.folder, args.target, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
