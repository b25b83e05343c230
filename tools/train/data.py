"""Token streams and training batches.

Each split is one int32 stream: the files in sorted order, each followed by <|endoftext|>.
Training windows are drawn uniformly from the stream (they may span a file boundary, the
separator tells the model), keyed by (seed, stage, step) so that any step's batch can be
rebuilt without replaying the ones before it, which makes resumed runs identical to
uninterrupted ones.
"""

from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer

import corpus as corpus_lib


def token_stream(tok: Tokenizer, files: list[corpus_lib.SourceFile], eos_id: int) -> np.ndarray:
    encodings = tok.encode_batch([f.text for f in files], add_special_tokens=False)
    parts = []
    for enc in encodings:
        parts.append(np.asarray(enc.ids, dtype=np.int32))
        parts.append(np.asarray([eos_id], dtype=np.int32))
    return np.concatenate(parts)


def step_rng(seed: int, stage: int, step: int) -> np.random.Generator:
    return np.random.default_rng([seed, stage, step])


def sample_windows(
    rng: np.random.Generator, stream: np.ndarray, batch: int, length: int
) -> torch.Tensor:
    """int64 [batch, length] windows at uniform random offsets."""
    starts = rng.integers(0, len(stream) - length + 1, size=batch)
    rows = np.stack([stream[s : s + length] for s in starts])
    return torch.from_numpy(rows.astype(np.int64))


def heldout_windows(stream: np.ndarray, length: int) -> torch.Tensor:
    """int64 [n, length] consecutive windows overlapping by one token, so that every token
    after the first is predicted exactly once by a window's AR targets."""
    n = (len(stream) - 1) // (length - 1)
    rows = [stream[i * (length - 1) : i * (length - 1) + length] for i in range(n)]
    return torch.from_numpy(np.stack(rows).astype(np.int64))
