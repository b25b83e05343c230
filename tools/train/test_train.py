#!/usr/bin/env python3
"""Tests of the training tooling (tiny shapes; about a minute on one core).

    .venv/bin/python tools/train/test_train.py
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import corpus as corpus_lib  # noqa: E402
import data  # noqa: E402
import diffusion  # noqa: E402
import evaluate  # noqa: E402
import export  # noqa: E402
import tokenizer as tokenizer_lib  # noqa: E402
from model import ModelConfig, Qwen3LM  # noqa: E402
from recipes import TARGET, Stage  # noqa: E402

TINY = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=128)


def tiny_model(seed: int = 0, config: ModelConfig = TINY) -> Qwen3LM:
    model = Qwen3LM(config)
    model.init_weights(torch.Generator().manual_seed(seed))
    # Norm gains away from 1 so a misplaced norm weight would show in the logits.
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model.eval()


def tiny_texts() -> list[str]:
    files = corpus_lib.list_files()
    root = corpus_lib.stdlib_root()
    picks = [f for f in files if f in ("bisect.py", "colorsys.py", "heapq.py", "keyword.py")]
    return [(root / f).read_text(encoding="utf-8") for f in picks]


class CorpusTest(unittest.TestCase):
    def test_exclusions(self):
        ex = corpus_lib.is_excluded
        for path in ("test/test_os.py", "lib2to3/tests/data/x.py", "unittest/test/test_case.py",
                     "site-packages/pip/__init__.py", "idlelib/run.py", "encodings/cp1252.py",
                     "pydoc_data/topics.py", "_sysconfigdata__linux_x86_64-linux-gnu.py",
                     "config-3.11-x86_64-linux-gnu/python-config.py"):
            self.assertTrue(ex(Path(path)), path)
        for path in ("os.py", "asyncio/tasks.py", "unittest/case.py", "lib2to3/pytree.py"):
            self.assertFalse(ex(Path(path)), path)

    def test_split_follows_the_path_hash(self):
        files = corpus_lib.list_files()
        self.assertEqual(files, sorted(files))
        held = [f for f in files if corpus_lib.is_heldout(f)]
        # About HELDOUT_PER_MILLE / 1000 of the files, never none, never most.
        self.assertGreater(len(held), 0)
        self.assertLess(len(held), len(files) // 10)
        # The rule looks at the path only: a renamed copy of a held-out file may land in train.
        flips = sum(corpus_lib.is_heldout(f) != corpus_lib.is_heldout("x/" + f) for f in files)
        self.assertGreater(flips, 0)


class TokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tok = tokenizer_lib.train(tiny_texts(), vocab_size=400)

    def test_specials_are_last(self):
        ids = tokenizer_lib.special_ids(self.tok)
        self.assertEqual(sorted(ids.values()), [396, 397, 398, 399])
        self.assertEqual(self.tok.get_vocab_size(), 400)

    def test_round_trip(self):
        text = "def f(x):\n    return x ** 2  # café\n\n\tyield 'ünï'\r\n"
        enc = self.tok.encode(text, add_special_tokens=False)
        self.assertEqual(self.tok.decode(enc.ids, skip_special_tokens=False), text)

    def test_mask_token_is_one_id_inside_text(self):
        ids = self.tok.encode("a<|mask|>b", add_special_tokens=False).ids
        self.assertIn(self.tok.token_to_id("<|mask|>"), ids)

    def test_qwen2_layout(self):
        cfg = json.loads(self.tok.to_str())
        self.assertEqual(cfg["normalizer"]["type"], "NFC")
        pre = cfg["pre_tokenizer"]["pretokenizers"]
        self.assertEqual([p["type"] for p in pre], ["Split", "ByteLevel"])
        self.assertEqual(pre[0]["behavior"], "Isolated")
        self.assertFalse(pre[1]["use_regex"])
        self.assertFalse(pre[1]["add_prefix_space"])
        self.assertEqual(cfg["decoder"]["type"], "ByteLevel")


class DiffusionLayoutTest(unittest.TestCase):
    L, S = 32, 8

    def setUp(self):
        self.model = tiny_model()
        self.x = torch.randint(0, 290, (2, self.L + 1), generator=torch.Generator().manual_seed(3))
        self.noise = diffusion.sample_block_masks(np.random.default_rng(0), 2, self.L, self.S)
        self.inp, self.ar_t, self.diff_t = diffusion.build_dual_stream_batch(self.x, self.noise, 299)
        self.mask = diffusion.dual_stream_mask(self.L, self.S)
        self.pos = diffusion.dual_stream_positions(self.L)

    @torch.no_grad()
    def run_model(self, inp):
        return self.model(inp, self.pos, self.mask)

    def test_block_masks(self):
        rng = np.random.default_rng(1)
        noise = diffusion.sample_block_masks(rng, 64, 64, 8).reshape(64, 8, 8)
        k = noise.sum(-1)
        self.assertTrue(((k >= 1) & (k <= 8)).all())
        self.assertEqual(set(np.unique(k)), set(range(1, 9)))
        again = diffusion.sample_block_masks(np.random.default_rng(1), 64, 64, 8).reshape(64, 8, 8)
        self.assertTrue((noise == again).all())

    def test_targets(self):
        x = self.x[:, :-1]
        self.assertTrue(torch.equal(self.ar_t, self.x[:, 1:]))
        noise = torch.from_numpy(self.noise)
        self.assertTrue(torch.equal(self.inp[:, self.L:][noise], torch.full_like(x[noise], 299)))
        self.assertTrue(torch.equal(self.inp[:, self.L:][~noise], x[~noise]))
        self.assertTrue(torch.equal(self.diff_t[noise], x[noise]))
        self.assertTrue((self.diff_t[~noise] == -100).all())

    def test_clean_stream_equals_causal_forward(self):
        out = self.run_model(self.inp)
        with torch.no_grad():
            ref = self.model(self.x[:, :-1])
        torch.testing.assert_close(out[:, : self.L], ref, atol=1e-5, rtol=1e-5)

    def block_change(self, inp2) -> torch.Tensor:
        """max |logit change| of each noisy block [batch, blocks] and of the clean stream."""
        a, b = self.run_model(self.inp), self.run_model(inp2)
        noisy = (a[:, self.L:] - b[:, self.L:]).abs().amax(-1).view(2, -1, self.S).amax(-1)
        return noisy, (a[:, : self.L] - b[:, : self.L]).abs().max()

    def test_noisy_block_sees_only_clean_prefix_before_it(self):
        inp2 = self.inp.clone()
        inp2[:, 20] = (inp2[:, 20] + 1) % 290  # clean token in block 2
        noisy, _ = self.block_change(inp2)
        self.assertTrue((noisy[:, :3] == 0).all())
        self.assertTrue((noisy[:, 3:] > 0).all())

    def test_noisy_token_is_private_to_its_block(self):
        inp2 = self.inp.clone()
        inp2[:, self.L + 9] = 5  # noisy token in block 1
        noisy, clean = self.block_change(inp2)
        self.assertEqual(float(clean), 0.0)
        self.assertTrue((noisy[:, [0, 2, 3]] == 0).all())
        self.assertTrue((noisy[:, 1] > 0).all())

    def test_inference_mask_matches_training_rows(self):
        # A fully masked block after a prefix of n = 16 tokens, in the training layout and in
        # the inference layout (prefix + block, evaluate.prefix_block_mask), same logits.
        x = self.x[:1, :-1]
        noise = np.zeros((1, self.L), dtype=bool)
        noise[0, 16:24] = True
        inp, _, _ = diffusion.build_dual_stream_batch(self.x[:1], noise, 299)
        train_logits = self.run_model(inp)[0, self.L + 16 : self.L + 24]
        infer_in = torch.cat([x[:, :16], torch.full((1, 8), 299)], dim=1)
        with torch.no_grad():
            infer_logits = self.model(infer_in, mask=evaluate.prefix_block_mask(16, 8))[0, 16:]
        torch.testing.assert_close(train_logits, infer_logits, atol=1e-5, rtol=1e-5)


class ExportTest(unittest.TestCase):
    def test_transformers_loads_export_with_same_logits(self):
        from transformers import Qwen3ForCausalLM

        tok = tokenizer_lib.train(tiny_texts(), vocab_size=TINY.vocab_size)
        recipe = dataclasses.replace(TARGET, model=TINY)
        model = tiny_model(seed=5)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            export.write(folder, model, recipe, tok)
            cfg = json.loads((folder / "config.json").read_text())
            self.assertEqual(cfg["architectures"], ["Qwen3ForCausalLM"])
            self.assertEqual(cfg["mask_token_id"], tok.token_to_id("<|mask|>"))
            self.assertEqual(cfg["eos_token_id"], tok.token_to_id("<|endoftext|>"))
            self.assertEqual(cfg["block_size"], 8)
            ours, _, _ = export.load(folder)
            hf = Qwen3ForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                  attn_implementation="eager").eval()
            ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(9))
            with torch.no_grad():
                ref = hf(ids).logits
                got = ours(ids)
                # Positions offset by 7 and an explicit causal mask: RoPE is relative, so the
                # same logits.
                shifted = ours(ids, torch.arange(7, 47), torch.ones(40, 40).tril().bool())
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(shifted, ref, atol=1e-4, rtol=1e-4)
            # bf16 export: the loaded weights are the rounded training weights.
            emb = model.model.embed_tokens.weight.detach()
            torch.testing.assert_close(ours.model.embed_tokens.weight, emb.bfloat16().float())


class ScheduleAndDataTest(unittest.TestCase):
    def test_wsd_schedule(self):
        r = dataclasses.replace(TARGET, stages=(Stage("a", 60, 0.0), Stage("b", 40, 0.3)),
                                warmup_steps=10, decay_fraction=0.2)
        self.assertAlmostEqual(r.lr_at(0), r.peak_lr / 10)
        self.assertAlmostEqual(r.lr_at(9), r.peak_lr)
        self.assertAlmostEqual(r.lr_at(79), r.peak_lr)
        self.assertAlmostEqual(r.lr_at(99), r.peak_lr * r.final_lr_ratio)
        self.assertTrue(all(r.lr_at(s) >= r.lr_at(s + 1) for s in range(10, 99)))

    def test_heldout_windows_predict_each_token_once(self):
        stream = np.arange(1000, dtype=np.int32)
        w = data.heldout_windows(stream, 10)
        targets = w[:, 1:].flatten().tolist()
        self.assertEqual(targets, list(range(1, 1 + len(targets))))
        self.assertGreaterEqual(len(targets), 1000 - 10)

    def test_batches_are_keyed_by_step(self):
        stream = np.arange(5000, dtype=np.int32)
        a = data.sample_windows(data.step_rng(1, 0, 5), stream, 4, 16)
        b = data.sample_windows(data.step_rng(1, 0, 5), stream, 4, 16)
        c = data.sample_windows(data.step_rng(1, 0, 6), stream, 4, 16)
        self.assertTrue(torch.equal(a, b))
        self.assertFalse(torch.equal(a, c))


class ReferenceDecodeTest(unittest.TestCase):
    def test_linear_self_spec_is_lossless(self):
        model = tiny_model(seed=11)
        prompt = torch.randint(0, 290, (20,), generator=torch.Generator().manual_seed(2)).tolist()
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(evaluate.NEW_TOKENS):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        ss = evaluate.linear_self_spec(model, prompt, 299, 4)
        self.assertEqual(ss["continuation_ids"], seq[len(prompt):])
        self.assertTrue(all(0 <= a <= 4 for a in ss["accepted_per_cycle"]))


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
