"""Training recipes: everything that decides a bundled model, by name.

A recipe fixes the number of optimiser steps (not a time budget), so a rebuild with the same
library versions and thread count takes the same steps on the same batches and reproduces the
weights. Step counts were sized with a throughput probe on the reference machine (see the
model card) to fit the wall-clock budget written next to each recipe.
"""

from __future__ import annotations

import dataclasses

from distill import DistillSpec
from model import ModelConfig


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    steps: int
    # Weight of the diffusion loss: L = L_AR + alpha * L_diff. 0 trains AR only, on a plain
    # causal forward (no dual stream, half the compute).
    alpha: float


@dataclasses.dataclass(frozen=True)
class DFlashSpec:
    """A DFlash drafter's conditioning on its target (dflash.py)."""

    target: str  # model folder under models/ whose hidden states, embeddings and LM head it uses
    # Target hidden-state rows fed to the drafter's fc: layer l = the residual stream after l
    # decoder layers (0 = embeddings, num_layers = before the final norm).
    target_layer_ids: tuple[int, ...] = (1, 2, 4)
    max_anchor: int = 4  # known clean tokens a at the head of a block: 1..max_anchor
    anchor_one_prob: float = 0.5  # P(a = 1), the standard DFlash state; else a uniform on 2..max
    blocks_per_row: int = 16  # blocks sampled per training row (one forward)
    kl_weight: float = 0.5  # L = CE(target greedy) + kl_weight * KL(target || drafter)
    # Slot k (1 = first draft) weighs exp(-(k - 1) / decay): an early miss ends acceptance.
    slot_decay: float = 7.0


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """A gated LoRA adapter on a bundled model's draft positions (lora.py)."""

    folder: str  # adapter folder inside the base model's folder
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                "down_proj")
    draft_slots: int = 3  # draft slots per block the mode uses (held-out accepted prefix)
    eval_windows: int = 48  # held-out windows for the with / without adapter comparison
    # Objective "pcllm" (pcllm.py): the adapter is on every row (merged into the model when
    # served). Weight of the AR term KL(target || adapted) beside the consistency loss, and the
    # held-out prompts its Jacobi decoding is measured on.
    ar_weight: float = 1.0
    eval_prompts: int = 32


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """The diffusion mode's trained sampler on a frozen bundled model (sampler.py)."""

    folder: str = "sampler"  # inside the base model's folder
    block_sizes: tuple[int, ...] = (8, 16)  # trajectory block lengths (NLD App. A: 8 and 32)
    prefix: int = 32  # clean corpus tokens before each block
    train_windows: int = 768  # blocks per block length, each decoded under both policies
    eval_windows: int = 128  # held-out blocks per block length
    batch_windows: int = 128  # blocks per trajectory forward
    token_feature_dims: int = 16  # PCA components of the token embeddings
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    ffn: int = 128
    max_block: int = 32
    eps: float = 1e-5
    threshold: float = 0.5  # the threshold the engine suggests


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    model: ModelConfig
    stages: tuple[Stage, ...]
    # Modes of docs/MODES.md the trained model serves (recorded in config.json "tandem").
    modes: tuple[str, ...]
    seq_len: int = 256  # training sequence length L (one stream)
    batch_size: int = 8  # sequences per step
    block_size: int = 8  # diffusion block size S; L % S == 0
    peak_lr: float = 3e-3
    final_lr_ratio: float = 0.1  # lr at the last step / peak_lr
    warmup_steps: int = 40
    decay_fraction: float = 0.25  # WSD: linear decay over the last quarter of all steps
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 20240611
    budget_minutes: int = 60  # wall-clock budget the step counts were sized for
    # Layout of the alpha-weighted loss: "diffusion" (diffusion.py, same-position masked
    # blocks), "sdlm" (sdlm.py, shifted all-masked blocks) or "idlm" (idlm.py, all-masked
    # causal introspective-consistency training; alpha unused, the loss is auto-balanced) or
    # "dflash" (dflash.py, its own loop: a drafter conditioned on the target's hidden states).
    objective: str = "diffusion"
    # Bundled model folder (under models/) whose weights and tokenizer the run starts from;
    # None = random init and a tokenizer trained from the corpus.
    init_from: str | None = None
    # Train on this target's greedy continuations (distill.py): a separate drafter (no
    # init_from), or a conversion whose draft pathway should propose what the model emits.
    distill: DistillSpec | None = None
    # DFlash drafter (objective "dflash"): conditioning on the target's hidden states.
    dflash: DFlashSpec | None = None
    # Gated LoRA adapter on init_from's draft positions (objectives "risd", "self_spec_lora").
    lora: LoraSpec | None = None
    # The diffusion mode's trained sampler on init_from (objective "sampler").
    sampler: SamplerSpec | None = None

    @property
    def is_drafter(self) -> bool:
        """A separate drafter: trained from scratch on its target's greedy continuations."""
        return self.distill is not None and self.init_from is None

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def lr_at(self, step: int) -> float:
        """Warmup-stable-decay schedule over the whole run (both stages share one optimiser)."""
        total = self.total_steps
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        decay_start = int(total * (1.0 - self.decay_fraction))
        if step < decay_start:
            return self.peak_lr
        frac = (step - decay_start) / max(1, total - 1 - decay_start)
        return self.peak_lr * (1.0 - (1.0 - self.final_lr_ratio) * frac)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["total_steps"] = self.total_steps
        return d


# Tri-mode target (Nemotron-Labs-Diffusion §2): stage 1 AR only, stage 2 joint AR + 0.3 x
# block diffusion on the dual-stream layout. Block size 8: NLD Table 4 reports its best
# benchmark accuracy at block length 8 (of 4..32) with a 4.2x SOL acceptance ratio; with
# L = 256 it gives 32 diffusion blocks per sequence, each conditioned on a different clean
# prefix; and 8 is the draft width k the engine's self-speculation modes use by default.
# Sizing (4 layers, 4.2M parameters): on one thread of a 2-core AMD EPYC (AVX2, fp32) shared
# with compile jobs, a stage 1 step took 1.1-2.1 s and a stage 2 step (every sequence runs
# twice) 2.3-4.7 s, so 680 + 380 steps take about 35 min on a quiet machine and stay under
# the recipe's 60 min budget on a busy one.
TARGET = Recipe(
    name="target",
    description="tri-mode target: AR + block diffusion (self-speculation capable)",
    model=ModelConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        rope_theta=10000.0,
    ),
    stages=(
        Stage(name="ar", steps=680, alpha=0.0),
        Stage(name="joint", steps=380, alpha=0.3),
    ),
    modes=("ar", "diffusion", "self_spec", "self_spec_quadratic"),
)

# SDLM (Sequential Diffusion Language Models, §3.2-3.3) converted from the bundled AR target,
# as SDLM converts a pretrained AR model (block size 1 is next-token prediction): same
# architecture, weights and tokenizer, then L_AR + 1.0 x L_SDLM on the parallel layout of
# sdlm.py (a clean causal stream plus L/D - 1 all-masked noise blocks [x[a], <|mask|> x 3],
# shifted prediction). Block size D = 4, SDLM's main setting. Lower peak lr than from scratch
# (a fine-tune). Data: 6 of every 8 windows are the target's own greedy continuations (the
# shared 1536-row DistillSpec), so the blocks learn what the model emits (140 steps on raw
# windows kept about one token per nsp step at tau 0.9; these 800 keep 1.27-1.32). Sizing: a
# step of 8 sequences (128 clean + 124 noise tokens each) takes about 0.6 s on the reference
# machine's two quiet cores (2 threads): 8 min for the 800 steps.
SDLM = Recipe(
    name="sdlm",
    description="SDLM: next-sequence prediction (shifted all-masked blocks of 4) from the target",
    model=TARGET.model,
    stages=(Stage(name="sdlm", steps=800, alpha=1.0),),
    modes=("ar", "nsp"),
    seq_len=128,
    batch_size=8,
    block_size=4,
    peak_lr=1e-3,
    warmup_steps=20,
    budget_minutes=25,
    objective="sdlm",
    init_from="tandem-target",
    distill=DistillSpec(target="tandem-target", rows=1536),
)

# I-DLM (§3.1): converts the bundled AR target into an introspective diffusion model, as the
# paper converts a pretrained AR model: same weights and tokenizer, then one stage of
# all-masked causal training with logit shift and the auto-balanced loss (idlm.py). Block 4:
# the masks learn to predict 2..5 tokens past the clean tail, serving ISD strides N <= 5 (the
# paper serves N = 2..8 from an 8B model). Data: as the drafter's, 12 of every 16 windows are
# the target's own greedy continuations (the 1536-row DistillSpec that the dflash and LoRA
# recipes share, 129 tokens) and 4 raw train windows, so the masks learn to propose what the
# model itself emits (100 steps on raw windows of 256 proposed the next-but-one token of held-out greedy text so
# rarely that ISD reached 1.10 tokens per forward at N = 4; with these rows 600 steps reached
# 1.78 on code and 2.06 on prose, 1200 reach 1.90 and 2.14). Fine-tuning lr (a third of the
# target's peak). Sizing: a step runs 16 x 2 x 128 tokens with an explicit mask, about 1.1 s
# on the reference machine's two quiet cores (2 threads): 28 min for the 1200 steps, under a
# minute for the rows. Two trainings at once on two cores slow each other several-fold.
IDLM = Recipe(
    name="idlm",
    description="I-DLM: the AR target converted by introspective-consistency training (ISD)",
    model=TARGET.model,
    stages=(Stage(name="idlm", steps=1200, alpha=1.0),),
    modes=("ar", "isd"),
    seq_len=128,
    batch_size=16,
    block_size=4,
    peak_lr=1e-3,
    warmup_steps=20,
    decay_fraction=0.3,
    budget_minutes=35,
    objective="idlm",
    init_from="tandem-target",
    distill=DistillSpec(target="tandem-target", rows=1536),
)

# Separate drafter for `spec` (SimSD / SDAR-style): a much smaller Qwen3 decoder with the
# target's tokenizer, trained from scratch with the target's tri-mode objective (AR, then AR +
# 0.3 x block diffusion) so it drafts autoregressively (the engine's spec mode and drafter
# service) and as a block-diffusion drafter. Data: 14 of every 16 rows are the target's own
# greedy continuations of train-split prompts (distill.py; 8192 rows of 129 tokens, prompts
# of 16-64 tokens), 2 raw train windows, so drafts align with what the target emits.
# 4 layers of width 128 (MLP 384) with a tied 4096 x 128 embedding: 1.31M parameters (2.6 MB
# bf16), about 3.2x fewer multiply-adds per token than the target. Rows of 128 tokens, 16 per
# step: the target's tokens per step. Held-out AR agreement with the target's greedy text and
# spec tokens per target forward at gamma 4 (bench prompts, code / prose): 360 AR steps on
# 1536 rows (3 layers, MLP 256, 25% raw): 82.8%, 3.0 / 3.2; 1200 on 4096: 86.6%, 3.50 / 3.39;
# 2400 on 8192: 88.2%, 3.32 / 3.58; 4 layers, MLP 384, 12.5% raw, 2400 steps: 89.4%, 3.33 /
# 3.64; the same with these 4000 steps: 89.2%, 3.52 / 3.60 (10 prompts per category move by
# about 0.2 between runs; the agreement, over 4096 positions, is the steadier measure). Sizing:
# on the reference machine's two quiet cores (2 threads) the rows take about 3.5 min, an AR
# step about 0.22 s and a joint step about 0.5 s: 18 min in all.
DRAFTER = Recipe(
    name="drafter",
    description="separate drafter for tandem-target: AR + block diffusion, distilled from the "
                "target's greedy continuations",
    model=ModelConfig(
        vocab_size=4096,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rope_theta=10000.0,
    ),
    stages=(
        Stage(name="ar", steps=4000, alpha=0.0),
        Stage(name="joint", steps=180, alpha=0.3),
    ),
    modes=("ar", "diffusion", "self_spec", "self_spec_quadratic"),
    seq_len=128,
    batch_size=16,
    budget_minutes=30,
    distill=DistillSpec(target="tandem-target", rows=8192, raw_fraction=0.125),
)

# DFlash drafter (block diffusion drafting conditioned on the target's hidden states,
# dflash.py): 2 Qwen3 layers of the target's width 256 (it reuses the target's frozen
# embeddings and tied LM head), fc over the target's layers 1, 2 and 4 (low, middle and last
# residual rows), block 8 (1 anchor + 7 drafts at a = 1). 1.38M trained parameters (2.8 MB
# bf16). Data: the target's 1536 distilled rows (the DistillSpec the idlm, sdlm and LoRA
# recipes share, so the cached .npz is too) plus 25% raw train windows; 16 blocks with their
# own (p, a) per row in one forward.
# Sizing: on one thread of the reference machine shared with other jobs a step of 16 rows
# (frozen target forward + drafter forward/backward over 2,048 block tokens) took 1.0-4.8 s
# (20.7 min for the 800 steps of the bundled run; a 480-step run reached 2.04 instead of 2.54
# simulated tokens per step), so 800 steps fit the 45 min budget unless the machine is busy.
DFLASH = Recipe(
    name="dflash",
    description="DFlash drafter for tandem-target: block drafts conditioned on the target's "
                "hidden states",
    model=ModelConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        rope_theta=10000.0,
    ),
    stages=(Stage(name="dflash", steps=800, alpha=1.0),),
    modes=("spec",),
    seq_len=128,
    batch_size=16,
    budget_minutes=45,
    objective="dflash",
    distill=DistillSpec(target="tandem-target", rows=1536),
    dflash=DFlashSpec(target="tandem-target"),
)

# Gated LoRA adapters for the drafting pathways (lora.py): the base model is frozen and the
# adapter is active only on draft positions, so verification stays the base model's and both
# modes stay lossless. Labels are the verifier's own greedy tokens (computed in the same
# forward); 6 of every 8 windows are the target's greedy continuations (the shared
# 1536-row DistillSpec), so contexts look like what the model emits. A step runs 8 windows of
# 2 x 128 tokens: about 0.45 s on the reference machine's two quiet cores (2 threads).
# R-ISD (I-DLM §3.2, Appendix G) on tandem-idlm: the mask stream of the I-DLM layout is gated;
# ISD's default stride 4 uses the first 3 mask slots. Rank 8 on every projection (alpha 16):
# 157k parameters, 0.6 MB fp32; 160 steps. On tandem-idlm, whose own masks are trained on the
# same rows, the adapter no longer adds to ISD's TPF (its card shows both).
RISD = Recipe(
    name="risd",
    description="R-ISD gated LoRA on tandem-idlm's mask positions (lossless isd proposals)",
    model=TARGET.model,
    stages=(Stage(name="risd", steps=160, alpha=1.0),),
    modes=("isd",),
    seq_len=128,
    batch_size=8,
    block_size=4,
    peak_lr=2e-3,
    warmup_steps=10,
    weight_decay=0.0,
    budget_minutes=25,
    objective="risd",
    init_from="tandem-idlm",
    distill=DistillSpec(target="tandem-target", rows=1536),
    lora=LoraSpec(folder="risd-lora", draft_slots=3),
)

# NLD §3.3 LoRA-enhanced linear self-speculation on tandem-target: every noisy block of the
# dual-stream layout fully masked (the draft state), gated; "accepted + 1" cross-entropy. The
# engine runs it on the masks of `self_spec` and `self_spec_quadratic`. Rank 16 on every
# projection (alpha 32): 311k parameters, 1.25 MB fp32. On the held-out bench prompts (code /
# prose), 160 steps at rank 8 reached a self_spec acceptance length of 2.29 (both) and 800
# steps at rank 16 2.79 / 3.55 (self_spec_quadratic: 1.93 / 2.54 tokens per forward); these
# 2400 steps reach 3.23 / 3.87 (2.24 / 2.99). 18 min on two quiet cores.
SELF_SPEC_LORA = Recipe(
    name="self_spec_lora",
    description="NLD §3.3 gated LoRA on tandem-target's diffusion draft pathway (self_spec, "
                "self_spec_quadratic)",
    model=TARGET.model,
    stages=(Stage(name="self_spec_lora", steps=2400, alpha=1.0),),
    modes=("self_spec", "self_spec_quadratic"),
    seq_len=128,
    batch_size=8,
    block_size=8,
    peak_lr=2e-3,
    warmup_steps=10,
    weight_decay=0.0,
    budget_minutes=40,
    objective="self_spec_lora",
    init_from="tandem-target",
    distill=DistillSpec(target="tandem-target", rows=1536),
    lora=LoraSpec(folder="draft-lora", rank=16, alpha=32.0, draft_slots=8),
)

# The diffusion mode's trained sampler (NLD §3.2, App. A) on the frozen tri-mode target: a
# 2-layer, d = 64 bidirectional transformer (about 70k parameters plus a 4096 x 16 token
# feature table) trained on the target's own denoising trajectories. One step is a batch of
# 256 block states; the trajectories (768 blocks x 2 block lengths x 2 policies) dominate the
# run's few minutes.
SAMPLER = Recipe(
    name="sampler",
    description="Trained sampler for the diffusion mode of tandem-target (NLD §3.2).",
    model=TARGET.model,
    stages=(Stage(name="sampler", steps=1500, alpha=1.0),),
    modes=("diffusion",),
    batch_size=256,
    peak_lr=2e-3,
    warmup_steps=50,
    weight_decay=0.01,
    betas=(0.9, 0.99),
    objective="sampler",
    init_from="tandem-target",
    sampler=SamplerSpec(),
    budget_minutes=30,
)

# pcLLM progressive consistency distillation (pcllm.py) on tandem-target, as a LoRA adapter on
# every row that the engine merges into the weights (--merge-lora): Jacobi trajectories (block
# n = 8) of the target's greedy continuations, the linear progressive noise schedule, the
# consistency cross-entropy plus 10 x KL(target || adapted) on the clean stream. Trial runs on
# the held-out bench prompts (code / prose, jacobi TPF at the engine's default n = 16; the
# target: 1.37 / 1.34), all 1200 steps unless said: n = 16 with KL weight 3, 1.40 / 1.71 with
# clearly more repetitive greedy text (distinct bigrams 36% -> 28%); n = 16, weight 10,
# 1.39 / 1.40 (35%), and 1.39 / 1.42 (29%) at 2400 steps; n = 8, weight 10 (this recipe),
# 1.55 / 1.65 (31%), held-out NLL 0.5% above the target's. About 10 min on two quiet cores
# after the trajectories (about 5 min, cached in --work).
PCLLM = Recipe(
    name="pcllm",
    description="pcLLM consistency-distilled LoRA on every row of tandem-target (jacobi)",
    model=TARGET.model,
    stages=(Stage(name="pcllm", steps=1200, alpha=1.0),),
    modes=("jacobi",),
    seq_len=128,
    batch_size=8,
    block_size=8,
    peak_lr=1e-3,
    warmup_steps=20,
    weight_decay=0.0,
    budget_minutes=40,
    objective="pcllm",
    init_from="tandem-target",
    distill=DistillSpec(target="tandem-target", rows=1536),
    lora=LoraSpec(folder="pcllm-lora", rank=16, alpha=32.0, ar_weight=10.0),
)

RECIPES = {r.name: r for r in (TARGET, SDLM, DRAFTER, IDLM, DFLASH, RISD, SELF_SPEC_LORA,
                               SAMPLER, PCLLM)}
