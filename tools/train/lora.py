"""Gated LoRA adapters for the drafting pathways of `isd` (R-ISD) and `self_spec`.

I-DLM §3.2 / Appendix G (Residual ISD) and Nemotron-Labs-Diffusion §3.3 both add a LoRA residual
that is switched on per token: every adapted projection computes

    h_j = W x_j + 1[j gated] * scale * B A x_j

and only the draft (<|mask|>) positions are gated. Verify positions run the base weights, and
because they never attend to a gated position (I-DLM's masks come after the clean tail under
strict causality; NLD's AR stream never sees the noisy stream), their logits and KV are exactly
the base model's, so decoding with the adapter stays lossless.

`attach` wraps a frozen Qwen3LM's projections in GatedLoraLinear modules that read one shared
gate, bool [T] or [B, T]; ungated rows return the base projection's output bit for bit
(torch.where, not a multiply by zero). The engine applies the same formula on the rows whose
`Extend::lora_gate` is set (worker/model/transformer.cc), so what is measured here is what the
engine runs.

`save` writes the PEFT layout the engine loads (worker/model/checkpoint/lora.cc):
adapter_config.json (peft_type LORA, r, lora_alpha, target_modules) and
adapter_model.safetensors with base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_A
.weight [r, in] and .lora_B.weight [out, r], fp32 (the engine computes the residual in fp32).

Training objectives (`losses`), base frozen, only the adapter trains:
  - "risd": the I-DLM layout [all <|mask|> | clean] (idlm.py), gate on the mask stream. Mask row
    p proposes index p + 1; its label is the verifier's greedy token there, the argmax of the
    clean row p of the same forward (the token ISD's greedy introspection accepts).
  - "self_spec_lora": the NLD dual-stream layout [clean | noisy] (diffusion.py) with every noisy
    block fully masked (the linear self-speculation draft state), gate on the noisy stream.
    Noisy row p drafts index p; its label is the AR pathway's greedy token, the argmax of clean
    row p - 1. As NLD §3.3, the cross-entropy counts only the accepted prefix of each block plus
    its first rejected slot ("accepted + 1", judged by the adapter's own argmax).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

import diffusion
import idlm
from model import Qwen3LM

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


class Gate:
    """The per-token gate every adapted projection of one model reads: None = all off."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None  # bool [T] or [B, T]


class GatedLoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float, gate: Gate,
                 generator: torch.Generator):
        super().__init__()
        self.base = base
        self.gate = gate
        self.scale = alpha / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        # PEFT's initialisation: A kaiming-uniform, B zero (the adapter starts as the identity).
        bound = 1.0 / math.sqrt(base.in_features)
        with torch.no_grad():
            self.lora_A.uniform_(-bound, bound, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.gate.mask is None:
            return y
        delta = self.scale * ((x @ self.lora_A.T) @ self.lora_B.T)
        g = self.gate.mask
        g = g[None, :, None] if g.dim() == 1 else g[:, :, None]
        return torch.where(g, y + delta, y)


def attach(model: Qwen3LM, rank: int, alpha: float, targets: tuple[str, ...],
           seed: int = 0) -> Gate:
    """Freezes `model` and wraps its `targets` projections; returns the shared gate."""
    for p in model.parameters():
        p.requires_grad_(False)
    gate = Gate()
    gen = torch.Generator().manual_seed(seed)
    for layer in model.model.layers:
        for name in targets:
            parent = layer.self_attn if name in ATTN else layer.mlp
            setattr(parent, name, GatedLoraLinear(getattr(parent, name), rank, alpha, gate, gen))
    model.lora_gate = gate
    return gate


def adapters(model: Qwen3LM) -> dict[str, GatedLoraLinear]:
    """HF module path (model.layers.{i}.self_attn.q_proj, ...) -> adapted module."""
    return {name: m for name, m in model.named_modules() if isinstance(m, GatedLoraLinear)}


def trainable(model: Qwen3LM) -> list[nn.Parameter]:
    return [p for m in adapters(model).values() for p in (m.lora_A, m.lora_B)]


def save(out: Path, model: Qwen3LM, rank: int, alpha: float, targets: tuple[str, ...],
         base_model: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
              "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none",
              "target_modules": list(targets), "use_rslora": False, "use_dora": False,
              "fan_in_fan_out": False, "inference_mode": True}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for name, m in adapters(model).items():
        prefix = f"base_model.model.{name}"
        tensors[f"{prefix}.lora_A.weight"] = m.lora_A.detach().float().contiguous()
        tensors[f"{prefix}.lora_B.weight"] = m.lora_B.detach().float().contiguous()
    save_file(dict(sorted(tensors.items())), str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})


def load(folder: Path, model: Qwen3LM) -> Gate:
    """Attaches the adapter saved in `folder` to `model` (frozen)."""
    config = json.loads((folder / "adapter_config.json").read_text())
    gate = attach(model, config["r"], config["lora_alpha"], tuple(config["target_modules"]))
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    mods = adapters(model)
    if len(tensors) != 2 * len(mods):
        raise ValueError(f"{folder}: {len(tensors)} tensors for {len(mods)} adapted modules")
    with torch.no_grad():
        for name, m in mods.items():
            m.lora_A.copy_(tensors[f"base_model.model.{name}.lora_A.weight"])
            m.lora_B.copy_(tensors[f"base_model.model.{name}.lora_B.weight"])
    return gate


# ---------------------------------------------------------------------------------------------
# Layouts and objectives.


def layout(objective: str, seq_len: int, block_size: int, mask_token_id: int,
           tokens: torch.Tensor) -> tuple:
    """(input_ids [B, 2L], positions [2L], attention [2L, 2L], gate [2L], draft rows slice,
    verify rows slice) for windows tokens [B, L+1]."""
    L = seq_len
    if objective == "risd":
        inputs, _ = idlm.build_batch(tokens, mask_token_id)
        gate = torch.cat([torch.ones(L, dtype=torch.bool), torch.zeros(L, dtype=torch.bool)])
        return (inputs, idlm.idlm_positions(L), idlm.idlm_mask(L, block_size), gate,
                slice(0, L), slice(L, 2 * L))
    if objective == "self_spec_lora":
        noise = torch.ones(tokens.shape[0], L, dtype=torch.bool).numpy()
        inputs, _, _ = diffusion.build_dual_stream_batch(tokens, noise, mask_token_id)
        gate = torch.cat([torch.zeros(L, dtype=torch.bool), torch.ones(L, dtype=torch.bool)])
        return (inputs, diffusion.dual_stream_positions(L),
                diffusion.dual_stream_mask(L, block_size), gate, slice(L, 2 * L), slice(0, L))
    raise ValueError(f"unknown LoRA objective {objective!r}")


def draft_logits_and_labels(objective: str, model: Qwen3LM, gate: Gate, tokens: torch.Tensor,
                            block_size: int, mask_token_id: int, use_adapter: bool = True):
    """Draft logits q [B, L, V], the verifier's greedy labels y [B, L] (-100 = none) for them."""
    L = tokens.shape[1] - 1
    inputs, positions, attention, g, draft, verify = layout(
        objective, L, block_size, mask_token_id, tokens)
    gate.mask = g if use_adapter else None
    try:
        logits = model(inputs, positions, attention)
    finally:
        gate.mask = None
    q = logits[:, draft]
    p_argmax = logits[:, verify].detach().argmax(-1)
    if objective == "risd":  # mask row p and clean row p both predict index p + 1
        return q, p_argmax
    labels = torch.full_like(p_argmax, -100)  # noisy row p drafts p; clean row p - 1 predicts p
    labels[:, 1:] = p_argmax[:, :-1]
    return q, labels


def accepted_plus_one(q: torch.Tensor, labels: torch.Tensor, block_size: int) -> torch.Tensor:
    """bool [B, L]: per block, the slots up to and including the first whose draft argmax
    misses its label (all slots when none misses). Unlabelled slots count as misses."""
    b, L = labels.shape
    hit = (q.argmax(-1) == labels).view(b, L // block_size, block_size)
    # misses_before[j] = number of misses in slots < j; active iff none before.
    misses = (~hit).long()
    before = torch.cumsum(misses, dim=-1) - misses
    return (before == 0).view(b, L) & (labels >= 0)


def loss(objective: str, model: Qwen3LM, gate: Gate, tokens: torch.Tensor, block_size: int,
         mask_token_id: int) -> tuple[torch.Tensor, int]:
    """(mean draft cross-entropy over the active slots, active slot count)."""
    q, labels = draft_logits_and_labels(objective, model, gate, tokens, block_size, mask_token_id)
    if objective == "self_spec_lora":
        labels = torch.where(accepted_plus_one(q, labels, block_size), labels, -100)
    active = int((labels >= 0).sum())
    ce = F.cross_entropy(q.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    return ce / max(1, active), active


@torch.no_grad()
def draft_accuracy(objective: str, model: Qwen3LM, gate: Gate, windows: torch.Tensor,
                   block_size: int, mask_token_id: int, draft_slots: int,
                   use_adapter: bool, batch: int = 8) -> dict:
    """Held-out agreement of the drafts with the verifier's greedy tokens, given true prefixes:
    per draft slot, and the mean accepted prefix over the first `draft_slots` slots of a block
    (greedy acceptance stops at the first miss)."""
    hits = torch.zeros(block_size, dtype=torch.float64)
    counts = torch.zeros(block_size, dtype=torch.float64)
    prefix_sum, blocks = 0.0, 0
    for rows in windows.split(batch):
        q, labels = draft_logits_and_labels(objective, model, gate, rows, block_size,
                                            mask_token_id, use_adapter)
        b, L = labels.shape
        hit = (q.argmax(-1) == labels).view(b, L // block_size, block_size)
        valid = (labels >= 0).view(b, L // block_size, block_size)
        hits += (hit & valid).double().sum((0, 1))
        counts += valid.double().sum((0, 1))
        full = valid[:, :, :draft_slots].all(-1)  # blocks with every counted slot labelled
        lead = torch.cumprod(hit[:, :, :draft_slots].long(), dim=-1).sum(-1)
        prefix_sum += float(lead[full].double().sum())
        blocks += int(full.sum())
    return {"by_slot": [round(float(hits[i] / counts[i]), 4) for i in range(block_size)],
            "mean_accepted_prefix": round(prefix_sum / max(1, blocks), 4),
            "draft_slots": draft_slots, "blocks": blocks}


# ---------------------------------------------------------------------------------------------
# Training driver (train.py --recipe risd | self_spec_lora).


# ---------------------------------------------------------------------------------------------
# Training an adapter on a frozen bundled model (this module's objectives and pcllm.py's).

@dataclasses.dataclass
class Run:
    """What every adapter recipe starts from: the frozen base model and its data."""
    repo: Path
    out: Path   # the adapter folder
    work: Path  # caches (distilled rows, trajectories)
    model: Qwen3LM
    tok: object  # tokenizers.Tokenizer
    held_stream: np.ndarray  # held-out split, one token stream
    held: torch.Tensor       # held-out windows of seq_len + 1 tokens
    stream: np.ndarray       # train split
    rows: np.ndarray         # the distilled target continuations (distill.py)
    plens: np.ndarray        # their prompt lengths
    distill_info: dict
    t_start: float


def prepare(args, recipe) -> Run:
    """Threads, determinism, the base model, the corpus streams, held-out windows and the
    distilled rows of `recipe` (cached in the work folder)."""
    import tempfile

    import corpus as corpus_lib
    import data
    import distill
    import export
    import tokenizer as tokenizer_lib

    repo = Path(__file__).resolve().parents[2]
    base_dir = repo / "models" / recipe.init_from
    work = args.work or Path(tempfile.gettempdir()) / f"tandem-train-{recipe.name}"
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()
    model, _, tok = export.load(base_dir)
    eos_id = tokenizer_lib.special_ids(tok)[tokenizer_lib.ENDOFTEXT]
    corpus = corpus_lib.load()
    stream = data.token_stream(tok, corpus.train, eos_id)
    held_stream = data.token_stream(tok, corpus.heldout, eos_id)
    held = data.heldout_windows(held_stream, recipe.seq_len + 1)[:recipe.lora.eval_windows]
    rows, plens, distill_info = distill.load_or_build(
        repo / "models" / recipe.distill.target, stream, recipe.distill, recipe.seq_len + 1, work)
    return Run(repo=repo, out=args.out or base_dir / recipe.lora.folder, work=work, model=model,
               tok=tok, held_stream=held_stream, held=held, stream=stream, rows=rows,
               plens=plens, distill_info=distill_info, t_start=t_start)


def optimise(args, recipe, run: Run, params: list[nn.Parameter],
             step_loss: Callable[[int], tuple[torch.Tensor, dict[str, float]]],
             log_digits: dict[str, int]) -> tuple[list[dict], int, bool]:
    """AdamW over `params` on the recipe's schedule, stopping early at --minutes. `step_loss(step)`
    draws the step's batch and returns its loss and the scalars to log, each averaged over every
    10 steps into the history with `log_digits[name]` decimals. Returns (history, steps done,
    truncated)."""
    opt = torch.optim.AdamW(params, lr=recipe.peak_lr, betas=recipe.betas,
                            weight_decay=recipe.weight_decay)
    deadline = run.t_start + args.minutes * 60 if args.minutes else None
    steps = recipe.total_steps
    history, window, step, truncated = [], [], 0, False
    for step in range(steps):
        if deadline is not None and time.time() > deadline:
            truncated = True
            break
        t_step = time.time()
        lr = recipe.lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        value, logged = step_loss(step)
        opt.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
        opt.step()
        window.append((logged, time.time() - t_step))
        if (step + 1) % 10 == 0 or step + 1 == steps:
            rec = {"step": step + 1, "lr": lr}
            for name, digits in log_digits.items():
                rec[name] = round(float(np.mean([w[0][name] for w in window])), digits)
            rec["s_per_step"] = round(float(np.mean([w[1] for w in window])), 3)
            rec["elapsed_s"] = round(time.time() - run.t_start, 1)
            history.append(rec)
            window = []
            values = " ".join(f"{name} {rec[name]:.3f}" for name in log_digits)
            print(f"step {rec['step']:4d}/{steps} lr {lr:.2e} {values} | "
                  f"{rec['elapsed_s'] / 60:.1f} min, {rec['s_per_step']:.2f} s/step", flush=True)
    return history, step + (0 if truncated else 1), truncated


def write_summary(args, recipe, run: Run, n_params: int, steps_done: int, truncated: bool,
                  train_wall: float, history: list[dict], **fields) -> None:
    """training.json: the recipe, steps, wall time, where it ran, the data and the history, with
    the recipe's own `fields` before the history."""
    import run_info

    summary = {
        "recipe": recipe.to_json(), "steps_done": steps_done, "truncated": truncated,
        "adapter_parameters": n_params, "train_wall_seconds": round(train_wall, 1),
        "hardware": run_info.hardware(args.threads), "versions": run_info.versions(),
        "distill": run.distill_info, "heldout_windows": int(run.held.shape[0]),
        **fields, "history": history,
    }
    (run.out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"adapter written to {run.out} after {train_wall / 60:.1f} min", flush=True)


def train(args, recipe) -> int:
    import data
    import distill
    import tokenizer as tokenizer_lib

    run = prepare(args, recipe)
    spec, model = recipe.lora, run.model
    mask_id = tokenizer_lib.special_ids(run.tok)[tokenizer_lib.MASK]
    sampler = distill.BatchSampler(run.rows, run.stream, recipe.distill.raw_fraction)
    gate = attach(model, spec.rank, spec.alpha, spec.targets, seed=recipe.seed)
    params = trainable(model)
    n_params = sum(p.numel() for p in params)
    S, obj = recipe.block_size, recipe.objective
    evaluate = lambda use: draft_accuracy(obj, model, gate, run.held, S, mask_id,  # noqa: E731
                                          spec.draft_slots, use)
    model.eval()
    before = evaluate(False)
    print(f"recipe {recipe.name}: adapter of {n_params:,d} parameters on models/"
          f"{recipe.init_from}; held-out drafts without adapter {before}", flush=True)

    def step_loss(step: int):
        tokens = sampler(data.step_rng(recipe.seed, 0, step), recipe.batch_size,
                         recipe.seq_len + 1)
        value, active = loss(obj, model, gate, tokens, S, mask_id)
        return value, {"draft_loss": value.item(), "active_slots": active}

    history, steps_done, truncated = optimise(
        args, recipe, run, params, step_loss, {"draft_loss": 4, "active_slots": 1})
    train_wall = time.time() - run.t_start
    save(run.out, model, spec.rank, spec.alpha, spec.targets, recipe.init_from)
    after = evaluate(True)
    print(f"held-out drafts with adapter {after}", flush=True)
    write_summary(args, recipe, run, n_params, steps_done, truncated, train_wall, history,
                  heldout_drafts={"without_adapter": before, "with_adapter": after})
    return 0


# ---------------------------------------------------------------------------------------------
# Model card section (model_card.py appends one per adapter folder inside a model folder).

PAPER = {"risd": "R-ISD, I-DLM §3.2 and Appendix G",
         "self_spec_lora": "Nemotron-Labs-Diffusion §3.3, LoRA-enhanced linear self-speculation"}
# The modes whose drafts the adapter serves (the card's engine measurement runs each; the
# first is the one its usage line names).
MODES = {"risd": ("isd",), "self_spec_lora": ("self_spec", "self_spec_quadratic")}
LAYOUT = {
    "risd": "the I-DLM layout `[all <|mask|> | clean]` of `idlm.py` (block {S}); the adapter is "
            "gated on the mask stream. Mask row p proposes index p + 1; its label is the "
            "verifier's greedy token there, the argmax of clean row p of the same forward (what "
            "greedy introspection accepts). Cross-entropy over every mask row.",
    "self_spec_lora": "the dual-stream layout `[clean | noisy]` of `diffusion.py` (block {S}) "
                      "with every noisy block fully masked (the draft state of linear "
                      "self-speculation); the adapter is gated on the noisy stream. Noisy row p "
                      "drafts index p; its label is the AR pathway's greedy token, the argmax "
                      "of clean row p - 1 of the same forward. As NLD §3.3, the cross-entropy "
                      "counts only each block's accepted prefix plus its first rejected slot "
                      "(\"accepted + 1\", judged by the adapter's own argmax).",
}


def card_section(model_folder: Path, adapter: Path) -> str:
    tr = json.loads((adapter / "training.json").read_text())
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    r = tr["recipe"]
    obj, S = r["objective"], r["block_size"]
    held = tr["heldout_drafts"]
    before, after = held["without_adapter"], held["with_adapter"]
    slots = before["draft_slots"]
    size = (adapter / "adapter_model.safetensors").stat().st_size
    rows = "\n".join(
        f"| {i + 1} | {b:.1%} | {a:.1%} |"
        for i, (b, a) in enumerate(zip(before["by_slot"][:slots], after["by_slot"][:slots])))
    truncated = (f" The `--minutes` guard stopped the run after {tr['steps_done']} of "
                 f"{r['total_steps']} steps (a shared, loaded machine), before the learning-rate "
                 "decay." if tr["truncated"] else "")
    last = tr["history"][-1] if tr["history"] else {}
    first = tr["history"][0] if tr["history"] else {}
    shift = ("" if after["mean_accepted_prefix"] >= before["mean_accepted_prefix"] else
             " These windows are raw held-out text; the adapter was trained (75%) on the "
             "model's own greedy continuations, which is also what decoding feeds it, and there "
             "it lengthens the accepted prefix: the engine numbers below are the measure that "
             "counts.")
    bench = ""
    if (adapter / "bench.json").exists():
        import idlm
        b = json.loads((adapter / "bench.json").read_text())
        bench = f"""
**In the engine** (`tandem bench modes --lora`, greedy, {b['max_tokens']} new tokens per prompt,
the prompts of `fixtures/bench_prompts.json`; `{adapter.name}/bench.json`):

{idlm.bench_rows(b)}

`+lora` rows run the adapter on the draft rows; `seq=AR` 100% is the lossless check. Command:

```sh
build/services/cli/tandem bench modes --model models/{model_folder.name} --lora \\
  models/{model_folder.name}/{adapter.name} --modes ar,{','.join(MODES[obj])} --json \\
  > models/{model_folder.name}/{adapter.name}/bench.json
```
"""
    return f"""## LoRA drafting adapter (`{adapter.name}/`)

A gated LoRA adapter for {' and '.join(f'`{m}`' for m in MODES[obj])} ({PAPER[obj]}):
`tandem generate --mode {MODES[obj][0]} --lora
models/{model_folder.name}/{adapter.name}` (or `tandem-verifier --lora`) runs it on the
`<|mask|>` draft rows only. Verify rows keep the base weights and never attend to a gated row,
so the output is still the base model's AR output, token for token (the engine's
`lora_drafts_test` checks it); only the proposals change.

**Files:** `adapter_config.json` (PEFT, `r` = {cfg['r']}, `lora_alpha` = {cfg['lora_alpha']:g},
`target_modules` = {', '.join(cfg['target_modules'])}), `adapter_model.safetensors`
({size / 1e6:.2f} MB, fp32, {tr['adapter_parameters']:,d} parameters), `training.json`.

**Objective** (`tools/train/lora.py`, recipe `{r['name']}`), base model frozen:
{LAYOUT[obj].format(S=S)}

**Data:** windows of {r['seq_len']} tokens, {r['batch_size']} per step: 75% the target's greedy
continuations of train-split prompts (1,536 cached distilled rows, `distill.py`), 25% raw
train windows, so draft contexts look like what the model itself emits.

**Training:** AdamW (β = {tuple(r['betas'])}, no weight decay), peak lr {r['peak_lr']:g}, warmup
{r['warmup_steps']} steps then WSD, gradient clip {r['grad_clip']}; {tr['steps_done']} steps in
{tr['train_wall_seconds'] / 60:.1f} min wall on {tr['hardware']['threads']} thread(s) of a shared
{tr['hardware']['logical_cpus']}-core CPU (setup and evaluation included).{truncated} Draft loss
{first.get('draft_loss', float('nan')):.3f} (first logged window) → {last.get('draft_loss', float('nan')):.3f} (last).

**Held-out drafts** ({tr['heldout_windows']} held-out windows, true prefixes; agreement of
the draft argmax with the verifier's greedy token by draft slot):

| draft slot | without adapter | with adapter |
|---|---|---|
{rows}

Mean accepted prefix over the first {slots} slots of a block (greedy acceptance stops at the
first miss): {before['mean_accepted_prefix']:.3f} without, **{after['mean_accepted_prefix']:.3f}** with the adapter.{shift}
{bench}
Rebuild: `.venv/bin/python tools/train/train.py --recipe {r['name']}` (reads the cached
distillation rows from `--work`, generating them when absent).

"""


def append_card_sections(text: str, model_folder: Path) -> str:
    """MODEL.md text with a section per adapter folder, before "## Samples" (or at the end)."""
    import pcllm

    def section(folder: Path) -> str:
        objective = json.loads((folder / "training.json").read_text())["recipe"]["objective"]
        return (pcllm.card_section if objective == "pcllm" else card_section)(model_folder, folder)

    sections = "".join(section(d) for d in sorted(model_folder.iterdir())
                       if (d / "adapter_config.json").exists() and (d / "training.json").exists())
    if not sections:
        return text
    at = text.find("## Samples")
    return text + "\n" + sections if at < 0 else text[:at] + sections + text[at:]
