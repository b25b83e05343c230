"""Block-wise diffusion training layout (Nemotron-Labs-Diffusion §2.2, after Block Diffusion).

A training sequence x[0..L) (L a multiple of the block size S) is fed twice, at the same RoPE
positions 0..L-1:

    index   0 .. L-1        L .. 2L-1
    stream  clean x         noisy x~ (some tokens of every block replaced by <|mask|>)

Attention (True = query row may read key column):
    clean -> clean   strictly causal (j <= i): the AR loss on the clean stream sees no future
                     token and no noisy token, so it equals a plain causal forward.
    clean -> noisy   never.
    noisy -> noisy   bidirectional inside the query's own block only.
    noisy -> clean   the clean prefix before the query's block (j < S * block(i)).

Prediction convention ("same position"): the logits of a noisy token at position p predict
x[p] (not x[p+1] as AR logits do). At inference a draft of k tokens after a verified prefix of
n tokens is k <|mask|> tokens at positions n .. n+k-1 attending to the prefix KV and to each
other; their logits are the drafts for x[n] .. x[n+k-1].
"""

from __future__ import annotations

import numpy as np
import torch


def dual_stream_mask(seq_len: int, block_size: int) -> torch.Tensor:
    """bool [2L, 2L] attention mask of the [clean | noisy] layout described above."""
    if seq_len % block_size != 0:
        raise ValueError(f"seq_len {seq_len} is not a multiple of block_size {block_size}")
    idx = torch.arange(seq_len)
    block = idx // block_size
    clean_clean = idx[None, :] <= idx[:, None]
    noisy_noisy = block[None, :] == block[:, None]
    noisy_clean = idx[None, :] < (block * block_size)[:, None]
    top = torch.cat([clean_clean, torch.zeros(seq_len, seq_len, dtype=torch.bool)], dim=1)
    bottom = torch.cat([noisy_clean, noisy_noisy], dim=1)
    return torch.cat([top, bottom], dim=0)


def dual_stream_positions(seq_len: int) -> torch.Tensor:
    """int64 [2L]: both streams sit at positions 0..L-1."""
    idx = torch.arange(seq_len)
    return torch.cat([idx, idx])


def sample_block_masks(
    rng: np.random.Generator, batch: int, seq_len: int, block_size: int
) -> np.ndarray:
    """bool [batch, seq_len], True where the token is replaced by <|mask|>.

    Every block of every sequence draws its own masking ratio: the number of masked tokens
    k is uniform on {1, ..., S} (ratio k/S uniform on {1/S, ..., 1}), and the k positions are
    a uniform random subset of the block. k >= 1 keeps every block contributing to the loss;
    k = S is the linear self-speculation drafting state (all draft slots masked), smaller k
    the intermediate states of confidence-based denoising.
    """
    blocks = seq_len // block_size
    k = rng.integers(1, block_size + 1, size=(batch, blocks, 1))
    # Rank of each slot in a random permutation of its block; the k lowest ranks are masked.
    ranks = rng.random((batch, blocks, block_size)).argsort(axis=-1).argsort(axis=-1)
    return (ranks < k).reshape(batch, seq_len)


def build_dual_stream_batch(
    tokens: torch.Tensor,  # int64 [B, L+1]: L inputs plus the AR target of the last one
    noise: np.ndarray,  # bool [B, L] from sample_block_masks
    mask_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (input_ids [B, 2L], ar_targets [B, L], diff_targets [B, L]).

    diff_targets holds x at masked positions and -100 (ignored by cross_entropy) elsewhere, so
    the diffusion loss covers masked positions only.
    """
    x = tokens[:, :-1]
    noise_t = torch.from_numpy(noise)
    noisy = torch.where(noise_t, torch.full_like(x, mask_token_id), x)
    diff_targets = torch.where(noise_t, x, torch.full_like(x, -100))
    return torch.cat([x, noisy], dim=1), tokens[:, 1:], diff_targets
