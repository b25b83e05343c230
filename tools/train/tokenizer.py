#!/usr/bin/env python3
"""Byte-level BPE tokenizer for the bundled models, trained on the corpus' train split.

Layout follows the Qwen2 family so that the engine's tokenizer (which implements that
family) loads it unchanged:
  normalizer     NFC
  pre-tokenizer  Split(Qwen2 pattern, Isolated) then ByteLevel(add_prefix_space=False,
                 use_regex=False)
  model          BPE over the 256 byte symbols, no unk / byte fallback
  decoder        ByteLevel
Special tokens come after the learned vocabulary (ids vocab_size-4 .. vocab_size-1, as in
Qwen, whose specials also follow the BPE ranks): <|endoftext|>, <|im_start|>, <|im_end|>,
<|mask|>. The BPE trainer is deterministic for a fixed input order, which the sorted corpus
file list gives.

Run directly to train and save: `python tools/train/tokenizer.py --out DIR`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus as corpus_lib  # noqa: E402

# Contractions, letter runs with one optional leading non-letter, single digits, punctuation
# runs with trailing newlines, newline runs, and whitespace not followed by a non-space.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)
DEFAULT_VOCAB_SIZE = 4096


def empty_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def train(texts: list[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Trains on `texts` in order; the result has exactly `vocab_size` ids, specials last."""
    # tokenizers parallelises with rayon; results do not depend on the thread count.
    tok = empty_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    learned = tok.get_vocab_size(with_added_tokens=False)
    if learned != vocab_size - len(SPECIAL_TOKENS):
        raise RuntimeError(
            f"BPE learned {learned} ids, wanted {vocab_size - len(SPECIAL_TOKENS)}: "
            "the corpus is too small for this vocabulary size"
        )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, wanted {vocab_size}")
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {}
    for name in SPECIAL_TOKENS:
        i = tok.token_to_id(name)
        if i is None:
            raise KeyError(f"tokenizer lacks the special token {name}")
        ids[name] = i
    return ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    args = parser.parse_args()
    corpus = corpus_lib.load()
    tok = train([f.text for f in corpus.train], args.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out / "tokenizer.json"))
    held = "".join(f.text for f in corpus.heldout)
    n = len(tok.encode(held).ids)
    print(f"vocab {tok.get_vocab_size()}  specials {special_ids(tok)}")
    print(f"held-out: {len(held.encode('utf-8')):,d} bytes -> {n:,d} tokens "
          f"({len(held.encode('utf-8')) / n:.2f} bytes/token)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    sys.exit(main())
