#!/usr/bin/env python3
"""Renders MODEL.md for an exported folder from its config.json, training.json and eval.json.

    .venv/bin/python tools/train/model_card.py models/tandem-target

The card is generated, so a rebuild keeps it true; edit this template, not the output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

BITS = 1 / math.log(2)


def _size(path: Path) -> str:
    n = path.stat().st_size
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _files_table(folder: Path) -> str:
    rows = ["| file | size | what |", "|---|---|---|"]
    what = {
        "config.json": "HF Qwen3 config + `block_size`, `mask_token_id`, `tandem`",
        "model.safetensors": "bf16 weights, HF tensor names (tied `lm_head` omitted)",
        "tokenizer.json": "byte-level BPE, 4096 ids",
        "generation_config.json": "greedy defaults, eos",
        "training.json": "recipe, hardware, wall time, loss history",
        "eval.json": "held-out metrics",
        "fixtures/greedy.json": "transformers greedy continuations (engine golden test)",
        "fixtures/modes.json": "reference self-speculation / diffusion decodes",
    }
    for name, desc in what.items():
        if (folder / name).exists():
            rows.append(f"| `{name}` | {_size(folder / name)} | {desc} |")
    return "\n".join(rows)


def render(folder: Path) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    tr = json.loads((folder / "training.json").read_text())
    ev = json.loads((folder / "eval.json").read_text())
    recipe = tr["recipe"]
    m = recipe["model"]
    corpus = tr["corpus"]
    hw = tr["hardware"]
    name = folder.name
    stages = recipe["stages"]
    stage_lines = "\n".join(
        f"| {i + 1} | `{s['name']}` | {s['steps']} | {s['alpha']} | "
        f"{tr['stage_wall_seconds'].get(s['name'], 0) / 60:.1f} min |"
        for i, s in enumerate(stages))
    last = {}
    for rec in tr["history"]:
        last[rec["stage"]] = rec
    ar, uni = ev["ar"], ev["unigram"]
    diff = ev.get("diffusion")
    modes = ev.get("modes")
    greedy = json.loads((folder / "fixtures" / "greedy.json").read_text())
    samples = "\n\n".join(
        f"`{c['source']}`:\n\n```python\n" + "\n".join(c["prompt_text"].split("\n")[-4:])
        + "\u2592" + c["continuation_text"] + "\n```"
        for c in (greedy["cases"][0], greedy["cases"][-1]))
    gaps = min(c["min_top2_logit_gap"] for c in greedy["cases"])
    truncated = ("**The run hit its --minutes guard and stopped early at step "
                 f"{tr['steps_done']} of {recipe['total_steps']}.**\n\n" if tr["truncated"] else "")
    scaled = (f"**Smoke build: steps scaled by {tr['steps_scale']}.**\n\n"
              if tr["steps_scale"] != 1.0 else "")

    out = [f"""# {name}

{recipe['description'][0].upper() + recipe['description'][1:]}: a {tr['parameters'] / 1e6:.2f}M-parameter Qwen3-architecture
decoder trained by the `{recipe['name']}` recipe of `tools/train/` on the Python standard library.
It is a test and demonstration model for the engine's decoding modes, not a useful code model.

{truncated}{scaled}## Files

{_files_table(folder)}

## Architecture

`Qwen3ForCausalLM`: {m['num_hidden_layers']} layers, hidden {m['hidden_size']}, MLP
{m['intermediate_size']} (SwiGLU), {m['num_attention_heads']} query heads / {m['num_key_value_heads']}
KV heads of dim {m['head_dim']} (GQA), q/k RMSNorm, RoPE θ = {m['rope_theta']:g}, RMSNorm ε =
{m['rms_norm_eps']:g}, tied embeddings, vocab {m['vocab_size']}, context
{m['max_position_embeddings']} (trained at {recipe['seq_len']}). {tr['parameters']:,d} parameters.
Loads in `transformers` (checked: the greedy fixtures are produced by
`Qwen3ForCausalLM.from_pretrained` on this folder; its logits match the training module's to
{ev['transformers_vs_training_module_max_abs_logit_diff']:.1e}).

## Data

{corpus['train']['files']} train / {corpus['heldout']['files']} held-out `*.py` files of the
Python {corpus['python_version']} standard library ({corpus['train']['bytes']:,d} / {corpus['heldout']['bytes']:,d}
bytes, {corpus['train_tokens']:,d} / {corpus['heldout_tokens']:,d} tokens with `<|endoftext|>`
after each file). Test suites, `site-packages`, `idlelib` and generated tables are excluded; files
are split by a hash of their path (rules in `tools/train/corpus.py`; file-list digest
`{corpus['file_list_sha256'][:16]}…`). The tokenizer (byte-level BPE, Qwen2 pre-tokenizer, NFC,
specials `<|endoftext|>` = {cfg['eos_token_id']}, `<|mask|>` = {cfg['mask_token_id']}) is trained on
the train split only.

## Objective (Nemotron-Labs-Diffusion §2)

| stage | name | steps | α | wall |
|---|---|---|---|---|
{stage_lines}

Stage 1 trains the AR next-token loss alone. Stage 2 trains L = L_AR + α·L_diff on the
dual-stream layout: the sequence x (L = {recipe['seq_len']}) is fed twice at the same positions,
`[clean x | noisy x̃]`. The clean stream is strictly causal and never sees the noisy one, so
L_AR on it is exactly the AR loss. The noisy stream is cut into blocks of
{recipe['block_size']}; in every block the number of masked tokens is uniform on 1..{recipe['block_size']}
(own draw per block) and those tokens become `<|mask|>`. A noisy token attends bidirectionally
within its own block and to the clean tokens before its block. L_diff is the cross-entropy of
the original token at masked positions only, averaged over all masked tokens of the batch
(global averaging, eq. 5); the 1/t factor of eq. 2 is not applied (with a per-block uniform
masked count and global averaging every masked token weighs the same).

**Prediction convention:** the logits of a `<|mask|>` at position p predict the token *at* p;
AR logits at p predict p + 1. To draft k tokens after a verified prefix of n tokens, feed k
`<|mask|>` at positions n..n+k-1 that see the prefix's (causal) KV and each other.

Block size {recipe['block_size']}: NLD Table 4 has its best accuracy at block length 8, and it is
the default self-speculation draft width; {recipe['seq_len'] // recipe['block_size']} blocks per sequence each get
a different clean prefix.

## Training

AdamW (β = {tuple(recipe['betas'])}, weight decay {recipe['weight_decay']} on matrices), peak lr
{recipe['peak_lr']:g}, {recipe['warmup_steps']} warmup steps, warmup-stable-decay with a linear decay
to {recipe['final_lr_ratio']:g}× over the last {recipe['decay_fraction']:.0%} of all steps, grad clip
{recipe['grad_clip']}, batch {recipe['batch_size']} × {recipe['seq_len']} tokens, seed {recipe['seed']},
fp32. {tr['steps_done']} steps, {tr['tokens_seen']:,d} training tokens (stage 2 runs each twice).

Final training losses (mean of the last logged window): AR {last[stages[-1]['name']]['ar_loss']:.3f}"""
           + (f", diffusion {last[stages[-1]['name']]['diff_loss']:.3f}" if diff else "") + f""" nats/token.

**Hardware and wall time:** {hw['cpu']} ({hw['logical_cpus']} logical CPUs, shared with other
jobs), {hw['threads']} torch thread(s), device `{hw['device']}`; training took
{tr['train_wall_seconds'] / 60:.1f} min wall (data and tokenizer preparation included), evaluation
{ev['eval_wall_seconds'] / 60:.1f} min. Versions: Python {tr['versions']['python']}, torch
{tr['versions']['torch']}, tokenizers {tr['versions']['tokenizers']}, numpy {tr['versions']['numpy']}.

## Held-out results

| metric | value |
|---|---|
| AR loss | **{ar['loss']:.3f} nats/token** ({ar['loss'] * BITS:.2f} bits) |
| unigram baseline (train unigram, add-one, on held-out) | {uni['heldout_cross_entropy']:.3f} nats/token ({uni['heldout_cross_entropy'] * BITS:.2f} bits) |
| AR top-1 accuracy | {ar['top1_accuracy']:.1%} |
"""]
    if diff:
        slots = ", ".join(f"{a:.0%}" for a in diff["fully_masked_top1_by_slot"])
        by_k = ", ".join(f"{k}: {v:.2f}" for k, v in diff["loss_by_masked_count"].items())
        out.append(f"""| diffusion loss (training masking distribution) | **{diff['loss']:.3f} nats/token** |
| diffusion loss, fully masked blocks | {diff['fully_masked_loss']:.3f} nats/token |

Diffusion loss by number of masked tokens in the block ({by_k}). Top-1 accuracy of a fully
masked block by slot (the drafting state of self-speculation): {slots}.
""")
    if modes:
        ss = modes["self_spec_linear"]
        dm = "; ".join(
            f"threshold {d['threshold']}: {d['tokens_per_forward']:.2f} tokens per forward, "
            f"{d['fraction_equal_to_ar_greedy']:.0%} of tokens equal to AR greedy's"
            for d in modes["diffusion"])
        out.append(f"""
Reference decodes of the 8 fixture prompts (32 new tokens, `fixtures/modes.json`): linear
self-speculation with k = {ss['draft_width']} accepts {ss['mean_accepted_drafts_per_cycle']:.2f} drafts per
cycle ({ss['tokens_per_cycle']:.2f} tokens per draft + verify cycle) and reproduces AR greedy:
{'yes' if ss['all_match_ar_greedy'] else '**no**'}. Block diffusion (block {modes['diffusion'][0]['block_size']}, a lossy
mode): {dm}.
""")
    weak = modes is not None and (
        max(d["tokens_per_forward"] for d in modes["diffusion"]) < 1.2
        and modes["self_spec_linear"]["mean_accepted_drafts_per_cycle"] < 1.5)
    if weak:
        out.append(f"""
## Limitations

{tr['parameters'] / 1e6:.1f}M parameters and {tr['tokens_seen'] / 1e6:.1f}M training tokens: greedy continuations are
Python-shaped but soon repeat themselves, and the diffusion pathway is rarely confident (see
the fully masked slot accuracies above), so the block-diffusion mode commits about one token
per forward at usual thresholds and self-speculation accepts about one draft per cycle. The
model exercises the modes' mechanics and losslessness; it does not show their speed-ups.
""")
    modes_served = ", ".join(f"`{x}`" for x in cfg.get("tandem", {}).get("modes", ["ar"]))
    out.append(f"""
## Modes

Serves {modes_served}. `config.json` carries `block_size` = {cfg.get('block_size')} and
`mask_token_id` = {cfg.get('mask_token_id')}. The quadratic layout and the AR-diffusion ensemble
verifier use the same two pathways (causal rows, and mask rows that see a prefix plus their own
block), so they need no other training.

## Samples (greedy, from `fixtures/greedy.json`)

The first and the last of the 8 fixture prompts (64 tokens, the last lines shown), each followed
by its 32-token greedy continuation:

{samples}

`▒` marks where the prompt ends. The smallest top-1/top-2 logit gap over all fixture steps is
{gaps:.3f}: an engine reproduces the fixtures if its logits are within half that of
transformers'.

## Rebuild

```sh
.venv/bin/python tools/train/train.py --recipe {recipe['name']} --threads {hw['threads']}
```

Same library versions and thread count give the same weights (steps and batches are fixed by
the recipe). The training data is the Python standard library, under the PSF License.
""")
    return "".join(out)


def write(folder: Path) -> None:
    (folder / "MODEL.md").write_text(render(folder))


def main() -> int:
    parser = argparse.ArgumentParser(description="Render MODEL.md for a model folder.")
    parser.add_argument("folder", type=Path)
    write(parser.parse_args().folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
