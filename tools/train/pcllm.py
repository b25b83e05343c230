"""pcLLM progressive consistency distillation, as a LoRA adapter merged into the target.

pcLLM §3.1 turns an AR model into a faster Jacobi decoder by training it to predict the fixed
point of a Jacobi trajectory from the trajectory's noisy intermediate states, next to an AR
loss that keeps its output quality. The result is a new AR model: `jacobi` on it reproduces
*its* greedy output exactly, and decodes it in fewer forwards. Here the change is a LoRA
adapter on every projection, on every row (not gated: the served model is base + adapter), so
it ships in about a megabyte beside the target and the engine merges it into the weights when
it loads the model (`--merge-lora`).

Data (`trajectories`): the target's greedy continuations of train-split prompts (distill.py
rows; every prompt length is a multiple of the block size n, so blocks of n tokens after the
prompt are fixed points of greedy Jacobi decoding). For each such block the frozen target runs
Jacobi decoding from a first guess made as the engine makes one (the tokens after an earlier
occurrence of the last prefix token, else that token repeated) until it reaches the fixed
point; every state is kept.

Layout (`packed_mask`): `[clean x | noisy y]` at the same positions 0..L-1 (Figure 1b). Clean
rows are causal over the clean stream; a noisy row of block [c, c + n) reads the clean prefix
x[< c] and the noisy rows of its own block up to itself (causal within the block: the
noise-aware causal mask). Noisy row i holds the state's token at i and predicts x[i + 1], the
fixed point's next token (its last row predicts the token after the block, Jacobi's bonus).

Noise schedule (pcLLM Eq. 7, linear progressive): the k-th of the m continuation blocks of a
row takes the trajectory state whose share of unconverged tokens is nearest to k / m.

Loss: progressive consistency cross-entropy over the noisy rows of continuation blocks plus the
AR term, here KL(target || adapted) over every clean row: the adapted model stays close to the
target's whole next-token distribution, not only its greedy choice.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import lora
from model import Qwen3LM


def packed_mask(seq_len: int, block: int) -> torch.Tensor:
    """bool [2L, 2L] attention of the [clean | noisy] layout (True = may read)."""
    if seq_len % block != 0:
        raise ValueError(f"seq_len {seq_len} is not a multiple of the block size {block}")
    idx = torch.arange(seq_len)
    blk = idx // block
    causal = idx[None, :] <= idx[:, None]
    top = torch.cat([causal, torch.zeros(seq_len, seq_len, dtype=torch.bool)], dim=1)
    noisy_clean = idx[None, :] < (blk * block)[:, None]
    noisy_noisy = (blk[None, :] == blk[:, None]) & causal
    return torch.cat([top, torch.cat([noisy_clean, noisy_noisy], dim=1)], dim=0)


def packed_positions(seq_len: int) -> torch.Tensor:
    idx = torch.arange(seq_len)
    return torch.cat([idx, idx])


def initial_guess(prefix: np.ndarray, n: int) -> np.ndarray:
    """A first guess for the n tokens after `prefix`, as the engine makes one
    (worker/decoding/jacobi.cc, there with a bigram match and the n-gram pool first): the tokens
    that followed the latest earlier occurrence of the last token, else that token repeated."""
    out: list[int] = []
    seq = list(prefix)
    while len(out) < n:
        seed = out[-1] if out else seq[-1]
        hist = seq + out
        found = -1
        for j in range(len(hist) - 2, -1, -1):
            if hist[j] == seed:
                found = j
                break
        if found >= 0 and found + 1 < len(hist) - 1:
            take = hist[found + 1:found + 1 + (n - len(out))]
            out.extend(take)
        else:
            out.append(seed)
    return np.asarray(out[:n], dtype=np.int64)


@torch.no_grad()
def trajectories(model: Qwen3LM, rows: np.ndarray, plens: np.ndarray, block: int,
                 batch: int = 64, log=print) -> np.ndarray:
    """int16 [R, L / n, n + 1, n]: per row and block, the Jacobi states (state 0 the initial
    guess, then one per iteration, the last repeated once converged; at most n + 1 states).
    Blocks inside the prompt hold the clean tokens."""
    R, L = rows.shape[0], rows.shape[1] - 1
    nb = L // block
    mask = packed_mask(L, block)
    pos = packed_positions(L)
    out = np.empty((R, nb, block + 1, block), dtype=np.int16)
    for lo in range(0, R, batch):
        x = torch.from_numpy(rows[lo:lo + batch, :L].astype(np.int64))
        b = x.shape[0]
        y = x.clone()
        for r in range(b):
            p = int(plens[lo + r])
            for c in range(p, L, block):
                y[r, c:c + block] = torch.from_numpy(initial_guess(rows[lo + r, :c], block))
        states = [y.clone()]
        for _ in range(block):
            logits = model(torch.cat([x, y], dim=1), pos, mask)
            clean_pred = logits[:, :L].argmax(-1)
            noisy_pred = logits[:, L:].argmax(-1)
            nxt = y.clone()
            for r in range(b):
                p = int(plens[lo + r])
                for c in range(p, L, block):
                    nxt[r, c] = clean_pred[r, c - 1]
                    nxt[r, c + 1:c + block] = noisy_pred[r, c:c + block - 1]
            y = nxt
            states.append(y.clone())
        st = torch.stack(states, dim=1).view(b, block + 1, nb, block).transpose(1, 2)
        out[lo:lo + b] = st.numpy().astype(np.int16)
        log(f"pcllm: trajectories of {lo + b}/{R} rows", flush=True)
    return out


def pick_states(rng: np.random.Generator, traj: np.ndarray, rows: np.ndarray, plens: np.ndarray,
                block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(noisy stream [B, L], bool [B, L] rows that carry a consistency label) for rows `rows`
    of the dataset: the linear progressive schedule over each row's continuation blocks, ties
    broken at random."""
    B, nb = traj.shape[0], traj.shape[1]
    L = nb * block
    noisy = np.empty((B, L), dtype=np.int64)
    labelled = np.zeros((B, L), dtype=bool)
    for r in range(B):
        first = int(plens[r]) // block
        m = nb - first
        for b in range(nb):
            states = traj[r, b].astype(np.int64)
            if b < first:
                noisy[r, b * block:(b + 1) * block] = states[0]
                continue
            fixed = rows[r, b * block:(b + 1) * block]  # the fixed point
            share = (states != fixed[None, :]).mean(-1)  # unconverged share per state
            want = (b - first + 1) / m  # the (b - first + 1)-th of m continuation blocks
            gap = np.abs(share - want)
            best = np.flatnonzero(gap <= gap.min() + 1e-9)
            s = int(rng.choice(best))
            noisy[r, b * block:(b + 1) * block] = states[s]
            labelled[r, b * block:(b + 1) * block] = True
    return torch.from_numpy(noisy), torch.from_numpy(labelled)


def loss(model: Qwen3LM, gate: lora.Gate, base_logits: torch.Tensor, tokens: torch.Tensor,
         noisy: torch.Tensor, labelled: torch.Tensor, block: int,
         ar_weight: float = 1.0) -> tuple[torch.Tensor, dict]:
    """L_pc + ar_weight * KL(target || adapted) on the clean stream; tokens [B, L + 1]."""
    L = tokens.shape[1] - 1
    x = tokens[:, :L]
    gate.mask = torch.ones(2 * L, dtype=torch.bool)  # the adapter on every row
    try:
        logits = model(torch.cat([x, noisy], dim=1), packed_positions(L), packed_mask(L, block))
    finally:
        gate.mask = None
    labels = torch.where(labelled, tokens[:, 1:], torch.full_like(x, -100))
    pc = F.cross_entropy(logits[:, L:].flatten(0, 1), labels.flatten(), ignore_index=-100)
    logp = F.log_softmax(logits[:, :L], dim=-1)
    base = F.log_softmax(base_logits, dim=-1)
    kl = (base.exp() * (base - logp)).sum(-1).mean()
    return pc + ar_weight * kl, {"pc": float(pc.detach()), "kl": float(kl.detach())}


def forward(model: Qwen3LM, gate: lora.Gate | None, ids: torch.Tensor) -> torch.Tensor:
    """Causal logits of the adapted model (gate given: the adapter on every row) or of the
    target (gate None, or an adapter not attached)."""
    if gate is None:
        return model(ids)
    gate.mask = torch.ones(ids.shape[1], dtype=torch.bool)
    try:
        return model(ids)
    finally:
        gate.mask = None


@torch.no_grad()
def jacobi_decode(model: Qwen3LM, gate: lora.Gate | None, prompt: list[int], new_tokens: int,
                  block: int) -> dict:
    """Plain greedy Jacobi decoding (no recycling, full recomputation): the output and the
    forwards it took after the prompt's."""
    seq = list(prompt)
    forwards = 0
    guess = list(initial_guess(np.asarray(seq), block))
    while len(seq) - len(prompt) < new_tokens:
        logits = forward(model, gate, torch.tensor([seq + guess]))[0]
        forwards += 1
        pred = logits[len(seq) - 1:].argmax(-1).tolist()  # pred[j] follows seq + guess[:j]
        k = 0
        while k < block and guess[k] == pred[k]:
            k += 1
        seq.extend(pred[:k + 1])
        rest = pred[k + 1:]
        if len(rest) < block:
            rest += list(initial_guess(np.asarray(seq + rest), block - len(rest)))
        guess = rest[:block]
    return {"tokens": seq[len(prompt):len(prompt) + new_tokens], "forwards": forwards}


@torch.no_grad()
def greedy(model: Qwen3LM, gate: lora.Gate | None, prompt: list[int], new_tokens: int) -> list[int]:
    seq = list(prompt)
    for _ in range(new_tokens):
        seq.append(int(forward(model, gate, torch.tensor([seq]))[0, -1].argmax()))
    return seq[len(prompt):]


# ---------------------------------------------------------------------------------------------
# Held-out measures: what the adapter costs in quality and gains in Jacobi decoding.


@torch.no_grad()
def heldout_nll(model: Qwen3LM, gate: lora.Gate | None, windows: torch.Tensor,
                batch: int = 8) -> float:
    """Mean next-token negative log-likelihood (nats) on held-out windows [N, L + 1]."""
    total = 0.0
    for w in windows.split(batch):
        logits = forward(model, gate, w[:, :-1])
        total += float(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(),
                                       reduction="sum"))
    return total / (windows.shape[0] * (windows.shape[1] - 1))


def distinct_bigrams(tokens: list[int]) -> float:
    """Share of a text's token bigrams that are distinct: 1 = no bigram repeats; a loop of one
    short phrase drives it towards 0."""
    pairs = list(zip(tokens, tokens[1:]))
    return len(set(pairs)) / max(1, len(pairs))


@torch.no_grad()
def decode_measures(model: Qwen3LM, gate: lora.Gate, prompts: list[list[int]], new_tokens: int,
                    block: int) -> dict:
    """On held-out prompts, for the target and the adapted model: plain Jacobi tokens per
    forward, the target's NLL of each model's greedy text, its distinct-bigram share, and how
    much of the adapted model's greedy text equals the target's."""
    out = {}
    texts = {}
    for name, g in (("target", None), ("adapted", gate)):
        tokens = forwards = 0
        nll = distinct = 0.0
        texts[name] = []
        for p in prompts:
            run = jacobi_decode(model, g, p, new_tokens, block)
            tokens += len(run["tokens"])
            forwards += run["forwards"]
            texts[name].append(run["tokens"])
            ids = torch.tensor([p + run["tokens"]])
            logits = model(ids)[0, len(p) - 1:-1]  # the target's, adapter off
            nll += float(F.cross_entropy(logits, torch.tensor(run["tokens"]), reduction="mean"))
            distinct += distinct_bigrams(run["tokens"])
        out[name] = {"jacobi_plain_tpf": round(tokens / forwards, 4),
                     "target_nll_of_greedy": round(nll / len(prompts), 4),
                     "distinct_bigrams": round(distinct / len(prompts), 4)}
    same = sum(sum(a == b for a, b in zip(x, y)) for x, y in zip(texts["target"],
                                                                 texts["adapted"]))
    out["greedy_token_agreement"] = round(same / sum(len(x) for x in texts["target"]), 4)
    return out


def heldout_prompts(stream: np.ndarray, count: int, length: int, seed: int = 5) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - length, size=count)
    return [stream[s:s + length].astype(np.int64).tolist() for s in starts]


# ---------------------------------------------------------------------------------------------
# Training driver (train.py --recipe pcllm).


def train(args, recipe) -> int:
    import time

    import data

    run = lora.prepare(args, recipe)
    spec, model, rows, plens = recipe.lora, run.model, run.rows, run.plens
    n = recipe.block_size
    if any(int(p) % n for p in plens):
        raise ValueError(f"distilled prompt lengths {sorted(set(plens.tolist()))} are not "
                         f"multiples of the block size {n}")
    traj_path = run.work / f"pcllm-trajectories-{run.distill_info['cache_file']}-n{n}.npy"
    t0 = time.time()
    traj_cached = traj_path.exists()
    if traj_cached:
        traj = np.load(traj_path)
    else:
        traj = trajectories(model, rows, plens, n)
        np.save(traj_path, traj)
    traj_seconds = time.time() - t0

    gate = lora.attach(model, spec.rank, spec.alpha, spec.targets, seed=recipe.seed)
    params = lora.trainable(model)
    n_params = sum(p.numel() for p in params)
    L = recipe.seq_len
    print(f"recipe {recipe.name}: adapter of {n_params:,d} parameters on every row of models/"
          f"{recipe.init_from}; {rows.shape[0]} trajectories rows", flush=True)

    def step_loss(step: int):
        rng = data.step_rng(recipe.seed, 0, step)
        pick = rng.integers(0, rows.shape[0], size=recipe.batch_size)
        tokens = torch.from_numpy(rows[pick].astype(np.int64))
        noisy, labelled = pick_states(rng, traj[pick], rows[pick], plens[pick], n)
        with torch.no_grad():
            base_logits = model(tokens[:, :L])  # the gate is off: the target's logits
        value, parts = loss(model, gate, base_logits, tokens, noisy, labelled, n, spec.ar_weight)
        return value, {"consistency_loss": parts["pc"], "kl": parts["kl"]}

    history, steps_done, truncated = lora.optimise(
        args, recipe, run, params, step_loss, {"consistency_loss": 4, "kl": 4})
    train_wall = time.time() - run.t_start
    lora.save(run.out, model, spec.rank, spec.alpha, spec.targets, recipe.init_from)
    model.eval()
    nll = {"target": round(heldout_nll(model, None, run.held), 4),
           "adapted": round(heldout_nll(model, gate, run.held), 4)}
    decode = decode_measures(model, gate, heldout_prompts(run.held_stream, spec.eval_prompts, 48),
                             64, n)
    print(f"held-out NLL {nll}; decoding {decode}", flush=True)
    lora.write_summary(args, recipe, run, n_params, steps_done, truncated, train_wall, history,
                       trajectory_seconds=round(traj_seconds, 1), trajectories_cached=traj_cached,
                       trajectory_states=int(traj.shape[0] * traj.shape[1]), heldout_nll=nll,
                       heldout_decoding=decode)
    return 0


# ---------------------------------------------------------------------------------------------
# Model card section (model_card.py appends it to the base model's MODEL.md).


def bench_table(model_folder: Path, adapter: Path) -> str:
    """jacobi variants of the target (the model folder's bench.json) beside the same variants
    on the adapted model (the adapter's bench.json), and the adapted model's AR row."""
    import idlm
    merged = json.loads((adapter / "bench.json").read_text())
    rows = [dict(r, variant=f"+pcllm {r['variant']}") for r in merged["results"]]
    base_file = model_folder / "bench.json"
    if base_file.exists():
        base = json.loads(base_file.read_text())
        rows = [r for r in base["results"] if r["mode"] == "jacobi"] + rows
    return idlm.bench_rows({"results": rows})


def card_section(model_folder: Path, adapter: Path) -> str:
    tr = json.loads((adapter / "training.json").read_text())
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    r = tr["recipe"]
    spec = r["lora"]
    n = r["block_size"]
    size = (adapter / "adapter_model.safetensors").stat().st_size
    nll, dec = tr["heldout_nll"], tr["heldout_decoding"]
    t, a = dec["target"], dec["adapted"]
    truncated = (f" The `--minutes` guard stopped the run after {tr['steps_done']} of "
                 f"{r['total_steps']} steps." if tr["truncated"] else "")
    first, last = tr["history"][0], tr["history"][-1]
    traj_time = ("; read from the work folder's cache"
                 if tr.get("trajectories_cached") else
                 f", {tr['trajectory_seconds'] / 60:.1f} min")
    bench = ""
    if (adapter / "bench.json").exists():
        b = json.loads((adapter / "bench.json").read_text())
        bench = f"""
**In the engine** (`tandem bench modes`, greedy, {b['max_tokens']} new tokens per prompt, the
prompts of `fixtures/bench_prompts.json`): the target's `jacobi` variants (from this folder's
`bench.json`) beside the adapted model's (`+pcllm`, from `{adapter.name}/bench.json`). `seq=AR`
compares each with the AR output of its own model: 100% is the lossless check.

{bench_table(model_folder, adapter)}

Command:

```sh
build/services/cli/tandem bench modes --model models/{model_folder.name} --merge-lora \\
  models/{model_folder.name}/{adapter.name} --modes ar,jacobi --json \\
  > models/{model_folder.name}/{adapter.name}/bench.json
```
"""
    return f"""## pcLLM adapter (`{adapter.name}/`)

pcLLM (progressive consistency distillation, §3.1) as a LoRA adapter on every row: merged into
the weights at load (`tandem generate --mode jacobi --merge-lora
models/{model_folder.name}/{adapter.name}`, or `tandem-verifier --merge-lora`), it makes a
variant of this model that Jacobi decoding (`jacobi`) converges on in fewer forwards. Unlike the
drafting adapters it changes the model: every mode then serves base + adapter, and `jacobi`
reproduces the *adapted* model's greedy output exactly (the engine's
`JacobiPcllmBundledModelTest` checks it). What that costs in quality is measured below.

**Files:** `adapter_config.json` (PEFT, `r` = {cfg['r']}, `lora_alpha` = {cfg['lora_alpha']:g},
`target_modules` = {', '.join(cfg['target_modules'])}), `adapter_model.safetensors`
({size / 1e6:.2f} MB, fp32, {tr['adapter_parameters']:,d} parameters), `training.json`.

**Data** (`tools/train/pcllm.py`, recipe `{r['name']}`): the {tr['distill']['rows']:,d} cached
rows of this model's greedy continuations of train-split prompts (`distill.py`). For every block
of n = {n} continuation tokens the frozen model ran greedy Jacobi decoding from a first guess
(the tokens after an earlier occurrence of the last token) to its fixed point, keeping every
state: {tr['trajectory_states']:,d} blocks (prompt blocks included){traj_time}.

**Objective:** the packed layout `[clean x | noisy y]` at the same positions, with the
noise-aware causal mask (Figure 1b): a noisy row of block [c, c + n) reads the clean prefix
x[< c] and its own block's noisy rows up to itself. Each continuation block takes the
trajectory state whose unconverged share is nearest k / m (the k-th of the row's m continuation
blocks: the linear progressive schedule of Eq. 7). Loss = cross-entropy of every noisy row
against the fixed point's next token (the progressive consistency loss) + {spec['ar_weight']:g} ×
KL(target ‖ adapted) over the clean rows (the AR loss, here a distillation of the target's whole
next-token distribution, so the adapted model stays close to the target).

**Training:** AdamW (β = {tuple(r['betas'])}, no weight decay), peak lr {r['peak_lr']:g}, warmup
{r['warmup_steps']} steps then WSD, gradient clip {r['grad_clip']}, {r['batch_size']} rows of
{r['seq_len']} tokens a step; {tr['steps_done']} steps in {tr['train_wall_seconds'] / 60:.1f} min wall
on {tr['hardware']['threads']} thread(s) (setup and trajectories included).{truncated}
Consistency loss {first['consistency_loss']:.3f} → {last['consistency_loss']:.3f}, KL
{first['kl']:.4f} → {last['kl']:.4f} (first and last logged windows).

**Held-out** ({tr['heldout_windows']} held-out windows; {spec['eval_prompts']} held-out prompts of
48 tokens, 64 greedy tokens each, decoded in PyTorch):

| measure | target | + pcLLM adapter |
|---|---|---|
| next-token NLL on held-out text (nats) | {nll['target']:.3f} | {nll['adapted']:.3f} |
| plain Jacobi tokens per forward (n = {n}, no recycling) | {t['jacobi_plain_tpf']:.2f} | **{a['jacobi_plain_tpf']:.2f}** |
| the target's NLL of the model's greedy text (nats / token) | {t['target_nll_of_greedy']:.3f} | {a['target_nll_of_greedy']:.3f} |
| distinct token bigrams in the greedy text | {t['distinct_bigrams']:.1%} | {a['distinct_bigrams']:.1%} |

The adapted model's greedy tokens equal the target's at {dec['greedy_token_agreement']:.1%} of
positions.
{bench}
Rebuild: `.venv/bin/python tools/train/train.py --recipe {r['name']}` (reads the cached
distillation rows and trajectories from `--work`, generating them when absent).

"""
