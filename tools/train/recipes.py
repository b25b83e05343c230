"""Training recipes: everything that decides a bundled model, by name.

A recipe fixes the number of optimiser steps (not a time budget), so a rebuild with the same
library versions and thread count takes the same steps on the same batches and reproduces the
weights. Step counts were sized with a throughput probe on the reference machine (see the
model card) to fit the wall-clock budget written next to each recipe.
"""

from __future__ import annotations

import dataclasses

from model import ModelConfig


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    steps: int
    # Weight of the diffusion loss: L = L_AR + alpha * L_diff. 0 trains AR only, on a plain
    # causal forward (no dual stream, half the compute).
    alpha: float


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

RECIPES = {r.name: r for r in (TARGET,)}

# Planned next (see tools/train/README.md): "drafter-bd" (separate small block-diffusion
# drafter), "drafter-dflash" (conditioned on target hidden states), "idlm", "sdlm".
