#!/usr/bin/env python3
"""Trains a bundled model from a recipe and writes its folder under models/.

    .venv/bin/python tools/train/train.py --recipe target [--out DIR] [--minutes M]
        [--threads N] [--device cpu|cuda] [--work DIR] [--resume] [--no-eval]

Steps: load the corpus (corpus.py) -> train the tokenizer on the train split (tokenizer.py)
-> train the recipe's stages -> export (export.py) -> evaluate on the held-out split
(evaluate.py) -> write MODEL.md (model_card.py).

Reproducibility: every random draw is keyed by the recipe seed (model init) or by
(seed, stage, step) (batch windows and diffusion masks); compute is deterministic for a fixed
thread count and library set, so the same command gives the same weights. The recipe fixes
the number of steps; --minutes is only a guard that stops a run early (the card then says
so) when the machine is much slower than the one the recipe was sized on.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO_ROOT = HERE.parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a bundled model from a recipe.")
    p.add_argument("--recipe", required=True)
    p.add_argument("--out", type=Path, help="model folder (default models/tandem-<recipe>)")
    p.add_argument("--minutes", type=float, help="stop early after this many wall minutes")
    p.add_argument("--threads", type=int, default=1, help="torch / tokenizer threads")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--work", type=Path, help="checkpoint folder (default: a temp folder)")
    p.add_argument("--resume", action="store_true", help="continue from the work checkpoint")
    p.add_argument("--no-eval", action="store_true", help="export only; skip evaluation")
    p.add_argument("--steps-scale", type=float, default=1.0,
                   help="multiply every stage's steps (smoke tests); the card records it")
    return p.parse_args()


# Threads must be fixed before torch / tokenizers start their pools.
ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["RAYON_NUM_THREADS"] = str(ARGS.threads)
    os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import numpy as np  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import corpus as corpus_lib  # noqa: E402
import data  # noqa: E402
import diffusion  # noqa: E402
import distill  # noqa: E402
import export  # noqa: E402
import idlm  # noqa: E402
import sdlm  # noqa: E402
import tokenizer as tokenizer_lib  # noqa: E402
from model import Qwen3LM, count_parameters  # noqa: E402
from recipes import RECIPES, Recipe, Stage  # noqa: E402
import run_info  # noqa: E402

LOG_EVERY = 10
CHECKPOINT_EVERY = 50


def make_optimizer(model: Qwen3LM, recipe: Recipe) -> torch.optim.Optimizer:
    # Weight decay on matrices (embedding included), none on norm gains.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.peak_lr, betas=recipe.betas, eps=1e-8,
    )


def step_loss(model, recipe: Recipe, stage: Stage, rng, stream, mask_token_id, dual, device):
    """Returns (loss, ar_loss, diff_loss or None, masked token count)."""
    L = recipe.seq_len
    # stream: a token array, or a batch sampler (distill.BatchSampler) for distilled recipes.
    sample = stream if callable(stream) else functools.partial(data.sample_windows, stream=stream)
    tokens = sample(rng, batch=recipe.batch_size, length=L + 1).to(device)
    if stage.alpha == 0.0:
        logits = model(tokens[:, :-1])
        ar = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        return ar, ar, None, 0
    if recipe.objective == "sdlm":
        return sdlm_step_loss(model, recipe, stage, rng, tokens, mask_token_id, device)
    if recipe.objective == "idlm":  # logged as ar = L_clean, diff = L_mask
        loss, clean, masked, _ = idlm.losses(model, tokens, mask_token_id, dual)
        return loss, clean, masked, tokens.shape[0] * L
    noise = diffusion.sample_block_masks(rng, recipe.batch_size, L, recipe.block_size)
    inputs, ar_targets, diff_targets = diffusion.build_dual_stream_batch(
        tokens.cpu(), noise, mask_token_id)
    mask, positions = dual
    logits = model(inputs.to(device), positions, mask)
    ar = F.cross_entropy(logits[:, :L].flatten(0, 1), ar_targets.to(device).flatten())
    # Global averaging (NLD eq. 5): one mean over every masked token of the batch, so a
    # sequence weighs in proportion to how many of its tokens were masked.
    n_masked = int(noise.sum())
    diff = F.cross_entropy(logits[:, L:].flatten(0, 1), diff_targets.to(device).flatten(),
                           ignore_index=-100, reduction="sum") / n_masked
    return ar + stage.alpha * diff, ar, diff, n_masked


def sdlm_step_loss(model, recipe: Recipe, stage: Stage, rng, tokens, mask_token_id, device):
    """L_AR on the clean stream + alpha * L_SDLM, the mean CE over every noise-block row."""
    L = recipe.seq_len
    offsets = sdlm.sample_offsets(rng, recipe.batch_size, recipe.block_size)
    inputs, positions, mask, ar_targets, block_targets = sdlm.build_batch(
        tokens.cpu(), offsets, recipe.block_size, mask_token_id)
    logits = model(inputs.to(device), positions.to(device), mask.to(device))
    ar = F.cross_entropy(logits[:, :L].flatten(0, 1), ar_targets.to(device).flatten())
    blk = F.cross_entropy(logits[:, L:].flatten(0, 1), block_targets.to(device).flatten())
    return ar + stage.alpha * blk, ar, blk, block_targets.numel()


def log_record(step: int, stage: Stage, lr: float, window: list, elapsed: float) -> dict:
    diffs = [w[1] for w in window if w[1] is not None]
    return {"step": step, "stage": stage.name, "lr": lr,
            "ar_loss": round(float(np.mean([w[0] for w in window])), 4),
            "diff_loss": round(float(np.mean(diffs)), 4) if diffs else None,
            "grad_norm": round(float(np.mean([w[2] for w in window])), 3),
            "s_per_step": round(float(np.mean([w[3] for w in window])), 3),
            "elapsed_s": round(elapsed, 1)}


def save_checkpoint(path: Path, model, opt, step: int, history: list, stage_wall: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "history": history, "stage_wall": stage_wall}, tmp)
    tmp.replace(path)


def train(args: argparse.Namespace) -> int:
    recipe = RECIPES[args.recipe]
    if args.steps_scale != 1.0:
        import dataclasses
        stages = tuple(dataclasses.replace(s, steps=max(1, round(s.steps * args.steps_scale)))
                       for s in recipe.stages)
        recipe = dataclasses.replace(recipe, stages=stages,
                                     warmup_steps=min(recipe.warmup_steps, 2))
    if recipe.objective == "dflash":  # conditioned on the target's hidden states: own loop
        import dflash
        return dflash.train(args, recipe)
    if recipe.objective == "pcllm":  # an adapter on every row, trained on Jacobi trajectories
        import pcllm
        return pcllm.train(args, recipe)
    if recipe.lora:  # a gated adapter on a frozen bundled model: own loop
        import lora
        return lora.train(args, recipe)
    if recipe.sampler:  # the diffusion mode's sampler on a frozen bundled model: own loop
        import sampler
        return sampler.train(args, recipe)
    out = args.out or REPO_ROOT / "models" / f"tandem-{recipe.name}"
    work = args.work or Path(tempfile.gettempdir()) / f"tandem-train-{recipe.name}"
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    corpus = corpus_lib.load()
    # A conversion keeps its base model's tokenizer, a drafter its target's.
    tok_from = recipe.init_from or (recipe.distill.target if recipe.distill else None)
    if tok_from:
        tok = tokenizers.Tokenizer.from_file(
            str(REPO_ROOT / "models" / tok_from / "tokenizer.json"))
    else:
        tok = tokenizer_lib.train([f.text for f in corpus.train], recipe.model.vocab_size)
    specials = tokenizer_lib.special_ids(tok)
    eos_id, mask_id = specials[tokenizer_lib.ENDOFTEXT], specials[tokenizer_lib.MASK]
    stream = data.token_stream(tok, corpus.train, eos_id)
    held_stream = data.token_stream(tok, corpus.heldout, eos_id)
    print(f"corpus: python {corpus.python_version}, train {len(corpus.train)} files "
          f"{len(stream):,d} tokens, held-out {len(corpus.heldout)} files "
          f"{len(held_stream):,d} tokens; prep {time.time() - t_start:.1f}s", flush=True)

    batches, distill_info = stream, None
    if recipe.distill:  # the target's greedy continuations, cached under --work
        rows, _, distill_info = distill.load_or_build(
            REPO_ROOT / "models" / recipe.distill.target, stream, recipe.distill,
            recipe.seq_len + 1, work)
        batches = distill.BatchSampler(rows, stream, recipe.distill.raw_fraction)

    torch.manual_seed(recipe.seed)
    model = Qwen3LM(recipe.model)
    model.init_weights(torch.Generator().manual_seed(recipe.seed))
    if recipe.init_from:
        base, _, _ = export.load(REPO_ROOT / "models" / recipe.init_from)
        model.load_state_dict(base.state_dict())
        print(f"initialised from models/{recipe.init_from}", flush=True)
    model.to(device)
    opt = make_optimizer(model, recipe)
    n_params = count_parameters(model)
    print(f"recipe {recipe.name}: {n_params:,d} parameters, stages "
          + ", ".join(f"{s.name}={s.steps} steps (alpha {s.alpha})" for s in recipe.stages)
          + f", {args.threads} thread(s) on {args.device}", flush=True)

    ckpt_path = work / "checkpoint.pt"
    start_step, history, stage_wall = 0, [], {}
    if args.resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start_step, history, stage_wall = ckpt["step"], ckpt["history"], ckpt["stage_wall"]
        print(f"resumed at step {start_step}", flush=True)

    L = recipe.seq_len
    dual = (diffusion.dual_stream_mask(L, recipe.block_size).to(device),
            diffusion.dual_stream_positions(L).to(device))
    if recipe.objective == "idlm":
        dual = (idlm.idlm_mask(L, recipe.block_size).to(device),
                idlm.idlm_positions(L).to(device))
    deadline = t_start + args.minutes * 60 if args.minutes else None
    truncated = False
    step, window = 0, []
    model.train()
    for si, stage in enumerate(recipe.stages):
        for local in range(stage.steps):
            if step < start_step:  # resumed: batches are keyed by step, nothing to replay
                step += 1
                continue
            if deadline is not None and time.time() > deadline:
                truncated = True
                break
            t_step = time.time()
            lr = recipe.lr_at(step)
            for group in opt.param_groups:
                group["lr"] = lr
            rng = data.step_rng(recipe.seed, si, local)
            loss, ar, diff, _ = step_loss(model, recipe, stage, rng, batches, mask_id, dual, device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip))
            opt.step()
            step += 1
            dt = time.time() - t_step
            stage_wall[stage.name] = stage_wall.get(stage.name, 0.0) + dt
            window.append((ar.item(), None if diff is None else diff.item(), grad_norm, dt))
            if step % LOG_EVERY == 0 or local == stage.steps - 1:
                rec = log_record(step, stage, lr, window, time.time() - t_start)
                history.append(rec)
                window = []
                print(f"step {step:4d}/{recipe.total_steps} [{stage.name}] lr {lr:.2e} "
                      f"ar {rec['ar_loss']:.3f}"
                      + ("" if rec["diff_loss"] is None else f" diff {rec['diff_loss']:.3f}")
                      + f" gnorm {rec['grad_norm']:.2f} | {rec['elapsed_s'] / 60:.1f} min, "
                      f"{rec['s_per_step']:.2f} s/step", flush=True)
            if step % CHECKPOINT_EVERY == 0:
                save_checkpoint(ckpt_path, model, opt, step, history, stage_wall)
        if truncated:
            print(f"--minutes {args.minutes} reached: stopping at step {step}", flush=True)
            break
    save_checkpoint(ckpt_path, model, opt, step, history, stage_wall)
    train_wall = time.time() - t_start

    model.eval()
    export.write(out, model.cpu(), recipe, tok)
    summary = {
        "recipe": recipe.to_json(),
        "steps_scale": args.steps_scale,
        "steps_done": step,
        "truncated": truncated,
        "parameters": n_params,
        "tokens_seen": step * recipe.batch_size * recipe.seq_len,
        "train_wall_seconds": round(train_wall, 1),
        "stage_wall_seconds": {k: round(v, 1) for k, v in stage_wall.items()},
        "resumed": bool(args.resume),
        "hardware": run_info.hardware(args.threads, args.device),
        "versions": run_info.versions(),
        "corpus": corpus.stats() | {"train_tokens": len(stream), "heldout_tokens": len(held_stream)},
        "distill": distill_info,
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"exported to {out} after {train_wall / 60:.1f} min", flush=True)

    if not args.no_eval:
        import evaluate
        import model_card
        evaluate.run(out, threads=args.threads)
        if recipe.is_drafter:
            distill.measure(out, REPO_ROOT / "models" / recipe.distill.target, args.threads)
        model_card.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(train(ARGS))
