"""The diffusion mode's trained sampler (Nemotron-Labs-Diffusion §3.2 and Appendix A).

A small bidirectional transformer over the current block predicts, for each masked slot, whether
the model's top-1 prediction there is already the token the block will end with. `diffusion`
then commits, besides the most confident slot (the serial step), every slot whose probability
reaches a threshold, instead of thresholding the model's confidence. The base model stays frozen; only the sampler trains.

Data (App. A): denoising trajectories the model itself produces on corpus windows (a clean
prefix, then one all-masked block), under two policies:
  - confidence: each forward commits the most confident masked slot (serial denoising, k = 1);
  - hybrid: each forward commits every masked slot whose top-1 equals the corpus token there,
    or, when none does, the most confident slot.
Every intermediate state is a sample: per-slot features and, per masked slot, the label
1[current top-1 == the token the policy ends with at that slot]. Loss: binary cross-entropy on
the masked slots.

The features and the network are exactly the engine's (worker/decoding/diffusion_sampler.h,
which documents the layout); `write` saves the sampler/ folder the engine loads, and
`fixture` the held-out cases its parity test replays (fixtures/sampler.json).

Evaluation on held-out windows: per block, the serial-denoising target; then decoding by the
confidence threshold and by the sampler threshold, each swept, with tokens per forward (TPF)
and agreement with the target — the comparison NLD Fig. 8 makes, at equal agreement.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

import evaluate

FIXED_FEATURES = 10  # diffusion_sampler.h: every feature but the token features
CONFIDENCE_SWEEP = (0.9, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05)
SAMPLER_SWEEP = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


# ---------------------------------------------------------------------------------------------
# The network (diffusion_sampler.h: names, shapes and order of operations).


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, B, d]
        n, b, d = x.shape
        q, k, v = self.qkv(x).view(n, b, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # bidirectional over the block
        return self.out(y.transpose(1, 2).reshape(n, b, d))


class Mlp(nn.Module):
    def __init__(self, d: int, ffn: int):
        super().__init__()
        self.up = nn.Linear(d, ffn)
        self.down = nn.Linear(ffn, d)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(d, eps=eps)
        self.attn = Attention(d, heads)
        self.norm2 = nn.LayerNorm(d, eps=eps)
        self.mlp = Mlp(d, ffn)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Sampler(nn.Module):
    def __init__(self, spec, token_features: torch.Tensor):
        super().__init__()
        d = spec.hidden
        self.spec = spec
        self.register_buffer("token_features", token_features)
        self.input = nn.Linear(FIXED_FEATURES + token_features.shape[1], d)
        self.position = nn.Parameter(torch.zeros(spec.max_block, d))
        self.layers = nn.ModuleList(Layer(d, spec.heads, spec.ffn, spec.eps)
                                    for _ in range(spec.layers))
        self.norm = nn.LayerNorm(d, eps=spec.eps)
        self.head = nn.Linear(d, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # [N, B, F] -> logits [N, B]
        b = features.shape[1]
        x = self.input(features) + self.position[:b]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x)).squeeze(-1)


def token_feature_table(embeddings: torch.Tensor, dims: int) -> torch.Tensor:
    """[vocab, dims]: the token embeddings projected on their top principal components, each
    component scaled to unit variance (App. A's PCA-compressed semantic embeddings)."""
    e = embeddings.double()
    centred = e - e.mean(0, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ vh[:dims].T
    # Sign convention: the largest-magnitude entry of each component is positive.
    signs = torch.sign(vh[:dims].gather(1, vh[:dims].abs().argmax(1, keepdim=True))).T
    projected = projected * signs
    return (projected / projected.std(0, keepdim=True)).float()


# ---------------------------------------------------------------------------------------------
# Features (diffusion_sampler.h), batched: blocks [N, B] with the mask id where masked.


def summarize(logits: torch.Tensor, mask_id: int):
    """logits [N, B, V] -> (top3 ids [N, B, 3], top3 probs, entropy [N, B]), <|mask|> excluded."""
    z = logits.double().clone()
    z[..., mask_id] = -math.inf
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    entropy = -(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum(-1)
    prob, top = p.topk(3, dim=-1)
    return top, prob.float(), entropy.float()


def features(blocks: torch.Tensor, top, prob, entropy, table: torch.Tensor, mask_id: int,
             max_block: int) -> torch.Tensor:
    n, b = blocks.shape
    masked = blocks == mask_id
    m = masked.float()
    vocab = table.shape[0]
    stats = torch.stack([prob[..., 0], prob[..., 1], prob[..., 2], prob[..., 0] - prob[..., 1],
                         prob.sum(-1), entropy / math.log(max(2, vocab - 1))], -1) * m[..., None]
    token = torch.where(masked, top[..., 0], blocks)
    where = torch.arange(b, dtype=torch.float32).expand(n, b) / b
    count = m.sum(-1, keepdim=True).expand(n, b) / b
    length = torch.full((n, b), b / max_block)
    return torch.cat([m[..., None], stats, table[token], where[..., None], length[..., None],
                      count[..., None]], -1)


# ---------------------------------------------------------------------------------------------
# Trajectories.


@torch.no_grad()
def block_logits(model, prefix: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Logits [N, B, V] of the block rows: each sees its prefix and its whole block."""
    p = prefix.shape[1]
    ids = torch.cat([prefix, blocks], 1)
    return model(ids, mask=evaluate.prefix_block_mask(p, blocks.shape[1]))[:, p:]


@torch.no_grad()
def trajectories(model, prefix, truth, mask_id: int, policy: str, table, max_block: int):
    """Runs `policy` ("confidence" or "hybrid") from all-masked blocks; returns the features
    [S, B, F], masked slots [S, B] and labels [S, B] of every intermediate state."""
    n, b = truth.shape
    blocks = torch.full((n, b), mask_id, dtype=torch.long)
    states = []
    rows = torch.arange(n)
    while bool((blocks == mask_id).any()):
        logits = block_logits(model, prefix, blocks)
        top, prob, entropy = summarize(logits, mask_id)
        masked = blocks == mask_id
        live = masked.any(1)
        states.append((features(blocks, top, prob, entropy, table, mask_id, max_block)[live],
                       masked[live], top[..., 0][live], live))
        conf = torch.where(masked, prob[..., 0], torch.full_like(prob[..., 0], -1.0))
        best = conf.argmax(1)
        commit = torch.zeros_like(masked)
        commit[rows, best] = True
        if policy == "hybrid":
            agree = masked & (top[..., 0] == truth)
            commit = torch.where(agree.any(1, keepdim=True), agree, commit)
        commit &= masked & live[:, None]
        blocks = torch.where(commit, top[..., 0], blocks)
    out_f, out_m, out_y = [], [], []
    for feats, masked, top1, live in states:
        out_f.append(feats)
        out_m.append(masked)
        out_y.append((top1 == blocks[live]).float())
    return torch.cat(out_f), torch.cat(out_m), torch.cat(out_y)


def windows(stream: np.ndarray, count: int, prefix: int, block: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - prefix - block, size=count)
    return torch.from_numpy(np.stack([stream[s:s + prefix + block] for s in starts]).astype(
        np.int64))


def collect(model, stream, spec, mask_id: int, table, seed: int, count: int) -> dict:
    """Trajectory samples per block length: {B: (features, masked, labels)}."""
    data = {}
    for bi, b in enumerate(spec.block_sizes):
        parts = []
        w = windows(stream, count, spec.prefix, b, seed + bi)
        for start in range(0, count, spec.batch_windows):
            chunk = w[start:start + spec.batch_windows]
            for policy in ("confidence", "hybrid"):
                parts.append(trajectories(model, chunk[:, :spec.prefix], chunk[:, spec.prefix:],
                                          mask_id, policy, table, spec.max_block))
        data[b] = tuple(torch.cat([p[i] for p in parts]) for i in range(3))
    return data


# ---------------------------------------------------------------------------------------------
# Held-out evaluation: TPF against agreement with the serial decode.


@torch.no_grad()
def decode(model, prefix, b: int, mask_id: int, rule):
    """Decodes one all-masked block per row with `rule(blocks, top, prob, entropy) -> score`,
    committing the most confident masked slot (the serial step) and every masked slot whose
    score reaches the rule's threshold. Returns (blocks [N, b], forwards per row [N])."""
    n = prefix.shape[0]
    blocks = torch.full((n, b), mask_id, dtype=torch.long)
    forwards = torch.zeros(n, dtype=torch.long)
    rows = torch.arange(n)
    while bool((blocks == mask_id).any()):
        masked = blocks == mask_id
        live = masked.any(1)
        forwards += live.long()
        logits = block_logits(model, prefix, blocks)
        top, prob, entropy = summarize(logits, mask_id)
        score, threshold = rule(blocks, top, prob, entropy)
        conf = torch.where(masked, prob[..., 0], torch.full_like(prob[..., 0], -1.0))
        commit = (score >= threshold) & masked
        commit[rows, conf.argmax(1)] = True
        commit &= live[:, None]
        blocks = torch.where(commit, top[..., 0], blocks)
    return blocks, forwards


def confidence_rule(threshold: float):
    return lambda blocks, top, prob, entropy: (prob[..., 0], threshold)


def sampler_rule(sampler: Sampler, threshold: float, mask_id: int):
    def rule(blocks, top, prob, entropy):
        f = features(blocks, top, prob, entropy, sampler.token_features, mask_id,
                     sampler.spec.max_block)
        return torch.sigmoid(sampler(f)), threshold
    return rule


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks)."""
    order = scores.argsort()
    ranks = torch.empty(len(scores), dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    s = scores[order]
    i = 0
    while i < len(s):  # average the ranks of ties
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        if j > i:
            ranks[order[i:j + 1]] = ranks[order[i:j + 1]].mean()
        i = j + 1
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def at_agreement(curve: list[dict], agreement: float) -> float | None:
    """The TPF a curve of {tpf, agreement} points reaches at `agreement`, interpolated linearly
    between its neighbours; None outside the curve's range."""
    pts = sorted((c["agreement"], c["tpf"]) for c in curve)
    for (a0, t0), (a1, t1) in zip(pts, pts[1:]):
        if a0 <= agreement <= a1:
            return t0 if a1 == a0 else t0 + (t1 - t0) * (agreement - a0) / (a1 - a0)
    return None


def evaluate_heldout(model, sampler: Sampler, stream, spec, mask_id: int, seed: int) -> dict:
    result = {}
    for bi, b in enumerate(spec.block_sizes):
        w = windows(stream, spec.eval_windows, spec.prefix, b, seed + 100 + bi)
        prefix = w[:, :spec.prefix]
        target, _ = decode(model, prefix, b, mask_id, confidence_rule(math.inf))
        curves = {}
        for name, sweep, make in (
                ("confidence", CONFIDENCE_SWEEP, confidence_rule),
                ("sampler", SAMPLER_SWEEP, lambda t: sampler_rule(sampler, t, mask_id))):
            curve = []
            for t in sweep:
                blocks, forwards = decode(model, prefix, b, mask_id, make(t))
                curve.append({"threshold": t,
                              "tpf": round(b * len(w) / int(forwards.sum()), 4),
                              "agreement": round(float((blocks == target).float().mean()), 4)})
            curves[name] = curve
        for point in curves["sampler"]:
            at = at_agreement(curves["confidence"], point["agreement"])
            point["confidence_tpf_at_equal_agreement"] = None if at is None else round(at, 4)
        result[str(b)] = curves
    return result


# ---------------------------------------------------------------------------------------------
# Export.


def write(out: Path, sampler: Sampler, model_config: dict, mask_id: int, extra: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    spec = sampler.spec
    config = {"format": "tandem-diffusion-sampler", "version": 1,
              "vocab_size": model_config["vocab_size"], "mask_token_id": mask_id,
              "token_feature_dims": spec.token_feature_dims, "hidden": spec.hidden,
              "layers": spec.layers, "heads": spec.heads, "ffn": spec.ffn,
              "max_block": spec.max_block, "layer_norm_eps": spec.eps,
              "threshold": spec.threshold, **extra}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().float().contiguous() for k, v in sampler.state_dict().items()}
    tensors["head.weight"] = tensors["head.weight"].reshape(1, -1)
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"),
              metadata={"format": "pt"})


@torch.no_grad()
def decode_prompt(model, sampler: Sampler, prompt: list[int], mask_id: int, block: int,
                  threshold: float) -> dict:
    """The `diffusion` mode with the sampler (DiffusionMode): blocks of `block` masks after the
    committed sequence; each forward commits the most confident masked slot and every masked
    slot whose sampler probability reaches `threshold`; a finished block joins the sequence."""
    seq, forwards, margin = list(prompt), 0, 1.0
    while len(seq) - len(prompt) < evaluate.NEW_TOKENS:
        prefix = torch.tensor([seq])
        cur = torch.full((1, block), mask_id, dtype=torch.long)
        while bool((cur == mask_id).any()):
            logits = block_logits(model, prefix, cur)
            forwards += 1
            top, prob, entropy = summarize(logits, mask_id)
            f = features(cur, top, prob, entropy, sampler.token_features, mask_id,
                         sampler.spec.max_block)
            p = torch.sigmoid(sampler(f))[0]
            masked = cur[0] == mask_id
            margin = min(margin, float((p[masked] - threshold).abs().min()))
            conf = torch.where(masked, prob[0, :, 0], torch.full_like(prob[0, :, 0], -1.0))
            commit = masked & (p >= threshold)
            commit[conf.argmax()] = True
            cur[0] = torch.where(commit, top[0, :, 0], cur[0])
        seq += cur[0].tolist()
    return {"continuation_ids": seq[len(prompt):][:evaluate.NEW_TOKENS], "forwards": forwards,
            "min_threshold_margin": margin}


@torch.no_grad()
def fixture(model, sampler: Sampler, stream, spec, mask_id: int, seed: int,
            prompts: list[list[int]], block: int) -> dict:
    """Held-out block states mid-denoising, with what the engine must compute for them (the
    top-3 summary of each masked slot, the features and the sampler's probabilities), and the
    `diffusion` mode's decodes of `prompts` with the sampler at its suggested threshold."""
    cases = []
    rng = np.random.default_rng(seed + 200)
    for b in spec.block_sizes:
        w = windows(stream, 3, spec.prefix, b, seed + 300 + b)
        for row in w:
            prefix = row[None, :spec.prefix]
            keep = rng.random(b) < 0.4  # a mid-trajectory state: some slots committed
            blocks = torch.where(torch.from_numpy(keep), row[spec.prefix:],
                                 torch.full((b,), mask_id))[None]
            top, prob, entropy = summarize(block_logits(model, prefix, blocks), mask_id)
            f = features(blocks, top, prob, entropy, sampler.token_features, mask_id,
                         spec.max_block)
            p = torch.sigmoid(sampler(f)) * (blocks == mask_id).float()
            masked = (blocks[0] == mask_id).nonzero().flatten().tolist()
            cases.append({"prefix": prefix[0].tolist(), "block": blocks[0].tolist(),
                          "top": [top[0, i].tolist() for i in masked],
                          "prob": [[round(x, 6) for x in prob[0, i].tolist()] for i in masked],
                          "entropy": [round(float(entropy[0, i]), 6) for i in masked],
                          "features": [[round(x, 6) for x in r] for r in f[0].tolist()],
                          "probability": [round(x, 6) for x in p[0].tolist()]})
    decodes = [decode_prompt(model, sampler, p, mask_id, block, spec.threshold) for p in prompts]
    return {"description": "diffusion sampler parity cases (tools/train/sampler.py fixture)",
            "cases": cases, "decode": {"block_size": block, "threshold": spec.threshold,
                                       "new_tokens": evaluate.NEW_TOKENS, "cases": decodes}}


def fixture_prompts(base_dir: Path) -> list[list[int]]:
    """The prompts of the model's greedy fixture (the engine's bundled-model tests use them)."""
    greedy = json.loads((base_dir / "fixtures" / "greedy.json").read_text())
    return [c["prompt_ids"] for c in greedy["cases"]]


def load(folder: Path) -> Sampler:
    """A sampler/ folder as written by `write`."""
    import recipes

    config = json.loads((folder / "config.json").read_text())
    spec = recipes.SamplerSpec(token_feature_dims=config["token_feature_dims"],
                               hidden=config["hidden"], layers=config["layers"],
                               heads=config["heads"], ffn=config["ffn"],
                               max_block=config["max_block"], eps=config["layer_norm_eps"],
                               threshold=config["threshold"])
    tensors = load_file(str(folder / "model.safetensors"))
    sampler = Sampler(spec, tensors["token_features"])
    sampler.load_state_dict(tensors, strict=True)
    return sampler.eval()


def write_fixture(base_dir: Path, model, sampler: Sampler, held, spec, mask_id: int,
                  seed: int, block: int) -> None:
    fixtures = base_dir / "fixtures"
    fixtures.mkdir(exist_ok=True)
    data = fixture(model, sampler, held, spec, mask_id, seed, fixture_prompts(base_dir), block)
    (fixtures / "sampler.json").write_text(json.dumps(data) + "\n")


def main() -> int:
    """`sampler.py fixture MODEL_DIR`: rewrites MODEL_DIR/fixtures/sampler.json from the
    model's sampler/ folder (the recipe's seed and held-out split)."""
    import argparse

    import corpus as corpus_lib
    import data
    import export
    import recipes
    import tokenizer as tokenizer_lib

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("command", choices=("fixture",))
    parser.add_argument("model_dir", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    recipe = recipes.SAMPLER
    model, config, tok = export.load(args.model_dir)
    specials = tokenizer_lib.special_ids(tok)
    mask_id, eos_id = specials[tokenizer_lib.MASK], specials[tokenizer_lib.ENDOFTEXT]
    held = data.token_stream(tok, corpus_lib.load().heldout, eos_id)
    sampler = load(args.model_dir / recipe.sampler.folder)
    write_fixture(args.model_dir, model, sampler, held, recipe.sampler, mask_id, recipe.seed,
                  config["block_size"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ---------------------------------------------------------------------------------------------
# Training.


def train(args, recipe) -> int:
    import corpus as corpus_lib
    import data
    import export
    import tokenizer as tokenizer_lib

    repo = Path(__file__).resolve().parents[2]
    spec = recipe.sampler
    base_dir = repo / "models" / recipe.init_from
    out = args.out or base_dir / spec.folder
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()

    model, config, tok = export.load(base_dir)
    for p in model.parameters():
        p.requires_grad_(False)
    specials = tokenizer_lib.special_ids(tok)
    mask_id, eos_id = specials[tokenizer_lib.MASK], specials[tokenizer_lib.ENDOFTEXT]
    corpus = corpus_lib.load()
    stream = data.token_stream(tok, corpus.train, eos_id)
    held = data.token_stream(tok, corpus.heldout, eos_id)

    torch.manual_seed(recipe.seed)
    table = token_feature_table(model.model.embed_tokens.weight.detach(),
                                spec.token_feature_dims)
    samples = collect(model, stream, spec, mask_id, table, recipe.seed, spec.train_windows)
    held_samples = collect(model, held, spec, mask_id, table, recipe.seed + 1000,
                           spec.eval_windows)
    t_data = time.time() - t_start
    counts = {str(b): int(m.sum()) for b, (_, m, _) in samples.items()}
    print(f"sampler: trajectories in {t_data:.0f}s, masked-slot samples {counts}", flush=True)

    sampler = Sampler(spec, table)
    with torch.no_grad():
        nn.init.normal_(sampler.position, 0.0, 0.02,
                        generator=torch.Generator().manual_seed(recipe.seed))
    opt = torch.optim.AdamW([p for n, p in sampler.named_parameters()], lr=recipe.peak_lr,
                            weight_decay=recipe.weight_decay, betas=recipe.betas)
    steps = recipe.total_steps
    history = []
    sizes = list(samples)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = recipe.lr_at(step)
        b = sizes[step % len(sizes)]
        f, m, y = samples[b]
        idx = torch.from_numpy(data.step_rng(recipe.seed, 0, step).integers(
            0, len(f), size=recipe.batch_size))
        logits = sampler(f[idx])
        loss = F.binary_cross_entropy_with_logits(logits[m[idx]], y[idx][m[idx]])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(sampler.parameters(), recipe.grad_clip)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            history.append({"step": step, "loss": round(loss.item(), 4)})
            print(f"sampler: step {step} loss {loss.item():.4f}", flush=True)
        if args.minutes and time.time() - t_start > args.minutes * 60:
            print("sampler: stopped by --minutes", flush=True)
            break
    sampler.eval()

    with torch.no_grad():
        aucs = {}
        for b, (f, m, y) in held_samples.items():
            p = torch.sigmoid(sampler(f))[m]
            aucs[str(b)] = {"sampler": round(auc(p, y[m]), 4),
                            "confidence": round(auc(f[..., 1][m], y[m]), 4),
                            "positives": round(float(y[m].mean()), 4)}
    curves = evaluate_heldout(model, sampler, held, spec, mask_id, recipe.seed)
    report = {"recipe": recipe.name, "base_model": recipe.init_from,
              "python_corpus": corpus.python_version, "threads": args.threads,
              "samples": counts, "steps": steps, "history": history,
              "heldout_auc": aucs, "heldout_decoding": curves,
              "minutes": round((time.time() - t_start) / 60, 1)}
    write(out, sampler, config, mask_id, {"trained_block_sizes": list(spec.block_sizes)})
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "MODEL.md").write_text(card(report, spec))
    write_fixture(base_dir, model, sampler, held, spec, mask_id, recipe.seed,
                  config["block_size"])
    print(json.dumps({"heldout_auc": aucs, "heldout_decoding": curves}, indent=2))
    return 0


def card(report: dict, spec) -> str:
    lines = [
        "# Diffusion sampler of tandem-target",
        "",
        "The `diffusion` mode's trained sampler (Nemotron-Labs-Diffusion §3.2, App. A): a "
        f"{spec.layers}-layer bidirectional transformer (d = {spec.hidden}, {spec.heads} heads) "
        "over the current block that predicts, per masked slot, whether the model's top-1 "
        "prediction is the token the block ends with. `diffusion` uses it with "
        "`diffusion_sampler` > 0 (gRPC `ModeOptions.diffusion_sampler`, "
        "`tandem generate --diffusion-sampler T`). Features and network: "
        "worker/decoding/diffusion_sampler.h.",
        "",
        f"Rebuild: `.venv/bin/python tools/train/train.py --recipe sampler` "
        f"({report['minutes']} min on {report['threads']} thread(s)).",
        "",
        "Training data: the frozen model's own denoising trajectories on corpus windows "
        f"({spec.prefix}-token clean prefix, one block; block lengths "
        f"{', '.join(map(str, spec.block_sizes))}), confidence order and the hybrid "
        f"ground-truth policy; masked-slot samples: {report['samples']}.",
        "",
        "## Held-out AUC (label: top-1 is final)",
        "",
        "| block | sampler | top-1 probability alone | positive rate |",
        "|---:|---:|---:|---:|",
    ]
    for b, a in report["heldout_auc"].items():
        lines.append(f"| {b} | {a['sampler']} | {a['confidence']} | {a['positives']} |")
    lines += ["", "## Held-out decoding: TPF against agreement with the serial decode", "",
              "Per block, the serial-denoising target (one slot per forward, most confident "
              "first); then each rule decodes the same all-masked block. agreement = slots equal "
              "to the target. 'conf. TPF at equal agr.' interpolates the confidence curve at the "
              "sampler point's agreement.", ""]
    for b, curves in report["heldout_decoding"].items():
        lines += [f"### Block {b}", "", "| rule | threshold | TPF | agreement | "
                  "conf. TPF at equal agr. |", "|---|---:|---:|---:|---:|"]
        for name in ("confidence", "sampler"):
            for c in curves[name]:
                eq = c.get("confidence_tpf_at_equal_agreement")
                lines.append(f"| {name} | {c['threshold']} | {c['tpf']} | {c['agreement']} | "
                             f"{'-' if eq is None else eq} |")
        lines.append("")
    return "\n".join(lines)
