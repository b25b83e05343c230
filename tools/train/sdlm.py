"""SDLM parallel-training layout (Sequential Diffusion Language Models, §3.2-3.3).

SDLM predicts a block of D tokens from a noise block X_T = [x[a], <|mask|> x (D-1)] placed at
positions a .. a+D-1 after the clean prefix x[0..a), with *shifted* prediction like an AR
model: the row at position p predicts x[p+1], so the block's D rows predict x[a+1 .. a+D].
Every token of the noise block is "masked" in the sense of the paper (masking probability 1:
the anchor x[a] is the last known token, the D-1 others are <|mask|>), and every row is
trained. With D = 1 the block is the anchor alone and the objective is next-token prediction.

Parallel training (§3.3, eq. 6): a sequence x[0..L] (L inputs plus one more target) is laid
out once as a clean causal stream and then K noise blocks, one per block start, in one forward:

    index      0 .. L-1              L + k*D .. L + k*D + D-1          (k = 0 .. K-1)
    token      x[0..L)               x[a_k], <|mask|> x (D-1)          a_k = r + k*D
    position   0 .. L-1              a_k .. a_k + D-1
    targets    x[1..L] (AR loss)     x[a_k+1 .. a_k+D] (SDLM loss)

The offset r is drawn uniformly from 0..D-1 per sequence (the paper partitions the response
at random positions so that decoding can start anywhere); K = L/D - 1 blocks fit for every r
and together they tile x[r+1 .. r+K*D] — every block of the sequence is trained in the one
forward. Attention (True = query row may read key column):

    clean -> clean   strictly causal (j <= i): the clean stream is a plain causal forward.
    clean -> noise   never.
    noise -> clean   the clean prefix before the block's anchor (j < a_k): the anchor's own
                     clean copy is not read, the block carries it.
    noise -> noise   bidirectional inside the query's own block only (eq. 5).

Loss: L = L_AR + alpha * L_SDLM. L_SDLM is the mean cross entropy over every row of every noise
block (eq. 3, the 1/D sum over the block's targets, averaged over blocks). L_AR on the clean
stream keeps the causal pathway (the one `ar` and the verifier of lossless `nsp` use) sharp;
SDLM itself keeps it implicitly by starting from a pretrained AR model (block size 1).

Inference (`nsp`): after a sequence of T tokens, the extend holds the pending tokens (causal,
their KV kept) and then the noise block [x[T-1], <|mask|> x (D-1)] at positions T-1 .. T+D-2,
which reads the committed prefix x[0..T-1) and itself; its D rows predict x[T .. T+D-1].
"""

from __future__ import annotations

import numpy as np
import torch


def num_blocks(seq_len: int, block_size: int) -> int:
    if block_size < 1 or seq_len % block_size != 0 or seq_len < 2 * block_size:
        raise ValueError(f"seq_len {seq_len} must be a multiple of block_size {block_size} "
                         "and hold at least two blocks")
    return seq_len // block_size - 1


def sample_offsets(rng: np.random.Generator, batch: int, block_size: int) -> np.ndarray:
    """int64 [batch]: each sequence's first anchor r, uniform on 0..D-1."""
    return rng.integers(0, block_size, size=batch)


def anchors(offset: int, seq_len: int, block_size: int) -> np.ndarray:
    """int64 [K]: the anchor position a_k = offset + k*D of every noise block."""
    return offset + block_size * np.arange(num_blocks(seq_len, block_size))


def layout(offset: int, seq_len: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bool [T, T] attention mask, int64 [T] positions) for one sequence, T = L + K*D."""
    L, D = seq_len, block_size
    a = torch.from_numpy(anchors(offset, L, D))
    K = len(a)
    T = L + K * D
    idx = torch.arange(L)
    mask = torch.zeros(T, T, dtype=torch.bool)
    mask[:L, :L] = idx[None, :] <= idx[:, None]
    block_of = torch.arange(K).repeat_interleave(D)  # [K*D]
    anchor_of = a[block_of]  # [K*D]
    mask[L:, :L] = idx[None, :] < anchor_of[:, None]
    mask[L:, L:] = block_of[None, :] == block_of[:, None]
    positions = torch.cat([idx, anchor_of + torch.arange(D).repeat(K)])
    return mask, positions


def build_batch(
    tokens: torch.Tensor,  # int64 [B, L+1]
    offsets: np.ndarray,  # int64 [B] from sample_offsets
    block_size: int,
    mask_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (input_ids [B, T], positions [B, T], mask [B, T, T], ar_targets [B, L],
    block_targets [B, K*D])."""
    B, L = tokens.shape[0], tokens.shape[1] - 1
    D = block_size
    inputs, positions, masks, targets = [], [], [], []
    for b in range(B):
        r = int(offsets[b])
        mask, pos = layout(r, L, D)
        a = torch.from_numpy(anchors(r, L, D))
        block = torch.full((len(a), D), mask_token_id, dtype=torch.int64)
        block[:, 0] = tokens[b, a]
        target_idx = (a[:, None] + 1 + torch.arange(D)[None, :]).flatten()
        inputs.append(torch.cat([tokens[b, :L], block.flatten()]))
        positions.append(pos)
        masks.append(mask)
        targets.append(tokens[b, target_idx])
    return (torch.stack(inputs), torch.stack(positions), torch.stack(masks), tokens[:, 1:],
            torch.stack(targets))


# ---------------------------------------------------------------------------------------------
# Evaluation (evaluate.py calls these for models that serve `nsp`).

NSP_TAUS = (0.9, 0.7, 0.5)  # longest-prefix thresholds of the reference decodes


@torch.no_grad()
def block_metrics(model, windows: torch.Tensor, block_size: int, mask_id: int) -> dict:
    """Held-out SDLM loss (mean CE over every noise-block row, offset-0 tiling) and, per block
    slot k (the row predicting x[a+1+k]), its loss and top-1 accuracy."""
    L = windows.shape[1] - 1
    D = block_size
    mask, positions = layout(0, L, D)
    slot_loss, slot_hit, count = torch.zeros(D), torch.zeros(D), 0
    for batch in windows.split(8):
        b = batch.shape[0]
        inputs, _, _, _, targets = build_batch(batch, np.zeros(b, dtype=np.int64), D, mask_id)
        logits = model(inputs, positions, mask)[:, L:]
        ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                               reduction="none").view(b, -1, D)
        slot_loss += ce.sum((0, 1))
        slot_hit += (logits.argmax(-1) == targets).view(b, -1, D).float().sum((0, 1))
        count += ce.shape[0] * ce.shape[1]
    return {"block_size": D, "loss": float(slot_loss.sum() / (count * D)),
            "loss_by_slot": [float(x / count) for x in slot_loss],
            "top1_by_slot": [float(x / count) for x in slot_hit], "blocks": count}


def _block_logits(model, seq: list[int], mask_id: int, D: int) -> torch.Tensor:
    """[D, vocab]: the noise block [seq[-1], <|mask|> x (D-1)] after the causal prefix
    seq[:-1] (full recompute), mask logits removed."""
    n = len(seq) - 1
    m = torch.ones(n + D, n + D).tril().bool()
    m[n:, n:] = True
    logits = model(torch.tensor([seq + [mask_id] * (D - 1)]), mask=m)[0, n:].clone()
    logits[:, mask_id] = float("-inf")
    return logits


@torch.no_grad()
def longest_prefix_decode(model, prompt: list[int], new_tokens: int, mask_id: int, D: int,
                          tau: float) -> dict:
    """SDLM eq. 7 with logit confidence, greedy: keep the longest prefix of the block's argmax
    tokens whose product of softmax probabilities is >= tau, at least one."""
    seq, forwards = list(prompt), 0
    while len(seq) - len(prompt) < new_tokens:
        probs = _block_logits(model, seq, mask_id, D).softmax(-1)
        forwards += 1
        conf, tok = probs.max(-1)
        take, product = 0, 1.0
        for k in range(D):
            product *= float(conf[k])
            if product < tau:
                break
            take += 1
        seq += tok[:max(take, 1)].tolist()
    return {"continuation_ids": seq[len(prompt):][:new_tokens], "forwards": forwards}


@torch.no_grad()
def verified_decode(model, prompt: list[int], new_tokens: int, mask_id: int, D: int) -> dict:
    """Self-speculative: the block's argmax drafts d0..d(D-1), verified by the causal pathway
    (one forward of the sequence plus the drafts); keeps the matching prefix plus the causal
    pathway's next token. Greedy, so equal to AR greedy. Counts the engine's forwards: a draft
    forward per cycle, and a verify forward when d0 held and drafts remain."""
    seq, forwards, cycles, accepted = list(prompt), 0, 0, 0
    while len(seq) - len(prompt) < new_tokens:
        n = len(seq)
        draft = _block_logits(model, seq, mask_id, D).argmax(-1).tolist()
        forwards += 1
        verify = model(torch.tensor([seq + draft]))[0, n - 1:].argmax(-1).tolist()
        j = 0
        while j < D and draft[j] == verify[j]:
            j += 1
        if j > 0 and D > 1:
            forwards += 1
        seq += draft[:j] + [verify[j]]
        cycles += 1
        accepted += j
    return {"continuation_ids": seq[len(prompt):][:new_tokens], "forwards": forwards,
            "cycles": cycles, "accepted": accepted}


def references(model, cases: list[dict], mask_id: int, D: int, new_tokens: int) -> dict:
    """Reference nsp decodes of the greedy fixture prompts: tokens per forward of longest
    prefix decoding per tau, and of the verified variant (which must match AR greedy)."""
    out = {"block_size": D, "longest_prefix": [], "verified": {}}
    for tau in NSP_TAUS:
        runs = [longest_prefix_decode(model, c["prompt_ids"], new_tokens, mask_id, D, tau)
                for c in cases]
        equal = sum(sum(a == b for a, b in zip(r["continuation_ids"], c["continuation_ids"]))
                    for r, c in zip(runs, cases))
        out["longest_prefix"].append({
            "tau": tau, "confidence": "logit",
            "tokens_per_forward": new_tokens * len(runs) / sum(r["forwards"] for r in runs),
            "fraction_equal_to_ar_greedy": equal / (new_tokens * len(runs))})
    runs = [verified_decode(model, c["prompt_ids"], new_tokens, mask_id, D) for c in cases]
    out["verified"] = {
        "all_match_ar_greedy": all(r["continuation_ids"] == c["continuation_ids"]
                                   for r, c in zip(runs, cases)),
        "tokens_per_forward": new_tokens * len(runs) / sum(r["forwards"] for r in runs),
        "tokens_per_cycle": sum(r["accepted"] + r["cycles"] for r in runs)
                            / sum(r["cycles"] for r in runs)}
    return out


# ---------------------------------------------------------------------------------------------
# Model card (model_card.py renders the common sections; these replace the target-specific ones).

BENCH_COMMAND = ("build/services/cli/tandem bench modes --model models/tandem-sdlm --modes ar,nsp "
                 "--threads 1 --json > models/tandem-sdlm/bench.json")


def _replace_section(text: str, start: str, end: str, new: str) -> str:
    i, j = text.index(start), text.index(end)
    return text[:i] + new + text[j:]


def patch_card(text: str, folder, cfg: dict, tr: dict, ev: dict, engine_rows) -> str:
    import json
    import re

    import model_card  # the AR-NLL note beside engine_rows' column

    recipe = tr["recipe"]
    D, L = recipe["block_size"], recipe["seq_len"]
    K = L // D - 1
    nsp = ev["nsp"]
    last = tr["history"][-1]
    base_loss = model_card.base_ar_loss(folder, cfg["tandem"]["nsp"]["base_model"], ev)
    data = model_card.distilled_data(
        tr, "so the blocks learn to predict what the model itself emits. The causal\n"
            f"pathway trains on the same batches{base_loss}.")
    objective = f"""## Objective (SDLM §3.2-3.3), converted from `{cfg['tandem']['nsp']['base_model']}`

| stage | name | steps | α | wall |
|---|---|---|---|---|
""" + "\n".join(f"| {i + 1} | `{s['name']}` | {s['steps']} | {s['alpha']} | "
                f"{tr['stage_wall_seconds'].get(s['name'], 0) / 60:.1f} min |"
                for i, s in enumerate(recipe["stages"])) + f"""

**Conversion.** Training starts from the weights and tokenizer of the bundled AR target
`models/{cfg['tandem']['nsp']['base_model']}` (SDLM converts a pretrained AR model: with block size 1
its objective is next-token prediction), same architecture, and fine-tunes it with
L = L_AR + α·L_SDLM.
{data}
**Layout** (`tools/train/sdlm.py`, the parallel training of §3.3 / eq. 6): a window x[0..L]
(L = {L}) is laid out as the clean stream x[0..L) (strictly causal, positions 0..L-1) followed by
{K} noise blocks of D = {D}. Block k is `[x[a], <|mask|> x {D - 1}]` at positions a..a+{D - 1} with anchor
a = r + {D}k; the offset r is uniform on 0..{D - 1} per sequence, so the blocks tile the whole window
and the decoding start positions vary. A block row attends to the clean tokens before its
anchor and bidirectionally to its own block (eq. 5); clean rows never see noise rows.

**Loss.** Shifted prediction: the block row at position p predicts x[p+1], so a block predicts
x[a+1..a+{D}] (eq. 3; every block token is masked, masking probability 1). L_SDLM is the mean cross
entropy over every row of every block; L_AR is the clean stream's next-token loss, which keeps
the causal pathway that `ar` and the verified `nsp` variant decode with. α = {recipe['stages'][0]['alpha']}.

**Inference layout:** after T tokens the engine extends `[pending tokens (causal, KV kept) |
x[T-1], <|mask|> x {D - 1} at positions T-1..T+{D - 2}]`; the block rows read the committed prefix
x[0..T-1) and each other, and predict x[T..T+{D - 1}].

"""
    text = _replace_section(text, "## Objective", "## Training", objective)
    text = text.replace("`tandem bench modes --modes ar,spec --json` against the target (engine)",
                        "`tandem bench modes --modes ar,nsp --json` (engine)")
    text = text.replace("(stage 2 runs each twice)",
                        f"(each also as {K} noise blocks), starting from the target's weights")
    text = re.sub(r"(Final training losses \(mean of the last logged window\): AR [0-9.]+)",
                  rf"\1, SDLM block {last['diff_loss']:.3f}", text)
    if tr.get("resumed"):
        text = text.replace(
            "\n## Held-out results",
            f"""
This run was resumed from a checkpoint (`--resume`): the stage wall time above covers every
step, the wall time of the line before only the resumed process. Resuming is exact (batches are
keyed by step), so the weights are those of an uninterrupted run.

## Held-out results""", 1)
    slots_loss = ", ".join(f"{x:.2f}" for x in nsp["loss_by_slot"])
    slots_top1 = ", ".join(f"{x:.0%}" for x in nsp["top1_by_slot"])
    rows = (f"| SDLM block loss (all {D} rows of every block, offset-0 tiling) | "
            f"**{nsp['loss']:.3f} nats/token** |\n")
    text = text.replace("| AR top-1 accuracy |", rows + "| AR top-1 accuracy |", 1)
    dec = nsp["decodes"]
    lp = "; ".join(f"τ = {d['tau']}: {d['tokens_per_forward']:.2f} tokens per forward, "
                   f"{d['fraction_equal_to_ar_greedy']:.0%} of tokens equal to AR greedy's"
                   for d in dec["longest_prefix"])
    ver = dec["verified"]
    held = f"""
Block rows by slot k (row k predicts the token k+1 after the anchor): loss {slots_loss} nats;
top-1 accuracy {slots_top1}.

Reference decodes of the 8 fixture prompts (32 new tokens, full recompute in Python): longest
prefix decoding (logit confidence, a lossy mode) {lp}. Self-speculative (block drafts verified
by the causal pathway): {ver['tokens_per_cycle']:.2f} tokens per cycle, {ver['tokens_per_forward']:.2f}
tokens per forward, reproduces AR greedy: {'yes' if ver['all_match_ar_greedy'] else '**no**'}.
"""
    text = text.replace("\n## Modes\n", held + "\n## Modes\n", 1)
    modes = f"""## Modes

Serves `ar` and `nsp` (next sequence prediction, `docs/MODES.md`). `config.json` carries
`block_size` = {cfg['block_size']}, `mask_token_id` = {cfg['mask_token_id']} and
`tandem.nsp` (prediction `shifted`). `nsp` with `nsp_verify` (a draft forward, then a verify
forward) or `nsp_quadratic` (drafting and verification in one forward) is lossless; without them
(longest prefix decoding at threshold `nsp_tau`) it is lossy.
"""
    bench_path = folder / "bench.json"
    if bench_path.exists():
        bench = json.loads(bench_path.read_text())
        modes += f"""
**In the engine** (greedy, {bench['max_tokens']} new tokens per prompt, prompts of
`fixtures/bench_prompts.json`, {bench['threads']} thread(s); `bench.json`):

{engine_rows(bench)}

TPF: completion tokens per forward (every forward counts); acc.len: tokens committed per
drafting step (for longest prefix decoding every step drafts the block); seq=AR: prompts whose
output equals AR greedy's. {model_card.AR_NLL_NOTE} Command:

```sh
{BENCH_COMMAND}
```
"""
    modes += f"""
**Limitations.** {tr['parameters'] / 1e6:.1f}M parameters and {tr['steps_done']} conversion steps. Longest prefix
decoding takes even its first token from the block row rather than the causal one, so it drifts
from AR greedy (`seq=AR`), and the block's later slots pass the default threshold on only part
of the steps; lower thresholds commit more per forward at a higher AR-NLL. Its argmax drafts are
right more often than they are confident: the verified variants, which are lossless, accept a
good share of them. On a CPU the quadratic variant's steps (up to D² + D rows) cost more wall
time than its forwards save (`docs/PERF.md`, the extend costs); on a GPU a step of that width
costs little more than a decode step. tok/s moves with the machine's load; read it as an order
of magnitude.
"""
    return _replace_section(text, "## Modes", "## Samples", modes + "\n")
