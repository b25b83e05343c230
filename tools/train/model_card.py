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
        "bench.json": "`tandem bench modes --json` (engine; the command is below)",
    }
    for name, desc in what.items():
        if (folder / name).exists():
            rows.append(f"| `{name}` | {_size(folder / name)} | {desc} |")
    return "\n".join(rows)


BENCH_COMMAND = ("build/services/cli/tandem bench modes --model models/tandem-target "
                 "--drafter models/tandem-drafter --modes ar,spec --json "
                 "> models/tandem-drafter/bench.json")


def _engine_rows(bench: dict) -> str:
    """The `tandem bench modes` JSON summed over prompt categories, one row per variant."""
    sums: dict[str, dict] = {}
    for r in bench["results"]:
        t = sums.setdefault(r["variant"], {"tokens": 0, "forwards": 0, "drafter_forwards": 0,
                                           "steps": 0, "drafted": 0, "accepted": 0,
                                           "seconds": 0.0, "exact": 0.0, "prompts": 0,
                                           "nll": 0.0, "nll_known": True})
        t["tokens"] += r["tokens"]
        # ar_nll is per token of the category's completions: weigh it by their tokens.
        if "ar_nll" in r:
            t["nll"] += r["ar_nll"] * r["tokens"]
        else:
            t["nll_known"] = False
        t["forwards"] += r["forwards"]
        t["drafter_forwards"] += r["drafter_forwards"]
        t["steps"] += r["steps_with_drafts"]
        t["drafted"] += r["drafted_tokens"]
        t["accepted"] += r["accepted_tokens"]
        t["seconds"] += r["seconds"]
        t["exact"] += r["exact_match_sequences"] * r["prompts"]
        t["prompts"] += r["prompts"]
    ar_speed = sums["ar"]["tokens"] / sums["ar"]["seconds"] if "ar" in sums else None
    lines = ["| variant | TPF | acc.len | drafts accepted | drafter forwards | tok/s (CPU) | "
             "speed vs AR | seq=AR | AR-NLL |", "|---|---|---|---|---|---|---|---|---|"]
    for name, t in sums.items():
        acc = f"{(t['accepted'] + t['steps']) / t['steps']:.2f}" if t["steps"] else "-"
        rate = f"{t['accepted'] / t['drafted']:.0%}" if t["drafted"] else "-"
        speed = t["tokens"] / t["seconds"]
        lines.append(f"| `{name}` | {t['tokens'] / t['forwards']:.2f} | {acc} | {rate} | "
                     f"{t['drafter_forwards']} | {speed:.0f} | "
                     f"{speed / ar_speed if ar_speed else 0:.2f}x | "
                     f"{t['exact'] / t['prompts']:.0%} | "
                     f"{_nll(t)} |")
    return "\n".join(lines)


def _nll(t: dict) -> str:
    """A variant's AR-NLL (nats per completion token), or '-' when bench.json predates it."""
    return f"{t['nll'] / t['tokens']:.3f}" if t["nll_known"] and t["tokens"] else "-"


# What the AR-NLL column means, for the cards that show it.
AR_NLL_NOTE = ("AR-NLL: the target's AR negative log-likelihood of the completion tokens, nats per "
               "token (teacher-forced): for a lossy mode, how plausible its text is to the AR model, "
               "next to the `ar` row (AR greedy's own text).")


def base_ar_loss(folder: Path, base: str, ev: dict) -> str:
    """' (held-out AR loss X; the target's Y)' for a conversion of models/<base>, or ''."""
    base_eval = folder.parent / base / "eval.json"
    if not base_eval.exists():
        return ""
    return (f" (held-out AR loss {ev['ar']['loss']:.3f} nats/token; the target's "
            f"{json.loads(base_eval.read_text())['ar']['loss']:.3f})")


def distilled_data(tr: dict, why: str) -> str:
    """The **Data.** paragraph of a conversion trained on distilled rows, or '' without them;
    `why` ends its last sentence."""
    d = tr.get("distill")
    if not d:
        return ""
    return f"""
**Data.** Every batch is {1 - d['raw_fraction']:.0%} rows of `{d['target']}`'s own greedy
continuations ({d['rows']:,d} rows of {d['row_len']} tokens: a prompt of
{'/'.join(str(x) for x in d['prompt_lens'])} tokens cut from the train split, then the
continuation; `tools/train/distill.py`) and {d['raw_fraction']:.0%}
raw train windows, {why}
"""


def _drafter_section(folder: Path, cfg: dict, tr: dict, ev: dict) -> str:
    d, al = tr["distill"], ev["drafter"]
    target = cfg["tandem"]["drafter_for"]
    slots = ", ".join(f"{a:.0%}" for a in al["block_diffusion"]["per_slot_agreement"])
    out = f"""
## Drafting for `{target}`

**Distillation data** (`tools/train/distill.py`): {d['rows']:,d} rows of {d['row_len']} tokens, each
a prompt of {'/'.join(str(x) for x in d['prompt_lens'])} tokens (one length per batch of 64) cut
from the train split at seeded offsets, followed by `{target}`'s greedy continuation (fp32,
KV-cached, batched; generated in {d['generation_seconds'] / 60:.1f} min, part of the training wall
time above, and cached under the training work folder). `tokenizer.json` is the target's, byte
for byte. Every training batch is {1 - d['raw_fraction']:.0%} distilled rows and
{d['raw_fraction']:.0%} raw train windows, so the drafter learns what the target emits while still
seeing the corpus.

**Alignment with the target** on {al['prompts']} held-out prompts of {al['prompt_len']} tokens,
over the target's {al['new_tokens']}-token greedy continuation g (`eval.json` `drafter`):

| drafter pathway | positions where the draft equals g | mean accepted of a k = {al['block_size']} draft |
|---|---|---|
| AR (next token given the prompt and g so far) | **{al['ar']['agreement']:.1%}** | {al['ar']['mean_accepted_of_k']:.2f} |
| block diffusion ({al['block_size']} `<|mask|>` after the clean prefix) | {al['block_diffusion']['agreement']:.1%} | {al['block_diffusion']['mean_accepted_of_k']:.2f} |

Block-diffusion agreement by slot: {slots}. "Accepted" is the run of agreeing positions from a
draft's start, which a lossless verifier accepts (plus the one token it adds itself).
"""
    bench_path = folder / "bench.json"
    if bench_path.exists():
        bench = json.loads(bench_path.read_text())
        out += f"""
**In the engine** (`spec`: speculative decoding of `{bench['model']}` with this drafter, γ = 4
drafts per step, `spec gamma=N`: N; greedy, {bench['max_tokens']} new tokens per prompt, the prompts of
`{bench['prompts_file']}`, {bench['threads']} thread(s); `bench.json`):

{_engine_rows(bench)}

TPF: completion tokens per target forward; acc.len: tokens committed per drafting step
(accepted drafts + 1). TPF, acc.len and seq=AR do not depend on the machine; tok/s does (the
CPU pays for every drafter forward and for the wider verify extends, and the machine may be
shared), so read it as indicative only. {AR_NLL_NOTE} Command:

```sh
{BENCH_COMMAND}
```
"""
    return out


def _modes_section(folder: Path) -> str:
    """The model's own modes as the C++ engine measured them (bench.json)."""
    bench = json.loads((folder / "bench.json").read_text())
    modes = list(dict.fromkeys(r["mode"] for r in bench["results"]))
    return f"""
## In the engine

`tandem bench modes`: every mode's variants, greedy, {bench['max_tokens']} new tokens per prompt,
the prompts of `{bench['prompts_file']}`, {bench['threads']} thread(s); `bench.json`:

{_engine_rows(bench)}

TPF: completion tokens per forward (every forward counts: prefill, draft and verify);
acc.len: tokens committed per drafting step; seq=AR: outputs equal to AR greedy decoding
(lossy modes differ by design). TPF, acc.len and seq=AR do not depend on the machine; tok/s
does (a shared 2-core CPU here). {AR_NLL_NOTE} Command:

```sh
build/services/cli/tandem bench modes --model models/{folder.name} --modes {','.join(modes)} \\
  --threads 1 --json > models/{folder.name}/bench.json
```
"""


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
    if ev.get("drafter") and tr.get("distill"):
        out.append(_drafter_section(folder, cfg, tr, ev))
    elif (folder / "bench.json").exists() and recipe.get("objective") not in ("idlm", "sdlm"):
        out.append(_modes_section(folder))
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
    if recipe.get("objective") == "idlm":
        import idlm
        return idlm.patch_card("".join(out), folder, cfg, tr, ev, _engine_rows)
    if recipe.get("objective") == "sdlm":
        import sdlm
        return sdlm.patch_card("".join(out), folder, cfg, tr, ev, _engine_rows)
    return "".join(out)


def write(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("architectures") == ["TandemDFlashDrafter"]:
        import dflash  # a drafter card: no AR metrics or greedy fixtures of its own
        dflash.write_card(folder)
        return
    import lora  # LoRA drafting adapters inside the folder get a section each
    (folder / "MODEL.md").write_text(lora.append_card_sections(render(folder), folder))


def main() -> int:
    parser = argparse.ArgumentParser(description="Render MODEL.md for a model folder.")
    parser.add_argument("folder", type=Path)
    write(parser.parse_args().folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
