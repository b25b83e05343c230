"""Introspective-consistency training layout (I-DLM §3.1, attention mask of its Appendix E).

A training sequence x[0..L) (L a multiple of the stride block S) is fed twice, at the same RoPE
positions 0..L-1, the all-masked copy first:

    index   0 .. L-1                 L .. 2L-1
    stream  x_t = <|mask|> * L       clean x_0

Attention (True = query row may read key column); every query reads only keys at positions
before or at its own, so the whole layout is strictly causal:
    noisy -> noisy   causal inside the query's own block of S (j <= i, same block).
    noisy -> clean   the clean tokens of the blocks before the query's block (j < S * block(i)).
    clean -> clean   strictly causal (j <= i): the clean stream is a plain AR forward.
    clean -> noisy   never.

Logit shift: the logits at position p predict x[p+1] in both streams, as an AR model's do. The
clean logits are the causal anchor p (the introspection / verify distribution); the logits of
the mask at block offset o predict the token o + 2 places after the last clean token it sees
(o + 1 masks stand between), which is exactly what the k-th of the N-1 masks appended after a
clean tail predicts at inference (k = o + 1). So a recipe with block S serves strides N <= S + 1.

Loss (I-DLM eq. 1-2): cross-entropy with shifted labels on every masked position (L_mask) and
on every clean position (L_clean), auto-balanced as L = L_mask + s * L_clean with
s = L_mask / L_clean held constant within the step (detached), so the introspection pathway
gets the same effective gradient magnitude as the harder decode pathway.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def idlm_mask(seq_len: int, block_size: int) -> torch.Tensor:
    """bool [2L, 2L] attention mask of the [noisy | clean] layout described above."""
    if seq_len % block_size != 0:
        raise ValueError(f"seq_len {seq_len} is not a multiple of block_size {block_size}")
    idx = torch.arange(seq_len)
    block = idx // block_size
    noisy_noisy = (block[None, :] == block[:, None]) & (idx[None, :] <= idx[:, None])
    noisy_clean = idx[None, :] < (block * block_size)[:, None]
    clean_clean = idx[None, :] <= idx[:, None]
    top = torch.cat([noisy_noisy, noisy_clean], dim=1)
    bottom = torch.cat([torch.zeros(seq_len, seq_len, dtype=torch.bool), clean_clean], dim=1)
    return torch.cat([top, bottom], dim=0)


def idlm_positions(seq_len: int) -> torch.Tensor:
    """int64 [2L]: both streams sit at positions 0..L-1."""
    idx = torch.arange(seq_len)
    return torch.cat([idx, idx])


def build_batch(tokens: torch.Tensor, mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens int64 [B, L+1] -> (input_ids [B, 2L] = [all masks | x], targets [B, L] = x[1:]).

    The same shifted targets serve both streams."""
    x = tokens[:, :-1]
    return torch.cat([torch.full_like(x, mask_token_id), x], dim=1), tokens[:, 1:]


def losses(model, tokens: torch.Tensor, mask_token_id: int, layout: tuple) -> tuple:
    """Returns (loss, clean_loss, mask_loss, balance s) for a batch of [B, L+1] windows."""
    mask, positions = layout
    L = tokens.shape[1] - 1
    inputs, targets = build_batch(tokens, mask_token_id)
    logits = model(inputs, positions, mask)
    flat = targets.flatten()
    mask_loss = F.cross_entropy(logits[:, :L].flatten(0, 1), flat)
    clean_loss = F.cross_entropy(logits[:, L:].flatten(0, 1), flat)
    s = (mask_loss / clean_loss).detach()
    return mask_loss + s * clean_loss, clean_loss, mask_loss, s


@torch.no_grad()
def metrics(model, windows: torch.Tensor, block_size: int, mask_token_id: int,
            batch: int = 8) -> dict:
    """Held-out numbers of both pathways on [n, L+1] windows: mask and clean losses, and per
    block offset o (= mask k - 1 at inference) the mask loss, how often the mask's argmax
    equals the clean anchor's argmax for the same target (greedy ISD acceptance given a true
    prefix) and the mean of sum_v min(p, q) (ISD's acceptance probability when sampling)."""
    L = windows.shape[1] - 1
    layout = (idlm_mask(L, block_size), idlm_positions(L))
    offsets = torch.arange(L) % block_size
    tot = {"mask": 0.0, "clean": 0.0}
    per = {k: torch.zeros(block_size, dtype=torch.float64) for k in ("loss", "agree", "overlap")}
    count, per_count = 0, torch.zeros(block_size, dtype=torch.float64)
    for rows in windows.split(batch):
        inputs, targets = build_batch(rows, mask_token_id)
        logits = model(inputs, layout[1], layout[0])
        q_logits, p_logits = logits[:, :L], logits[:, L:]
        ce_q = F.cross_entropy(q_logits.flatten(0, 1), targets.flatten(), reduction="none")
        ce_p = F.cross_entropy(p_logits.flatten(0, 1), targets.flatten(), reduction="none")
        tot["mask"] += float(ce_q.sum())
        tot["clean"] += float(ce_p.sum())
        count += ce_q.numel()
        agree = (q_logits.argmax(-1) == p_logits.argmax(-1)).double().flatten()
        overlap = torch.minimum(q_logits.softmax(-1), p_logits.softmax(-1)).sum(-1).double()
        off = offsets.repeat(rows.shape[0])
        per["loss"].index_add_(0, off, ce_q.double())
        per["agree"].index_add_(0, off, agree)
        per["overlap"].index_add_(0, off, overlap.flatten())
        per_count.index_add_(0, off, torch.ones_like(agree))
    return {
        "mask_loss": tot["mask"] / count,
        "clean_loss": tot["clean"] / count,
        "tokens": count,
        "by_mask": [{"mask": o + 1, "tokens_ahead": o + 2,
                     "loss": float(per["loss"][o] / per_count[o]),
                     "argmax_agreement": float(per["agree"][o] / per_count[o]),
                     "mean_min_p_q": float(per["overlap"][o] / per_count[o])}
                    for o in range(block_size)],
    }


def appendix_b_tpf(acceptance: list[float], stride: int) -> float:
    """I-DLM eq. 3: TPF_N = (2 + P_1 + ... + P_{N-2}) / (2 - P_{N-1}), P_k = p_1 ... p_k."""
    cumulative = [1.0]
    for k in range(1, stride):
        cumulative.append(cumulative[-1] * acceptance[k - 1])
    return (2.0 + sum(cumulative[1:stride - 1])) / (2.0 - cumulative[stride - 1])


def _replace_section(text: str, start: str, end: str, new: str) -> str:
    i, j = text.index(start), text.index(end)
    return text[:i] + new + text[j:]


BENCH_COMMAND = ("build/services/cli/tandem bench modes --model models/tandem-idlm "
                 "--modes ar,isd --json > models/tandem-idlm/bench.json")


def bench_rows(bench: dict) -> str:
    """TPF and acceptance of each `tandem bench modes` variant, by prompt category and overall.
    Wall-clock columns are left out: they are only comparable on a quiet machine."""
    cats = sorted({r["category"] for r in bench["results"]})
    sums: dict[str, dict] = {}
    for r in bench["results"]:
        t = sums.setdefault(r["variant"], {"tokens": 0, "forwards": 0, "steps": 0,
                                           "drafted": 0, "accepted": 0, "exact": 0,
                                           "prompts": 0, "by_cat": {}})
        t["by_cat"][r["category"]] = r["tokens_per_forward"]
        for k, src in (("tokens", "tokens"), ("forwards", "forwards"), ("steps", "steps_with_drafts"),
                       ("drafted", "drafted_tokens"), ("accepted", "accepted_tokens"),
                       ("prompts", "prompts")):
            t[k] += r[src]
        t["exact"] += r["exact_match_sequences"] * r["prompts"]
    lines = ["| variant | TPF | " + " | ".join(f"TPF {c}" for c in cats)
             + " | acc.len | drafts accepted | seq=AR |",
             "|---|---|" + "---|" * len(cats) + "---|---|---|"]
    for name, t in sums.items():
        acc = f"{(t['accepted'] + t['steps']) / t['steps']:.2f}" if t["steps"] else "-"
        rate = f"{t['accepted'] / t['drafted']:.0%}" if t["drafted"] else "-"
        lines.append(f"| `{name}` | **{t['tokens'] / t['forwards']:.2f}** | "
                     + " | ".join(f"{t['by_cat'].get(c, 0):.2f}" for c in cats)
                     + f" | {acc} | {rate} | {t['exact'] / t['prompts']:.0%} |")
    return "\n".join(lines)


def patch_card(text: str, folder, cfg: dict, tr: dict, ev: dict, engine_rows) -> str:
    """Rewrites the target-shaped sections of MODEL.md for an I-DLM folder."""
    import json
    import re

    import model_card

    recipe = tr["recipe"]
    S, L = recipe["block_size"], recipe["seq_len"]
    isd = ev["isd"]
    base = cfg["tandem"]["isd"]["base_model"]
    last = tr["history"][-1]
    first = tr["history"][0]
    base_loss = model_card.base_ar_loss(folder, base, ev)
    data = model_card.distilled_data(
        tr, "so the masks learn to propose what the model itself emits, which is what\n"
            "ISD's introspection accepts.")
    objective = f"""## Objective (I-DLM §3.1), converted from `{base}`

| stage | name | steps | wall |
|---|---|---|---|
""" + "\n".join(f"| {i + 1} | `{s['name']}` | {s['steps']} | "
                f"{tr['stage_wall_seconds'].get(s['name'], 0) / 60:.1f} min |"
                for i, s in enumerate(recipe["stages"])) + f"""

**Conversion.** As I-DLM converts a pretrained AR model (Qwen3) into an introspective diffusion
model, training starts from the weights and tokenizer of the bundled AR target `models/{base}`
(same architecture) and runs one stage of introspective-consistency training.
{data}
**Layout** (`tools/train/idlm.py`, the mask of I-DLM Appendix E): a window x[0..L) (L = {L}) is
fed as `[x_t | x_0]`, an all-`<|mask|>` copy followed by the clean sequence, both at positions
0..L-1. Attention is strictly causal everywhere: a clean token sees the clean tokens before it
(a plain AR forward, never the masks); a mask sees the masks of its own block of {S} up to itself
and the clean tokens of the blocks before its block.

**Logit shift.** Every row predicts the *next* token, clean and mask rows alike: the clean rows
are the causal anchor p (the AR distribution, used to verify), and the mask at block offset o,
which sees the clean prefix up to o + 1 positions before itself, learns to propose the token
o + 2 places past that prefix (q). At inference the k-th of N - 1 masks appended after the clean
tail is exactly offset k - 1, so this model serves ISD strides N ≤ {S + 1}.

**Loss** (eq. 1-2): cross-entropy with shifted labels on every mask row (L_mask, all-masked:
every position is supervised) and on every clean row (L_clean), auto-balanced as
L = L_mask + ŝ·L_clean with ŝ = L_mask / L_clean detached each step, so the introspection
pathway gets the same effective gradient magnitude as the harder decode pathway. At the first
logged window L_clean = {first['ar_loss']:.3f} (the target's AR loss) and L_mask = {first['diff_loss']:.3f}; at the
last, L_clean = {last['ar_loss']:.3f} and L_mask = {last['diff_loss']:.3f} nats/token.

"""
    text = _replace_section(text, "## Objective", "## Training", objective)
    if tr.get("resumed"):
        steps_wall = sum(tr["stage_wall_seconds"].values()) / 60
        text = re.sub(r"training took\s+([0-9.]+) min wall \(data and tokenizer preparation included\)",
                      f"the {tr['steps_done']} steps took {steps_wall:.1f} min (sum of step times; the run "
                      "was interrupted and resumed from its checkpoint, which reproduces an "
                      r"uninterrupted run; the resumed process took \1 min wall)", text)
    text = text.replace("(stage 2 runs each twice)",
                        "(each also as a fully masked copy), starting from the target's weights")
    text = re.sub(r"(Final training losses \(mean of the last logged window\): )AR ([0-9.]+)",
                  rf"\1clean (AR) \2, mask {last['diff_loss']:.3f}", text)
    text = text.replace("| AR top-1 accuracy |",
                        f"| mask loss (all-masked, every offset) | **{isd['mask_loss']:.3f} "
                        "nats/token** |\n| AR top-1 accuracy |", 1)
    rows = "\n".join(
        f"| {b['mask']} | {b['tokens_ahead']} | {b['loss']:.3f} | {b['argmax_agreement']:.1%} | "
        f"{b['mean_min_p_q']:.1%} |" for b in isd["by_mask"])
    pred = ", ".join(f"N = {n}: {t:.2f}" for n, t in isd["appendix_b_tpf_greedy"].items())
    held = f"""
Mask rows by position k after the clean tail (held-out windows, true prefixes):

| mask k | token ahead | loss | argmax q = argmax p | Σ min(p, q) |
|---|---|---|---|---|
{rows}

"argmax q = argmax p" is the chance that ISD's greedy introspection accepts that draft given a
correct prefix; Σ min(p, q) is its acceptance probability when proposals are sampled. Treating
the slots as independent, Appendix B's TPF_N = (2 + P_1 + … + P_{{N-2}}) / (2 - P_{{N-1}}) predicts
for greedy ISD: {pred}.

**Limitations.** {tr['parameters'] / 1e6:.1f}M parameters and {tr['steps_done']} conversion steps; the clean
pathway trains on the same batches{base_loss}. On held-out *corpus* text (the table above)
the first mask proposes the next-but-one token as the clean pathway would {isd['by_mask'][0]['argmax_agreement']:.0%} of the time, far from
the ≥ 85% per-token acceptance I-DLM reports at 8B; on the model's own greedy continuations,
which are what ISD decodes, it agrees far more often, and the engine's tokens per forward below
are the measure of the mode.
"""
    text = text.replace("\n## Modes", held + "\n## Modes", 1)
    engine = ""
    bench_path = folder / "bench.json"
    if bench_path.exists():
        bench = json.loads(bench_path.read_text())
        engine = f"""
**In the engine** (`tandem bench modes`, greedy, {bench['max_tokens']} new tokens per prompt, the
prompts of `fixtures/bench_prompts.json`, {bench['threads']} thread(s); `bench.json`):

{bench_rows(bench)}

TPF: completion tokens per forward (prefill included); acc.len: tokens committed per step
that verified drafts (accepted drafts + 1); drafts accepted: of the drafts verified; `isd` is
N = 4; `seq=AR` 100% is the lossless check. In the memory-bound decode regime an extend of
at most 2N - 1 tokens costs about what an AR step does (I-DLM §3.2), so TPF is the speed-up
to expect there; this CPU's wall-clock numbers (in `bench.json`) were taken on a shared, loaded
machine and are not comparable between rows.
Command:

```sh
{BENCH_COMMAND}
```
"""
    modes = f"""## Modes

Serves `ar` (the clean pathway is an AR model: plain causal forwards) and `isd` (introspective
strided decoding, docs/MODES.md): each step is one causal extend of up to 2N - 1 tokens, the
previous step's exact token and N - 1 drafts (introspected against their causal anchors) and
N - 1 fresh masks (the next drafts). `config.json` carries `mask_token_id` =
{cfg.get('mask_token_id')} and `tandem.isd` (block {S}, strides up to {S + 1}, shifted prediction).
{engine}
"""
    text = _replace_section(text, "## Modes", "## Samples", modes)
    text = text.replace("`tandem bench modes --modes ar,spec --json` against the target (engine)",
                        "`tandem bench modes --modes ar,isd --json` (engine)")
    return text
