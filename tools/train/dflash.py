#!/usr/bin/env python3
"""DFlash drafter: block-diffusion drafts conditioned on the target's hidden states.

The drafter owns no embeddings and no LM head: it embeds with the target's `embed_tokens` and
reads out with the target's (tied) `lm_head`, both frozen. What it adds:

  context  c_t = hidden_norm(fc(concat_{l in target_layer_ids} h_l[t]))   for t = 0..p-1
           (h_l = the target's residual stream after l decoder layers, before the final norm)
  block    [x_p .. x_{p+a-1}, <|mask|> x (B - a)] at positions p..p+B-1 (a >= 1 known tokens)
  layer    Qwen3 layer whose attention keys/values are [k_proj(c) | k_proj(block)]: the block
           queries see every context row and every block row (no causal mask inside the
           block); c is the same in every layer and skips input_layernorm
  output   norm, then the target's lm_head; slot j predicts the token AT p + j; drafts are
           the argmax of slots a..B-1.

Training (`train`): the frozen target runs on each row once (hidden states and its own
logits); many blocks (p, a) per row go through the drafter in one forward, each block seeing
the context rows before its own start p. Loss on the drafted slots: cross-entropy against the
target's greedy token + kl_weight x KL(target || drafter), slot k weighted exp(-(k-1)/decay).

    .venv/bin/python tools/train/train.py --recipe dflash        # train, export, eval, card
    .venv/bin/python tools/train/dflash.py models/tandem-dflash  # re-run eval, fixtures, card
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO_ROOT = HERE.parents[1]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import data  # noqa: E402
import distill  # noqa: E402
from model import DecoderLayer, ModelConfig, Qwen3LM, RMSNorm, Rotary, rotate_half  # noqa: E402

ARCHITECTURE = "TandemDFlashDrafter"
LOG_EVERY = 10
CHECKPOINT_EVERY = 50


# ---------------------------------------------------------------------------------------------
# Model.


class DFlashDrafter(nn.Module):
    """State-dict keys are the checkpoint's tensor names (fc.weight, hidden_norm.weight,
    layers.{i}.*, norm.weight); the rotary table is not persistent."""

    def __init__(self, c: ModelConfig, num_target_layers: int, block_size: int):
        super().__init__()
        self.config = c
        self.block_size = block_size
        self.fc = nn.Linear(num_target_layers * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = Rotary(c.head_dim, c.rope_theta)

    def init_weights(self, generator: torch.Generator) -> None:
        """As Qwen3LM.init_weights: N(0, 0.02), residual outputs scaled by 1/sqrt(2 layers)."""
        c = self.config
        out_std = c.initializer_range / math.sqrt(2 * c.num_hidden_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, out_std, generator=generator)
            else:
                nn.init.normal_(p, 0.0, c.initializer_range, generator=generator)

    def forward(
        self,
        block_emb: torch.Tensor,  # [N, Q, H] target embeddings of the block tokens
        block_pos: torch.Tensor,  # [N, Q] int64 positions
        ctx_hidden: torch.Tensor,  # [N, C, k*H] concatenated target hidden rows
        ctx_pos: torch.Tensor,  # [N, C] int64 positions
        mask: torch.Tensor | None,  # bool [N, Q, C + Q], True = may attend; None = all
    ) -> torch.Tensor:  # [N, Q, H] after the final norm (apply the target's lm_head)
        c = self.hidden_norm(self.fc(ctx_hidden))
        cos_q, sin_q = self.rotary(block_pos)
        cos_c, sin_c = self.rotary(ctx_pos)
        m = None if mask is None else mask[:, None]
        x = block_emb
        for layer in self.layers:
            x = _layer(layer, x, c, cos_q, sin_q, cos_c, sin_c, m)
        return self.norm(x)


def _layer(layer: DecoderLayer, x, c, cos_q, sin_q, cos_c, sin_c, mask):
    attn = layer.self_attn
    nh, nkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    h = layer.input_layernorm(x)
    n, t, _ = h.shape
    s = c.shape[1]
    q = attn.q_norm(attn.q_proj(h).view(n, t, nh, d)).transpose(1, 2)
    k_blk = attn.k_norm(attn.k_proj(h).view(n, t, nkv, d)).transpose(1, 2)
    v_blk = attn.v_proj(h).view(n, t, nkv, d).transpose(1, 2)
    # Context rows are projected raw (no input_layernorm): hidden_norm already normalised them.
    k_ctx = attn.k_norm(attn.k_proj(c).view(n, s, nkv, d)).transpose(1, 2)
    v_ctx = attn.v_proj(c).view(n, s, nkv, d).transpose(1, 2)
    q = q * cos_q + rotate_half(q) * sin_q
    k_blk = k_blk * cos_q + rotate_half(k_blk) * sin_q
    k_ctx = k_ctx * cos_c + rotate_half(k_ctx) * sin_c
    group = nh // nkv  # query head h reads KV head h // group
    k = torch.cat([k_ctx, k_blk], dim=2).repeat_interleave(group, dim=1)
    v = torch.cat([v_ctx, v_blk], dim=2).repeat_interleave(group, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale 1/sqrt(head_dim)
    x = x + attn.o_proj(y.transpose(1, 2).reshape(n, t, nh * d))
    return x + layer.mlp(layer.post_attention_layernorm(x))


@torch.no_grad()
def target_states(target: Qwen3LM, tokens: torch.Tensor, layer_ids) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """A causal forward of the frozen target over tokens [N, T]: (hidden [N, T, k*H], the
    concatenation of the residual stream after l layers for l in layer_ids; logits [N, T, V])."""
    n, t = tokens.shape
    cos, sin = target.rotary(torch.arange(t, device=tokens.device).expand(n, t))
    x = target.model.embed_tokens(tokens)
    rows = [x]
    for layer in target.model.layers:
        x = layer(x, cos, sin, None)
        rows.append(x)
    logits = target.lm_head(target.model.norm(x)).float()
    return torch.cat([rows[l] for l in layer_ids], dim=-1), logits


def block_layout(starts: torch.Tensor, anchors: torch.Tensor, tokens: torch.Tensor,
                 block_size: int, mask_id: int):
    """Blocks (p, a) over rows tokens [N, T]: starts, anchors [N, n] (1 <= p, p + B <= T).
    Returns block ids [N, n*B], block positions [N, n*B], the attention mask [N, n*B, T + n*B]
    (context rows t < p of its own block, then the rows of its own block) and the drafted-slot
    mask [N, n*B] (slots >= a)."""
    n_rows, n_blocks = starts.shape
    t = tokens.shape[1]
    slot = torch.arange(block_size, device=tokens.device)
    pos = (starts[:, :, None] + slot).reshape(n_rows, -1)
    drafted = (slot[None, None, :] >= anchors[:, :, None]).reshape(n_rows, -1)
    ids = torch.where(drafted, torch.full_like(pos, mask_id), tokens.gather(1, pos))
    ctx_ok = torch.arange(t, device=tokens.device)[None, None, :] < starts[:, :, None]
    ctx_ok = ctx_ok.repeat_interleave(block_size, dim=1)  # [N, n*B, T]
    blk = torch.arange(n_blocks, device=tokens.device).repeat_interleave(block_size)
    blk_ok = (blk[:, None] == blk[None, :]).expand(n_rows, -1, -1)
    return ids, pos, torch.cat([ctx_ok, blk_ok], dim=-1), drafted


def draft_logits(drafter: DFlashDrafter, target: Qwen3LM, tokens: torch.Tensor,
                 hidden: torch.Tensor, starts: torch.Tensor, anchors: torch.Tensor,
                 mask_id: int) -> torch.Tensor:
    """Logits [N, n, B, V] of every block (p, a) over rows tokens [N, T] whose target hidden
    rows are hidden [N, T, k*H] (each block reads only rows t < p)."""
    b = drafter.block_size
    ids, pos, mask, _ = block_layout(starts, anchors, tokens, b, mask_id)
    n, t = tokens.shape
    ctx_pos = torch.arange(t, device=tokens.device).expand(n, t)
    # The target's embeddings and LM head are read, never trained (detached).
    emb = target.model.embed_tokens.weight.detach()
    h = drafter(F.embedding(ids, emb), pos, hidden, ctx_pos, mask)
    return F.linear(h, target.lm_head.weight.detach()).float().view(n, starts.shape[1], b, -1)



# ---------------------------------------------------------------------------------------------
# Training data and loss.


class RowSampler:
    """Training rows [B, T] (distilled rows of prompt + target greedy continuation, and raw train
    windows) with their blocks (p, a), all drawn from the step's generator. A distilled row's
    blocks draft only continuation tokens (p + a >= prompt length), where the row IS the
    target's greedy chain; a raw row's blocks may start anywhere."""

    def __init__(self, rows: np.ndarray, prompt_lens: np.ndarray, stream: np.ndarray,
                 raw_fraction: float, spec, block_size: int):
        self.rows, self.plens, self.stream = rows, prompt_lens, stream
        self.raw_fraction, self.spec, self.block_size = raw_fraction, spec, block_size

    def __call__(self, rng: np.random.Generator, batch: int):
        t = self.rows.shape[1]
        n_raw = round(batch * self.raw_fraction)
        picks = rng.integers(0, len(self.rows), size=batch - n_raw)
        tokens = [self.rows[picks].astype(np.int64)]
        first_draft = list(self.plens[picks])  # smallest p + a per row
        if n_raw:
            tokens.append(data.sample_windows(rng, self.stream, n_raw, t).numpy())
            first_draft += [1] * n_raw
        nb, s = self.spec.blocks_per_row, self.spec
        anchors = np.where(rng.random((batch, nb)) < s.anchor_one_prob, 1,
                           rng.integers(2, s.max_anchor + 1, size=(batch, nb)))
        lo = np.maximum(1, np.asarray(first_draft)[:, None] - anchors)
        hi = t - self.block_size  # inclusive: the block's last slot is row token t - 1
        starts = lo + np.floor(rng.random((batch, nb)) * (hi - lo + 1)).astype(np.int64)
        return (torch.from_numpy(np.concatenate(tokens)), torch.from_numpy(starts),
                torch.from_numpy(anchors.astype(np.int64)))


def slot_weights(block_size: int, anchors: torch.Tensor, decay: float) -> torch.Tensor:
    """[N, n, B]: exp(-(k-1)/decay) for the k-th drafted slot (k = j - a + 1), 0 elsewhere."""
    j = torch.arange(block_size, device=anchors.device)[None, None, :]
    k = j - anchors[:, :, None] + 1
    return torch.where(k >= 1, torch.exp(-(k - 1).clamp(min=0) / decay), 0.0)


def step_loss(drafter, target, spec, tokens, starts, anchors, mask_id, block_size):
    """(loss, CE, KL, drafted-slot accuracy vs the target's greedy token)."""
    hidden, tlogits = target_states(target, tokens, spec.target_layer_ids)
    n = tokens.shape[0]
    label_pos = starts[:, :, None] + torch.arange(block_size, device=tokens.device)
    # Slot j predicts the token at p + j; the target's greedy token there is the argmax of its
    # logits one position earlier (p >= 1, so label_pos - 1 >= 0).
    t_logits = tlogits[torch.arange(n, device=tokens.device)[:, None, None], label_pos - 1]
    w = slot_weights(block_size, anchors, spec.slot_decay)
    sel = w > 0
    logits = draft_logits(drafter, target, tokens, hidden, starts, anchors, mask_id)[sel]
    t_logits, w = t_logits[sel], w[sel]
    labels = t_logits.argmax(-1)
    logq = F.log_softmax(logits, -1)
    ce = F.nll_loss(logq, labels, reduction="none")
    logp = F.log_softmax(t_logits, -1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    loss = (w * (ce + spec.kl_weight * kl)).sum() / w.sum()
    acc = (logits.argmax(-1) == labels).float().mean()
    return loss, ce.mean().detach(), kl.mean().detach(), acc.detach()


# ---------------------------------------------------------------------------------------------
# Export.


def hf_config(recipe, tok) -> dict:
    import export
    cfg = export.hf_config(recipe, tok)
    cfg["architectures"] = [ARCHITECTURE]
    spec = recipe.dflash
    cfg["dflash"] = {"target_layer_ids": list(spec.target_layer_ids), "target": spec.target,
                     "max_anchor": spec.max_anchor}
    cfg["tandem"] = {"recipe": recipe.name, "description": recipe.description,
                     "modes": list(recipe.modes), "role": "drafter",
                     "drafter_for": f"models/{spec.target}"}
    return cfg


def write(out: Path, drafter: DFlashDrafter, recipe, tok) -> None:
    import export
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(recipe, tok)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    generation = {"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"],
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    sd = {k: v.detach().to("cpu", export.WEIGHTS_DTYPE).contiguous()
          for k, v in drafter.state_dict().items()}
    save_file(dict(sorted(sd.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))


def load(folder: Path) -> tuple[DFlashDrafter, dict]:
    """The exported drafter, fp32 (bf16 weights upcast exactly)."""
    import export
    from safetensors.torch import load_file
    cfg = json.loads((folder / "config.json").read_text())
    if cfg["architectures"] != [ARCHITECTURE]:
        raise ValueError(f"{folder}/config.json: architectures {cfg['architectures']}, "
                         f"want [{ARCHITECTURE!r}]")
    mc = export.model_config_from_hf(cfg)
    drafter = DFlashDrafter(mc, len(cfg["dflash"]["target_layer_ids"]), cfg["block_size"])
    sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    drafter.load_state_dict(sd, strict=True)
    return drafter.eval(), cfg


# ---------------------------------------------------------------------------------------------
# Held-out evaluation and fixtures.


def _anchor_range(prompt_len: int, total: int, a: int, block_size: int) -> range:
    """Starts p whose drafted slots p+a..p+B-1 all lie in the target's greedy continuation."""
    return range(max(1, prompt_len - a), total - block_size + 1)


@torch.no_grad()
def held_out_metrics(drafter, target, cfg: dict, held_stream: np.ndarray, ar_drafter=None,
                     prompts: int = 64, prompt_len: int = 64, new_tokens: int = 64,
                     seed: int = 5, chunk: int = 8, unigram_logp: np.ndarray | None = None
                     ) -> dict:
    """On held-out prompts continued greedily by the target (g): per-slot agreement of the
    drafts with g at every a = 1..max_anchor, and greedy speculative decoding simulated at
    a = 1 (anchor = the last committed token, context = the target rows before it; accept the
    drafts' prefix that equals g, plus the target's own token): mean tokens per step."""
    b, mask_id = cfg["block_size"], cfg["mask_token_id"]
    layer_ids = cfg["dflash"]["target_layer_ids"]
    rng = np.random.default_rng(seed)
    starts_np = rng.integers(0, len(held_stream) - prompt_len + 1, size=prompts)
    p = torch.from_numpy(np.stack([held_stream[s:s + prompt_len] for s in starts_np])
                         .astype(np.int64))
    seq = torch.cat([p, distill.greedy_continue(target, p, new_tokens)], dim=1)
    total = seq.shape[1]
    result = {"prompts": prompts, "prompt_len": prompt_len, "new_tokens": new_tokens,
              "seed": seed, "block_size": b, "by_anchor": {}}
    drafts_a1 = None
    for a in range(1, cfg["dflash"]["max_anchor"] + 1):
        rng_p = _anchor_range(prompt_len, total, a, b)
        st = torch.tensor(list(rng_p)).expand(prompts, -1)
        an = torch.full_like(st, a)
        preds, nll = [], []
        gold = seq.gather(1, (st[:, :, None] + torch.arange(b)).reshape(prompts, -1))
        for lo in range(0, prompts, chunk):
            rows = seq[lo:lo + chunk]
            hidden, _ = target_states(target, rows, layer_ids)
            logits = draft_logits(drafter, target, rows, hidden, st[lo:lo + chunk],
                                  an[lo:lo + chunk], mask_id)  # [n, blocks, B, V]
            preds.append(logits.argmax(-1))
            if a == 1:
                g = gold[lo:lo + chunk].view(logits.shape[:3])[:, :, a:]
                logq = F.log_softmax(logits[:, :, a:], -1)
                nll.append(-logq.gather(-1, g[..., None]).squeeze(-1).flatten())
        pred = torch.cat(preds)  # [N, n, B]
        ok = (pred == gold.view(pred.shape))[:, :, a:]  # [N, n, B - a]
        run = torch.cumprod(ok.int(), dim=-1).sum(-1).float()
        result["by_anchor"][str(a)] = {
            "blocks": int(ok.shape[0] * ok.shape[1]),
            "per_slot_agreement": [round(float(x), 4) for x in ok.float().mean((0, 1))],
            "mean_accepted_drafts": round(float(run.mean()), 4)}
        if a == 1:
            drafts_a1 = (ok, list(rng_p))
            # Held-out loss of the drafted slots against g (nats/token), next to a unigram
            # model of the train split on the same tokens.
            result["heldout_draft_cross_entropy"] = round(float(torch.cat(nll).mean()), 4)
            if unigram_logp is not None:
                g = gold.view(pred.shape)[:, :, a:].flatten().numpy()
                result["unigram_cross_entropy"] = round(float(-unigram_logp[g].mean()), 4)
    # Simulated greedy speculative decoding at a = 1 from the first generated token g[0]
    # (committed by the prefill): a step at anchor p accepts k drafts and the target adds one.
    ok, anchor_list = drafts_a1
    index = {pp: i for i, pp in enumerate(anchor_list)}
    steps = tokens = 0
    for r in range(prompts):
        pp = prompt_len
        while pp in index:
            k = int(torch.cumprod(ok[r, index[pp]].int(), 0).sum())
            steps += 1
            tokens += k + 1
            pp += k + 1
    result["simulated_spec_a1"] = {"steps": steps, "tokens": tokens,
                                   "mean_accepted_length": round(tokens / steps, 4),
                                   "drafts_per_step": b - 1}
    if ar_drafter is not None:  # the same walk for an AR drafter proposing b - 1 tokens
        ar_ok = (ar_drafter(seq[:, :-1]).argmax(-1) == seq[:, 1:])  # [N, T-1]: predicts t+1
        steps = tokens = 0
        for r in range(prompts):
            pp = prompt_len
            while pp + b - 1 < total:
                # Committed 0..pp; drafts for pp+1..pp+b-1 come from rows pp..pp+b-2.
                k = int(torch.cumprod(ar_ok[r, pp:pp + b - 1].int(), 0).sum())
                steps += 1
                tokens += k + 1
                pp += k + 1
        result["ar_drafter_spec"] = {
            "steps": steps, "tokens": tokens, "mean_accepted_length": round(tokens / steps, 4),
            "drafts_per_step": b - 1,
            "agreement": round(float(ar_ok[:, prompt_len - 1:].float().mean()), 4)}
    return result


@torch.no_grad()
def fixtures(drafter, target, cfg: dict, held_stream: np.ndarray, prompts: int = 8,
             prompt_len: int = 32, new_tokens: int = 32, seed: int = 17, top: int = 16) -> dict:
    """Reference drafts for the engine: per held-out prompt, the target's greedy tokens and
    several blocks (p, a) with their argmax drafts and the top logits of one slot, computed in
    fp32 from the bf16 weights of both models."""
    b, mask_id = cfg["block_size"], cfg["mask_token_id"]
    layer_ids = cfg["dflash"]["target_layer_ids"]
    rng = np.random.default_rng(seed)
    starts_np = rng.integers(0, len(held_stream) - prompt_len + 1, size=prompts)
    p = torch.from_numpy(np.stack([held_stream[s:s + prompt_len] for s in starts_np])
                         .astype(np.int64))
    seq = torch.cat([p, distill.greedy_continue(target, p, new_tokens)], dim=1)
    # (p, a, logits slot): a = 1 right after the prompt (the first spec step), later a = 1
    # steps, lagging hidden rows (a = 2, 3, max), and a block inside the prompt.
    amax = cfg["dflash"]["max_anchor"]
    plan = [(prompt_len, 1, 1), (prompt_len + 9, 1, 3), (prompt_len + 4, 2, 2),
            (prompt_len + 13, amax, amax), (prompt_len // 2, 3, 5), (1, 1, 1)]
    out_cases = []
    for r in range(prompts):
        row = seq[r:r + 1]
        hidden, _ = target_states(target, row, layer_ids)
        cases = []
        for pp, a, j in plan:
            logits = draft_logits(drafter, target, row, hidden, torch.tensor([[pp]]),
                                  torch.tensor([[a]]), mask_id)[0, 0]  # [B, V]
            top2 = logits[a:].topk(2, dim=-1).values
            gaps = top2[:, 0] - top2[:, 1]  # per drafted slot: how far its argmax is from a tie
            vals, ids = logits[j].topk(top)
            cases.append({"p": pp, "a": a,
                          "drafts": logits[a:].argmax(-1).tolist(),
                          "logits_slot": j,
                          "logits_top": [[int(i), round(float(v), 5)] for i, v in zip(ids, vals)],
                          "top2_gaps": [round(float(g), 5) for g in gaps],
                          "min_top2_gap": round(float(gaps.min()), 5)})
        out_cases.append({"prompt_len": prompt_len, "tokens": seq[r].tolist(), "cases": cases})
    return {"block_size": b, "mask_token_id": mask_id, "target_layer_ids": list(layer_ids),
            "target": cfg["dflash"]["target"], "prompt_seed": seed,
            "compute": "fp32 from the bf16 weights of the drafter and the target",
            "prompts": out_cases}


def evaluate_folder(folder: Path, threads: int = 1) -> dict:
    """eval.json (held-out metrics) and fixtures/drafts.json of an exported folder."""
    import corpus as corpus_lib
    import export
    import tokenizer as tokenizer_lib
    torch.set_num_threads(threads)
    t0 = time.time()
    drafter, cfg = load(folder)
    target_dir = REPO_ROOT / "models" / cfg["dflash"]["target"]
    if (folder / "tokenizer.json").read_bytes() != (target_dir / "tokenizer.json").read_bytes():
        raise ValueError(f"{folder}/tokenizer.json differs from {target_dir}/tokenizer.json")
    target, _, tok = export.load(target_dir)
    ar_dir = REPO_ROOT / "models" / "tandem-drafter"
    ar_drafter = export.load(ar_dir)[0] if (ar_dir / "config.json").exists() else None
    eos = tokenizer_lib.special_ids(tok)[tokenizer_lib.ENDOFTEXT]
    split = corpus_lib.load()
    held = data.token_stream(tok, split.heldout, eos)
    # Add-one smoothed unigram of the train split: the baseline of the held-out draft loss.
    counts = np.bincount(data.token_stream(tok, split.train, eos), minlength=cfg["vocab_size"])
    unigram_logp = np.log((counts + 1) / (counts.sum() + cfg["vocab_size"]))
    ev = held_out_metrics(drafter, target, cfg, held, ar_drafter, unigram_logp=unigram_logp)
    ev["ar_drafter"] = "models/tandem-drafter" if ar_drafter is not None else None
    fx = fixtures(drafter, target, cfg, held)
    (folder / "fixtures").mkdir(exist_ok=True)
    (folder / "fixtures" / "drafts.json").write_text(json.dumps(fx, indent=1) + "\n")
    ev["eval_wall_seconds"] = round(time.time() - t0, 1)
    (folder / "eval.json").write_text(json.dumps(ev, indent=1) + "\n")
    a1 = ev["by_anchor"]["1"]
    print(f"held-out a=1 per-slot agreement {a1['per_slot_agreement']}, simulated accepted "
          f"length {ev['simulated_spec_a1']['mean_accepted_length']:.3f}"
          + (f" (AR drafter {ev['ar_drafter_spec']['mean_accepted_length']:.3f})"
             if ar_drafter is not None else ""), flush=True)
    return ev


# ---------------------------------------------------------------------------------------------
# Training loop.


def train(args, recipe) -> int:
    """train.py's driver for objective "dflash" (same options, checkpoints and summary)."""
    import corpus as corpus_lib
    import export
    import run_info
    import tokenizer as tokenizer_lib
    import train as train_lib
    spec = recipe.dflash
    out = args.out or REPO_ROOT / "models" / f"tandem-{recipe.name}"
    work = args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"tandem-train-{recipe.name}"
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    target_dir = REPO_ROOT / "models" / spec.target
    target, tcfg, tok = export.load(target_dir)
    if tcfg["hidden_size"] != recipe.model.hidden_size:
        raise ValueError(f"drafter hidden {recipe.model.hidden_size} != target hidden "
                         f"{tcfg['hidden_size']}: the drafter reuses the target's embeddings")
    if max(spec.target_layer_ids) > tcfg["num_hidden_layers"]:
        raise ValueError(f"target_layer_ids {spec.target_layer_ids} exceed the target's "
                         f"{tcfg['num_hidden_layers']} layers")
    for p_ in target.parameters():
        p_.requires_grad_(False)
    target.to(device)
    specials = tokenizer_lib.special_ids(tok)
    eos_id, mask_id = specials[tokenizer_lib.ENDOFTEXT], specials[tokenizer_lib.MASK]
    corpus = corpus_lib.load()
    stream = data.token_stream(tok, corpus.train, eos_id)
    held_len = len(data.token_stream(tok, corpus.heldout, eos_id))
    rows, plens, distill_info = distill.load_or_build(
        target_dir, stream, recipe.distill, recipe.seq_len + 1, work)
    sampler = RowSampler(rows, plens, stream, recipe.distill.raw_fraction, spec,
                         recipe.block_size)

    torch.manual_seed(recipe.seed)
    drafter = DFlashDrafter(recipe.model, len(spec.target_layer_ids), recipe.block_size)
    drafter.init_weights(torch.Generator().manual_seed(recipe.seed))
    drafter.to(device)
    decay = [p_ for p_ in drafter.parameters() if p_.dim() >= 2]
    no_decay = [p_ for p_ in drafter.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=recipe.peak_lr, betas=recipe.betas, eps=1e-8)
    n_params = sum(p_.numel() for p_ in drafter.parameters())
    print(f"recipe {recipe.name}: {n_params:,d} drafter parameters, {recipe.total_steps} steps, "
          f"{args.threads} thread(s) on {args.device}; prep {time.time() - t_start:.1f}s",
          flush=True)

    ckpt_path = work / "checkpoint.pt"
    start_step, history, stage_wall = 0, [], {}
    if args.resume and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        drafter.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start_step, history, stage_wall = ckpt["step"], ckpt["history"], ckpt["stage_wall"]
        print(f"resumed at step {start_step}", flush=True)

    deadline = t_start + args.minutes * 60 if args.minutes else None
    truncated, step, window = False, 0, []
    drafter.train()
    stage = recipe.stages[0]
    for local in range(stage.steps):
        if step < start_step:
            step += 1
            continue
        if deadline is not None and time.time() > deadline:
            truncated = True
            print(f"--minutes {args.minutes} reached: stopping at step {step}", flush=True)
            break
        t_step = time.time()
        lr = recipe.lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        tokens, starts, anchors = sampler(data.step_rng(recipe.seed, 0, local),
                                          recipe.batch_size)
        loss, ce, kl, acc = step_loss(drafter, target, spec, tokens.to(device),
                                      starts.to(device), anchors.to(device), mask_id,
                                      recipe.block_size)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(drafter.parameters(), recipe.grad_clip))
        opt.step()
        step += 1
        dt = time.time() - t_step
        stage_wall[stage.name] = stage_wall.get(stage.name, 0.0) + dt
        window.append((loss.item(), ce.item(), kl.item(), acc.item(), gnorm, dt))
        if step % LOG_EVERY == 0 or local == stage.steps - 1:
            w = np.asarray(window).mean(0)
            window = []
            rec = {"step": step, "stage": stage.name, "lr": lr, "loss": round(w[0], 4),
                   "ce": round(w[1], 4), "kl": round(w[2], 4), "draft_acc": round(w[3], 4),
                   "grad_norm": round(w[4], 3), "s_per_step": round(w[5], 3),
                   "elapsed_s": round(time.time() - t_start, 1)}
            history.append(rec)
            print(f"step {step:4d}/{recipe.total_steps} lr {lr:.2e} loss {rec['loss']:.3f} "
                  f"ce {rec['ce']:.3f} kl {rec['kl']:.3f} acc {rec['draft_acc']:.3f} "
                  f"gnorm {rec['grad_norm']:.2f} | {rec['elapsed_s'] / 60:.1f} min, "
                  f"{rec['s_per_step']:.2f} s/step", flush=True)
        if step % CHECKPOINT_EVERY == 0:
            train_lib.save_checkpoint(ckpt_path, drafter, opt, step, history, stage_wall)
    train_lib.save_checkpoint(ckpt_path, drafter, opt, step, history, stage_wall)
    train_wall = time.time() - t_start

    drafter.eval()
    write(out, drafter.cpu(), recipe, tok)
    summary = {
        "recipe": recipe.to_json(),
        "steps_scale": args.steps_scale,
        "steps_done": step,
        "truncated": truncated,
        "parameters": n_params,
        "rows_seen": step * recipe.batch_size,
        "blocks_seen": step * recipe.batch_size * spec.blocks_per_row,
        "train_wall_seconds": round(train_wall, 1),
        "stage_wall_seconds": {k: round(v, 1) for k, v in stage_wall.items()},
        "resumed": bool(args.resume),
        "hardware": run_info.hardware(args.threads, args.device),
        "versions": run_info.versions(),
        "corpus": corpus.stats() | {"train_tokens": len(stream), "heldout_tokens": held_len},
        "distill": distill_info,
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"exported to {out} after {train_wall / 60:.1f} min", flush=True)
    if not args.no_eval:
        evaluate_folder(out, args.threads)
        write_card(out)
    return 0


# ---------------------------------------------------------------------------------------------
# Model card.


def _pct(xs) -> str:
    return ", ".join(f"{x:.0%}" for x in xs)


def render_card(folder: Path) -> str:
    cfg = json.loads((folder / "config.json").read_text())
    tr = json.loads((folder / "training.json").read_text())
    ev = json.loads((folder / "eval.json").read_text())
    fx = json.loads((folder / "fixtures" / "drafts.json").read_text())
    r, m, hw, d = tr["recipe"], tr["recipe"]["model"], tr["hardware"], tr["distill"]
    spec = r["dflash"]
    b = cfg["block_size"]
    dfl = cfg["dflash"]
    target = dfl["target"]
    last = tr["history"][-1] if tr["history"] else {}
    sim, ar = ev["simulated_spec_a1"], ev.get("ar_drafter_spec")
    by_a = "\n".join(
        f"| {a} | {v['blocks']:,d} | {_pct(v['per_slot_agreement'])} | "
        f"{v['mean_accepted_drafts']:.2f} of {b - int(a)} |"
        for a, v in ev["by_anchor"].items())
    size = (folder / "model.safetensors").stat().st_size
    truncated = ("**The run hit its --minutes guard and stopped early at step "
                 f"{tr['steps_done']} of {r['total_steps']}.**\n\n" if tr["truncated"] else "")
    scaled = (f"**Smoke build: steps scaled by {tr['steps_scale']}.**\n\n"
              if tr["steps_scale"] != 1.0 else "")
    ar_row = (f"| AR drafter `{ev['ar_drafter']}` (teacher-forced agreement "
              f"{ar['agreement']:.1%}), {ar['drafts_per_step']} AR drafts per step | "
              f"{ar['steps']:,d} | **{ar['mean_accepted_length']:.2f}** |\n" if ar else "")
    c0 = dict(fx["prompts"][0]["cases"][0])
    c0["logits_top"] = c0["logits_top"][:2] + ["..."]
    return f"""# {folder.name}

{r['description'][0].upper() + r['description'][1:]}: a DFlash-style block drafter of
{tr['parameters'] / 1e6:.2f}M trained parameters ({size / 1e6:.2f} MB bf16) for `models/{target}`,
trained by the `{r['name']}` recipe of `tools/train/` on the Python standard library. It is a
test and demonstration model for the engine's `spec` mode, not a useful code model.

{truncated}{scaled}## Files

| file | what |
|---|---|
| `config.json` | Qwen3 fields + `block_size`, `mask_token_id`, `dflash`, `tandem` |
| `model.safetensors` | bf16 drafter weights (no embeddings, no LM head: the target's are used) |
| `tokenizer.json` | the target's, byte for byte |
| `generation_config.json` | greedy defaults, eos |
| `training.json` | recipe, hardware, wall time, loss history |
| `eval.json` | held-out draft metrics |
| `fixtures/drafts.json` | reference drafts and logits (engine golden test) |
| `bench.json` | `tandem bench modes --modes ar,spec --json` with this drafter (engine), when present |

## Architecture (`{ARCHITECTURE}`)

The drafter reads the target's residual stream after layers {dfl['target_layer_ids']} (layer
l = after l decoder layers, 0 = embeddings, {tcfg_layers(folder)} = before the final norm) for
the committed tokens 0..p-1 and turns each row into a context feature
c_t = RMSNorm(fc(concat h_l[t])), fc: {len(dfl['target_layer_ids'])}·{m['hidden_size']} →
{m['hidden_size']} without bias. A block of B = {b} tokens at positions p..p+{b - 1} holds a ≥ 1
known tokens (a = 1: the anchor, the last committed token, whose target row is not known yet;
a ≤ {dfl['max_anchor']} lets the drafter run while the verifier's rows lag) followed by
`<|mask|>` (id {cfg['mask_token_id']}), embedded with the target's `embed_tokens`. Then
{m['num_hidden_layers']} Qwen3 layers (hidden {m['hidden_size']}, SwiGLU {m['intermediate_size']},
{m['num_attention_heads']} query / {m['num_key_value_heads']} KV heads of dim {m['head_dim']}, q/k
RMSNorm, RoPE θ = {m['rope_theta']:g}) whose attention keys and values are
`[k_proj(c), k_proj(input_layernorm(block))]`, with c the same in every layer and not passed
through `input_layernorm`; context keys sit at positions 0..p-1, block keys at p..p+{b - 1}; the
block attends to all of them (bidirectional inside the block). The final `norm` and the
target's tied LM head give logits; slot j predicts the token at p + j, and the drafts are the
argmax of slots a..{b - 1}.

## Data

`{target}`'s greedy continuations (`tools/train/distill.py`): {d['rows']:,d} rows of
{d['row_len']} tokens, a train-split prompt of {'/'.join(str(x) for x in d['prompt_lens'])} tokens
followed by the target's greedy tokens (shared with `tandem-drafter`'s recipe, cached); every
batch is {1 - d['raw_fraction']:.0%} such rows and {d['raw_fraction']:.0%} raw train windows. The
target's hidden states and logits are computed on the fly by the frozen target (fp32).

## Objective

Each row carries {spec['blocks_per_row']} blocks with their own start p and anchor count a
(a = 1 with probability {spec['anchor_one_prob']}, else uniform on 2..{spec['max_anchor']}), all in
one drafter forward: a block's queries see the context rows t < p and their own block only. A
distilled row's blocks draft continuation tokens only (where the row is the target's greedy
chain); a raw row's blocks start anywhere. Loss on the drafted slots: cross-entropy against the
target's greedy token (the argmax of its logits one position earlier) + {spec['kl_weight']} ×
KL(target ‖ drafter), the k-th drafted slot weighted exp(-(k-1)/{spec['slot_decay']:g}) because a
miss ends acceptance. The target, its embeddings and its LM head are frozen.

## Training

AdamW (β = {tuple(r['betas'])}, weight decay {r['weight_decay']} on matrices), peak lr
{r['peak_lr']:g}, {r['warmup_steps']} warmup steps, warmup-stable-decay with a linear decay to
{r['final_lr_ratio']:g}× over the last {r['decay_fraction']:.0%}, grad clip {r['grad_clip']}, batch
{r['batch_size']} rows × {r['seq_len'] + 1} tokens, seed {r['seed']}, fp32. {tr['steps_done']} steps,
{tr['blocks_seen']:,d} blocks. Final training window: loss {last.get('loss', float('nan')):.3f},
CE {last.get('ce', float('nan')):.3f}, KL {last.get('kl', float('nan')):.3f}, drafted-slot
accuracy {last.get('draft_acc', float('nan')):.1%}.

**Hardware and wall time:** {hw['cpu']} ({hw['logical_cpus']} logical CPUs, shared with other
jobs), {hw['threads']} torch thread(s), device `{hw['device']}`; training took
{tr['train_wall_seconds'] / 60:.1f} min wall (data preparation included), evaluation and
fixtures {ev['eval_wall_seconds'] / 60:.1f} min. Versions: Python {tr['versions']['python']}, torch
{tr['versions']['torch']}, numpy {tr['versions']['numpy']}.

## Held-out results

{ev['prompts']} held-out prompts of {ev['prompt_len']} tokens, each continued greedily by the
target for {ev['new_tokens']} tokens (g). Every block whose drafted slots lie in g is drafted;
agreement = the draft equals g there (what greedy verification accepts):

| a | blocks | agreement by drafted slot | mean accepted drafts |
|---|---|---|---|
{by_a}
{_loss_line(ev)}
Greedy speculative decoding simulated in PyTorch at a = 1 from the first generated token (a
step drafts {sim['drafts_per_step']} tokens, accepts the prefix equal to g and adds the target's
own token):

| drafter | steps | mean accepted length (tokens per target forward) |
|---|---|---|
| this DFlash drafter, {sim['drafts_per_step']} drafts in one forward | {sim['steps']:,d} | **{sim['mean_accepted_length']:.2f}** |
{ar_row}
{_limitations(ev, tr)}{_engine_section(folder)}## Fixtures

`fixtures/drafts.json`: {len(fx['prompts'])} held-out prompts of {fx['prompts'][0]['prompt_len']}
tokens with the target's greedy continuation (`tokens`), and per prompt blocks `{{p, a, drafts,
logits_slot, logits_top, top2_gaps, min_top2_gap}}`: `drafts` are the argmax ids of slots a..{b - 1},
`logits_top` the top 16 (id, logit) of slot `logits_slot`, computed in fp32 from the bf16
weights of this folder and of `models/{target}` (whose hidden states an engine recomputes).
One case (`logits_top` cut to its first two pairs here): `{json.dumps(c0)}`. `top2_gaps` are
the top-1/top-2 logit gaps of the drafted slots (`min_top2_gap` their minimum): an engine
reproduces a draft if its logits are within half that slot's gap of these.

## Rebuild

```sh
.venv/bin/python tools/train/train.py --recipe {r['name']} --threads {hw['threads']}
```

Same library versions and thread count give the same weights. Re-run the evaluation, the
fixtures and this card: `.venv/bin/python tools/train/dflash.py models/{folder.name}`. The
training data is the Python standard library, under the PSF License.
"""


def _loss_line(ev: dict) -> str:
    if "heldout_draft_cross_entropy" not in ev:
        return ""
    uni = ev.get("unigram_cross_entropy")
    baseline = (f" against **{uni:.3f}** for a unigram model of the train split (add-one "
                f"smoothed) on the same tokens" if uni is not None else "")
    return f"""
Held-out loss of the drafted slots at a = 1 against g: **{ev['heldout_draft_cross_entropy']:.3f}**
nats/token{baseline}.
"""


def _engine_section(folder: Path) -> str:
    """`spec` with this drafter as the C++ engine measured it (bench.json), if it was."""
    bench_path = folder / "bench.json"
    if not bench_path.exists():
        return ""
    import model_card  # noqa: E402  (imports this module's siblings; only needed here)
    bench = json.loads(bench_path.read_text())
    return f"""**In the engine** (`spec`: speculative decoding of `{bench['model']}` with this drafter,
`spec gamma=N`: up to N drafts verified per step — a block gives at most B − 1 — and
the default γ = 4 otherwise; greedy,
{bench['max_tokens']} new tokens per prompt, the prompts of `{bench['prompts_file']}`,
{bench['threads']} thread(s); `bench.json`):

{model_card._engine_rows(bench)}

TPF: completion tokens per target forward; acc.len: tokens committed per drafting step
(accepted drafts + 1); seq=AR: outputs equal to AR greedy decoding. tok/s depends on the
machine (a shared 2-core CPU here), TPF and acceptance do not. {model_card.AR_NLL_NOTE} Command:

```sh
build/services/cli/tandem bench modes --model {bench['model']} --drafter models/{folder.name} \\
  --modes ar,spec --threads 1 --json > models/{folder.name}/bench.json
```

"""


def _limitations(ev: dict, tr: dict) -> str:
    sim, ar = ev["simulated_spec_a1"], ev.get("ar_drafter_spec")
    if not ar or sim["mean_accepted_length"] >= ar["mean_accepted_length"]:
        return ""
    slots = ev["by_anchor"]["1"]["per_slot_agreement"]
    return f"""**Limitations.** At this scale the AR drafter accepts more per step. The target's
greedy continuations repeat themselves a lot, which a token-by-token AR drafter tracks well
(it sees each of its own accepted drafts, here the target's tokens), while a block draft is
made in one forward from `<|mask|>` tokens and its agreement falls from {slots[0]:.0%} at the first
slot to {slots[-1]:.0%} at the last. The drafter saw {tr['blocks_seen']:,d} blocks in
{tr['steps_done']} steps; what it shows here is the
mechanics of hidden-state conditioning (one drafter forward for {sim['drafts_per_step']} drafts instead
of {sim['drafts_per_step']} AR forwards), not DFlash's speed-up.

"""


def tcfg_layers(folder: Path) -> int:
    cfg = json.loads((folder / "config.json").read_text())
    tdir = REPO_ROOT / "models" / cfg["dflash"]["target"]
    return json.loads((tdir / "config.json").read_text())["num_hidden_layers"]


def write_card(folder: Path) -> None:
    (folder / "MODEL.md").write_text(render_card(folder))


def main() -> int:
    p = argparse.ArgumentParser(description="Evaluate a DFlash drafter folder, write its "
                                            "fixtures and MODEL.md.")
    p.add_argument("folder", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--card-only", action="store_true")
    args = p.parse_args()
    if not args.card_only:
        evaluate_folder(args.folder, args.threads)
    write_card(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
