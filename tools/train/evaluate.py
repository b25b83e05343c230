#!/usr/bin/env python3
"""Evaluates an exported model folder on the corpus' held-out split and writes its fixtures.

    .venv/bin/python tools/train/evaluate.py models/tandem-target [--threads N]

Writes into the folder:
  eval.json               held-out AR loss (nats/token) next to the unigram baseline, held-out
                          diffusion loss (diffusion-capable models), reference decoding stats;
  fixtures/greedy.json    8 held-out prompts (64 tokens) and their 32-token greedy
                          continuations computed by transformers' Qwen3ForCausalLM loaded from
                          the folder in fp32 (which also proves the export loads there);
  fixtures/modes.json     (diffusion-capable models) reference linear self-speculation and
                          block-diffusion decodes of the same prompts (protocols inside).

Every number is computed from the exported bf16 weights (upcast to fp32), not from the
training-time fp32 weights, so it describes the model that ships.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import corpus as corpus_lib  # noqa: E402
import data  # noqa: E402
import diffusion  # noqa: E402
import export  # noqa: E402
import idlm  # noqa: E402
import sdlm  # noqa: E402
import tokenizer as tokenizer_lib  # noqa: E402

EVAL_SEQ_LEN = 256
EVAL_BATCH = 8
EVAL_SEED = 7
NUM_PROMPTS = 8
PROMPT_LEN = 64
NEW_TOKENS = 32
PROMPT_OFFSETS = (1 / 3, 1 / 2, 2 / 3, 1 / 4, 3 / 4)  # fractions of a file's tokens
MIN_GREEDY_GAP = 0.02  # logits; engines agree with transformers to about 1e-5
DRAFT_WIDTH = 8  # linear self-speculation k
ISD_WINDOWS = 256  # held-out windows for the I-DLM mask-pathway metrics (about 65k tokens)
# Confidence thresholds of the block-diffusion reference decodes: 0.9 is the usual setting
# for large models; a toy model is rarely that sure, so 0.5 shows multi-token commits too.
DIFFUSION_THRESHOLDS = (0.9, 0.5)


@torch.no_grad()
def ar_metrics(model, windows: torch.Tensor) -> dict:
    total, correct, count = 0.0, 0, 0
    for batch in windows.split(EVAL_BATCH):
        logits = model(batch[:, :-1])
        targets = batch[:, 1:]
        total += float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))
        correct += int((logits.argmax(-1) == targets).sum())
        count += targets.numel()
    return {"loss": total / count, "top1_accuracy": correct / count, "tokens": count}


@torch.no_grad()
def diffusion_metrics(model, windows: torch.Tensor, block_size: int, mask_id: int) -> dict:
    """Global mean CE over masked tokens with per-block uniform masking (the training
    distribution), its breakdown by masked count k, and a fully masked pass (the
    self-speculation drafting state) with top-1 accuracy per block slot."""
    L = windows.shape[1] - 1
    mask = diffusion.dual_stream_mask(L, block_size)
    positions = diffusion.dual_stream_positions(L)
    rng = np.random.default_rng(EVAL_SEED)
    by_k_loss = np.zeros(block_size + 1)
    by_k_count = np.zeros(block_size + 1)
    full_loss, full_count = 0.0, 0
    slot_correct = np.zeros(block_size)
    slot_count = np.zeros(block_size)
    for batch in windows.split(EVAL_BATCH):
        b = batch.shape[0]
        for fully_masked in (False, True):
            if fully_masked:
                noise = np.ones((b, L), dtype=bool)
            else:
                noise = diffusion.sample_block_masks(rng, b, L, block_size)
            inputs, _, targets = diffusion.build_dual_stream_batch(batch, noise, mask_id)
            logits = model(inputs, positions, mask)[:, L:]
            ce = F.cross_entropy(logits.flatten(0, 1), batch[:, :-1].flatten(),
                                 reduction="none").view(b, L).numpy()
            if fully_masked:
                full_loss += float(ce.sum())
                full_count += ce.size
                hit = (logits.argmax(-1) == batch[:, :-1]).numpy().reshape(b, -1, block_size)
                slot_correct += hit.sum(axis=(0, 1))
                slot_count += hit.shape[0] * hit.shape[1]
            else:
                k = noise.reshape(b, -1, block_size).sum(-1)  # [b, blocks]
                ce_blocks = (ce * noise).reshape(b, -1, block_size).sum(-1)
                np.add.at(by_k_loss, k, ce_blocks)
                np.add.at(by_k_count, k, k)
    return {
        "loss": float(by_k_loss.sum() / by_k_count.sum()),
        "masked_tokens": int(by_k_count.sum()),
        "loss_by_masked_count": {str(k): float(by_k_loss[k] / by_k_count[k])
                                 for k in range(1, block_size + 1) if by_k_count[k] > 0},
        "fully_masked_loss": full_loss / full_count,
        "fully_masked_top1_by_slot": [float(c / n) for c, n in zip(slot_correct, slot_count)],
    }


def unigram_baseline(train_stream: np.ndarray, held_stream: np.ndarray, vocab: int) -> dict:
    """Cross-entropy of the held-out tokens (each but the first, the AR targets) under the
    train-split unigram distribution with add-one smoothing, and that distribution's entropy."""
    counts = np.bincount(train_stream, minlength=vocab).astype(np.float64) + 1.0
    p = counts / counts.sum()
    return {
        "heldout_cross_entropy": float(-np.log(p[held_stream[1:]]).mean()),
        "train_entropy": float(-(p * np.log(p)).sum()),
    }


def candidate_prompts(tok, files: list[corpus_lib.SourceFile]):
    """Yields lists of candidate prompts, one list per fixture slot: slot i starts at the
    held-out file spread i/(NUM_PROMPTS-1) over the sorted list of files long enough, tries a
    few offsets into it (a third of the way first: past the licence header and docstring),
    then the following files."""
    need = PROMPT_LEN + NEW_TOKENS
    encoded = [(f.rel_path, tok.encode(f.text, add_special_tokens=False).ids) for f in files]
    usable = [(p, ids) for p, ids in encoded if len(ids) >= 3 * need]
    for slot in range(NUM_PROMPTS):
        first = round(slot * (len(usable) - 1) / (NUM_PROMPTS - 1))
        cands = []
        for path, ids in usable[first:] + usable[:first]:
            for frac in PROMPT_OFFSETS:
                offset = int(len(ids) * frac)
                cands.append({"source": f"{path} tokens [{offset}, {offset + PROMPT_LEN})",
                              "prompt_ids": ids[offset:offset + PROMPT_LEN]})
        yield cands


@torch.no_grad()
def hf_greedy(folder: Path, tok, files: list[corpus_lib.SourceFile], ours) -> tuple[list, float]:
    """Greedy continuations by transformers (full recompute per step, fp32, eager attention)
    of the first candidate of each slot whose every step has a top-1/top-2 logit gap of at
    least MIN_GREEDY_GAP, so that an engine within a small tolerance reproduces the tokens.
    Also returns the largest |logit| difference between transformers and our module."""
    from transformers import Qwen3ForCausalLM

    hf = Qwen3ForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                          attn_implementation="eager")
    hf.eval()
    cases, max_diff, used = [], 0.0, set()
    for cands in candidate_prompts(tok, files):
        for p in cands:
            if p["source"] in used:
                continue
            ids, gaps = list(p["prompt_ids"]), []
            for _ in range(NEW_TOKENS):
                logits = hf(torch.tensor([ids])).logits[0, -1].float()
                top2 = torch.topk(logits, 2).values
                gaps.append(float(top2[0] - top2[1]))
                if gaps[-1] < MIN_GREEDY_GAP:
                    break
                ids.append(int(logits.argmax()))
            if min(gaps) < MIN_GREEDY_GAP:
                continue
            full = torch.tensor([ids])
            max_diff = max(max_diff, float((hf(full).logits[0] - ours(full)[0]).abs().max()))
            cases.append(p | {"continuation_ids": ids[PROMPT_LEN:],
                              "min_top2_logit_gap": min(gaps)})
            used.add(p["source"])
            break
        else:
            raise RuntimeError(f"no held-out prompt with a greedy gap >= {MIN_GREEDY_GAP}")
    return cases, max_diff


def prefix_block_mask(n: int, k: int) -> torch.Tensor:
    """bool [n+k, n+k]: causal over the n prefix tokens; the k block tokens read the whole
    prefix and each other (the inference form of the noisy-block row of the training mask)."""
    m = torch.ones(n + k, n + k).tril().bool()
    m[n:, n:] = True
    return m


@torch.no_grad()
def linear_self_spec(model, prompt: list[int], mask_id: int, k: int) -> dict:
    """NLD §3.3: draft k masks in one diffusion forward, verify with one causal forward, keep
    the longest matching prefix plus the verifier's next token. Greedy, so lossless."""
    seq, accepted, cycles, draft_gaps = list(prompt), [], 0, []
    while len(seq) - len(prompt) < NEW_TOKENS:
        n = len(seq)
        draft_in = torch.tensor([seq + [mask_id] * k])
        draft_logits = model(draft_in, mask=prefix_block_mask(n, k))[0, n:]
        top2 = torch.topk(draft_logits, 2, dim=-1).values
        draft_gaps.append(float((top2[:, 0] - top2[:, 1]).min()))
        draft = draft_logits.argmax(-1).tolist()
        verify = model(torch.tensor([seq + draft]))[0, n - 1:].argmax(-1).tolist()  # [k+1]
        j = 0
        while j < k and draft[j] == verify[j]:
            j += 1
        seq += draft[:j] + [verify[j]]
        accepted.append(j)
        cycles += 1
    # The output does not depend on the drafts (greedy verification); accepted_per_cycle does,
    # through their argmax: min_draft_top2_logit_gap says how firmly.
    return {"continuation_ids": seq[len(prompt):][:NEW_TOKENS], "cycles": cycles,
            "accepted_per_cycle": accepted, "min_draft_top2_logit_gap": min(draft_gaps)}


@torch.no_grad()
def block_diffusion(model, prompt: list[int], mask_id: int, block: int, threshold: float) -> dict:
    """NLD §3.2 with a confidence threshold: each block starts as `block` masks after the
    committed sequence; every forward commits each masked slot whose top-1 probability is at
    least `threshold` (at least the single most confident slot); a finished block joins the
    committed (causal) prefix."""
    seq, forwards = list(prompt), 0
    # Decision margins, so a consumer can tell a real mismatch from a near-tie:
    # probability distance of any masked slot's confidence to the threshold; top-1 minus
    # top-2 probability of committed slots; in fallback steps, best minus second-best
    # confidence among masked slots.
    margins = {"threshold": 1.0, "top2_prob": 1.0, "fallback_choice": 1.0}
    while len(seq) - len(prompt) < NEW_TOKENS:
        n = len(seq)
        cur = [mask_id] * block
        while mask_id in cur:
            logits = model(torch.tensor([seq + cur]), mask=prefix_block_mask(n, block))[0, n:]
            forwards += 1
            probs = F.softmax(logits, -1)
            top2 = torch.topk(probs, 2, dim=-1).values
            conf, tok = probs.max(-1)
            masked = [i for i in range(block) if cur[i] == mask_id]
            margins["threshold"] = min(margins["threshold"],
                                       min(abs(float(conf[i]) - threshold) for i in masked))
            commit = [i for i in masked if float(conf[i]) >= threshold]
            if not commit:
                ranked = sorted(masked, key=lambda i: -float(conf[i]))
                if len(ranked) > 1:
                    margins["fallback_choice"] = min(
                        margins["fallback_choice"],
                        float(conf[ranked[0]]) - float(conf[ranked[1]]))
                commit = ranked[:1]
            for i in commit:
                margins["top2_prob"] = min(margins["top2_prob"],
                                           float(top2[i, 0] - top2[i, 1]))
                cur[i] = int(tok[i])
        seq += cur
    return {"continuation_ids": seq[len(prompt):][:NEW_TOKENS], "forwards": forwards,
            "min_margins": margins}


def mode_references(model, cases: list[dict], mask_id: int, block: int) -> tuple[dict, dict]:
    ss_cases = []
    for c in cases:
        ss = linear_self_spec(model, c["prompt_ids"], mask_id, DRAFT_WIDTH)
        ss["matches_ar_greedy"] = ss["continuation_ids"] == c["continuation_ids"]
        ss_cases.append(ss)
    cycles = sum(s["cycles"] for s in ss_cases)
    accepted = sum(sum(s["accepted_per_cycle"]) for s in ss_cases)
    summary = {
        "self_spec_linear": {
            "draft_width": DRAFT_WIDTH,
            "all_match_ar_greedy": all(s["matches_ar_greedy"] for s in ss_cases),
            "mean_accepted_drafts_per_cycle": accepted / cycles,
            "tokens_per_cycle": (accepted + cycles) / cycles,
        },
        "diffusion": [],
    }
    diffusion_runs = []
    for threshold in DIFFUSION_THRESHOLDS:
        runs = []
        for c in cases:
            d = block_diffusion(model, c["prompt_ids"], mask_id, block, threshold)
            d["tokens_equal_to_ar_greedy"] = sum(
                a == b for a, b in zip(d["continuation_ids"], c["continuation_ids"]))
            runs.append(d)
        diffusion_runs.append({"threshold": threshold, "cases": runs})
        summary["diffusion"].append({
            "block_size": block, "threshold": threshold,
            "tokens_per_forward": NEW_TOKENS * len(runs) / sum(d["forwards"] for d in runs),
            "fraction_equal_to_ar_greedy":
                sum(d["tokens_equal_to_ar_greedy"] for d in runs) / (NEW_TOKENS * len(runs)),
        })
    fixture = {
        "description": "Reference decodes of the greedy.json prompts in the diffusion-based "
                       "modes, computed by tools/train/evaluate.py with the exported weights "
                       "upcast to fp32 (full recompute, no KV cache).",
        "mask_token_id": mask_id,
        "self_spec_linear": {
            "protocol": "cycle: forward prefix + k <|mask|> (positions n..n+k-1; masks see the "
                        "prefix and each other, prefix causal) -> drafts = argmax at the masks; "
                        "forward prefix + drafts causally -> v[j] = argmax at position n-1+j; "
                        "accept drafts while draft[j] == v[j], then append v[j] (the first "
                        "mismatch, or v[k] when all match). Output equals AR greedy.",
            "draft_width": DRAFT_WIDTH,
            "cases": ss_cases,
        },
        "diffusion": {
            "protocol": "block of `block_size` <|mask|> after the committed sequence (same "
                        "visibility as self_spec_linear drafting); each forward commits every "
                        "masked slot with softmax top-1 probability >= threshold, or only the "
                        "most confident masked slot (lowest index on a tie) if none; a full "
                        "block is appended to the "
                        "committed sequence. Lossy: not equal to AR greedy in general.",
            "block_size": block,
            "runs": diffusion_runs,
        },
    }
    return summary, fixture


def run(folder: Path, threads: int = 1) -> dict:
    torch.set_num_threads(threads)
    t0 = time.time()
    model, config, tok = export.load(folder)
    eos_id = tok.token_to_id(tokenizer_lib.ENDOFTEXT)
    corpus = corpus_lib.load()
    held_stream = data.token_stream(tok, corpus.heldout, eos_id)
    train_stream = data.token_stream(tok, corpus.train, eos_id)
    windows = data.heldout_windows(held_stream, EVAL_SEQ_LEN + 1)

    result = {"heldout_tokens": int(len(held_stream)), "eval_seq_len": EVAL_SEQ_LEN}
    result["unigram"] = unigram_baseline(train_stream, held_stream, config["vocab_size"])
    result["ar"] = ar_metrics(model, windows)
    print(f"held-out AR loss {result['ar']['loss']:.4f} nats/token "
          f"(unigram baseline {result['unigram']['heldout_cross_entropy']:.4f})", flush=True)
    diffusion_capable = "diffusion" in config.get("tandem", {}).get("modes", [])
    mask_id = config.get("mask_token_id")
    if diffusion_capable:
        result["diffusion"] = diffusion_metrics(model, windows, config["block_size"], mask_id)
        print(f"held-out diffusion loss {result['diffusion']['loss']:.4f} "
              f"(fully masked {result['diffusion']['fully_masked_loss']:.4f})", flush=True)

    nsp_capable = "nsp" in config.get("tandem", {}).get("modes", [])
    if nsp_capable:
        result["nsp"] = sdlm.block_metrics(model, windows, config["block_size"], mask_id)
        print(f"held-out SDLM block loss {result['nsp']['loss']:.4f}, top-1 by slot "
              f"{[round(x, 3) for x in result['nsp']['top1_by_slot']]}", flush=True)

    if "isd" in config.get("tandem", {}).get("modes", []):
        result["isd"] = idlm.metrics(model, windows[:ISD_WINDOWS], config["block_size"], mask_id)
        agree = [b["argmax_agreement"] for b in result["isd"]["by_mask"]]
        result["isd"]["appendix_b_tpf_greedy"] = {
            str(n): idlm.appendix_b_tpf(agree, n) for n in range(2, len(agree) + 2)}
        print(f"held-out I-DLM mask loss {result['isd']['mask_loss']:.4f}, greedy acceptance "
              f"by mask {[round(a, 3) for a in agree]}", flush=True)

    cases, max_diff = hf_greedy(folder, tok, corpus.heldout, model)
    result["transformers_vs_training_module_max_abs_logit_diff"] = max_diff
    for c in cases:
        c["prompt_text"] = tok.decode(c["prompt_ids"], skip_special_tokens=False)
        c["continuation_text"] = tok.decode(c["continuation_ids"], skip_special_tokens=False)
    fixtures = folder / "fixtures"
    fixtures.mkdir(exist_ok=True)
    greedy = {
        "description": "Greedy continuations of held-out prompts by transformers "
                       "Qwen3ForCausalLM loaded from this folder in fp32 (bf16 weights "
                       "upcast), eager attention, CPU, full recompute per step.",
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "protocol": "continuation_ids[i] = argmax of the logits at the last position of "
                    "prompt_ids + continuation_ids[:i]; min_top2_logit_gap is the smallest "
                    "top-1 minus top-2 logit over those steps.",
        "selection": "one prompt per held-out file spread over the sorted file list; offsets "
                     "and files are tried in a fixed order (tools/train/evaluate.py) until "
                     f"every greedy step has a top-1/top-2 logit gap >= {MIN_GREEDY_GAP}.",
        "cases": cases,
    }
    (fixtures / "greedy.json").write_text(json.dumps(greedy, indent=1) + "\n")
    if diffusion_capable:
        summary, fixture = mode_references(model, cases, mask_id, config["block_size"])
        result["modes"] = summary
        (fixtures / "modes.json").write_text(json.dumps(fixture, indent=1) + "\n")
        print(f"linear self-spec: {summary['self_spec_linear']['tokens_per_cycle']:.2f} "
              f"tokens/cycle, lossless={summary['self_spec_linear']['all_match_ar_greedy']}; "
              "diffusion: " + ", ".join(f"{d['tokens_per_forward']:.2f} tokens/forward at "
                                          f"{d['threshold']}" for d in summary["diffusion"]),
              flush=True)
    if nsp_capable:
        result["nsp"]["decodes"] = sdlm.references(model, cases, mask_id, config["block_size"],
                                                   NEW_TOKENS)
        print(f"nsp: {result['nsp']['decodes']}", flush=True)
    result["eval_wall_seconds"] = round(time.time() - t0, 1)
    (folder / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description="Evaluate an exported model folder.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    run(args.folder, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
