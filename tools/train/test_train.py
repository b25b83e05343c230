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
import dflash  # noqa: E402
import diffusion  # noqa: E402
import distill  # noqa: E402
import evaluate  # noqa: E402
import export  # noqa: E402
import idlm  # noqa: E402
import lora  # noqa: E402
import pcllm  # noqa: E402
import sdlm  # noqa: E402
import tokenizer as tokenizer_lib  # noqa: E402
from model import ModelConfig, Qwen3LM  # noqa: E402
from recipes import DFLASH, RECIPES, TARGET, DFlashSpec, Stage  # noqa: E402

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

    def test_only_a_separate_drafter_is_exported_as_one(self):
        # Conversions trained on the target's greedy rows (idlm, sdlm) stay models of their
        # own: no drafter role in config.json (the engine and the model card read it).
        tok = tokenizer_lib.train(tiny_texts(), vocab_size=TINY.vocab_size)
        for name, drafter in (("drafter", True), ("idlm", False), ("sdlm", False)):
            recipe = dataclasses.replace(RECIPES[name], model=TINY)
            self.assertEqual(recipe.is_drafter, drafter, name)
            with tempfile.TemporaryDirectory() as tmp:
                export.write(Path(tmp), tiny_model(seed=5), recipe, tok)
                cfg = json.loads((Path(tmp) / "config.json").read_text())
                self.assertEqual(cfg["tandem"].get("role") == "drafter", drafter, name)


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


class DistillTest(unittest.TestCase):
    def test_cached_greedy_equals_full_forward_argmax(self):
        model = tiny_model(seed=5)
        prompts = torch.randint(0, 290, (3, 12), generator=torch.Generator().manual_seed(4))
        got = distill.greedy_continue(model, prompts, 10)
        seq = prompts.clone()
        with torch.no_grad():
            for _ in range(10):
                seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
        self.assertTrue(torch.equal(got, seq[:, 12:]))

    def test_rows_are_prompt_then_target_greedy_and_reproducible(self):
        model = tiny_model(seed=6)
        stream = np.random.default_rng(0).integers(0, 290, 3000).astype(np.int32)
        spec = distill.DistillSpec(target="x", rows=5, prompt_lens=(8, 16), gen_batch=2)
        rows, plens = distill.build_rows(model, stream, spec, 25, log=lambda *a, **k: None)
        again, _ = distill.build_rows(model, stream, spec, 25, log=lambda *a, **k: None)
        self.assertTrue(np.array_equal(rows, again))
        self.assertEqual(rows.shape, (5, 25))
        for row, p in zip(rows, plens):
            self.assertIn(int(p), (8, 16))
            # The prompt is a window of the stream; the rest is the model's greedy continuation.
            starts = [i for i in range(len(stream) - p) if np.array_equal(stream[i:i + p], row[:p])]
            self.assertTrue(starts)
            cont = distill.greedy_continue(model, torch.from_numpy(row[None, :p].astype(np.int64)),
                                           25 - int(p))
            self.assertEqual(cont[0].tolist(), row[p:].tolist())

    def test_sampler_mixes_distilled_rows_and_raw_windows(self):
        rows = np.full((6, 17), 7, dtype=np.int32)
        stream = np.arange(1000, dtype=np.int32)
        sampler = distill.BatchSampler(rows, stream, raw_fraction=0.25)
        batch = sampler(data.step_rng(1, 0, 3), 8, 17)
        self.assertEqual(batch.shape, (8, 17))
        self.assertTrue(bool((batch[:6] == 7).all()))
        self.assertTrue(bool((batch[6:, 1:] - batch[6:, :-1] == 1).all()))  # stream windows
        self.assertTrue(torch.equal(batch, sampler(data.step_rng(1, 0, 3), 8, 17)))
        with self.assertRaises(ValueError):
            sampler(data.step_rng(1, 0, 3), 8, 16)

    def test_alignment_of_a_model_with_itself_is_total_for_ar(self):
        model = tiny_model(seed=7)
        stream = np.random.default_rng(1).integers(0, 290, 2000).astype(np.int32)
        a = distill.alignment(model, model, stream, 4, 299, prompts=3, prompt_len=8, new_tokens=8)
        self.assertEqual(a["ar"]["agreement"], 1.0)
        self.assertEqual(a["ar"]["mean_accepted_of_k"], 4.0)
        self.assertEqual(len(a["block_diffusion"]["per_slot_agreement"]), 4)
        self.assertLessEqual(a["block_diffusion"]["agreement"], 1.0)


class SdlmLayoutTest(unittest.TestCase):
    """sdlm.py: the parallel layout computes, for every block, exactly the standalone inference
    forward of that block (prefix causal, then [x[a], <|mask|> x (D-1)] bidirectional)."""

    L, D, MASK = 24, 4, 299

    def test_mask_positions_and_targets(self):
        tokens = torch.arange(self.L + 1)[None].repeat(2, 1)
        inputs, positions, mask, ar_t, blk_t = sdlm.build_batch(
            tokens, np.array([0, 3]), self.D, self.MASK)
        K = self.L // self.D - 1
        self.assertEqual(inputs.shape, (2, self.L + K * self.D))
        for b, r in enumerate((0, 3)):
            for k, a in enumerate(sdlm.anchors(r, self.L, self.D)):
                rows = self.L + k * self.D + torch.arange(self.D)
                self.assertEqual(inputs[b, rows].tolist(), [a] + [self.MASK] * (self.D - 1))
                self.assertEqual(positions[b, rows].tolist(), list(range(a, a + self.D)))
                self.assertEqual(blk_t[b, k * self.D:(k + 1) * self.D].tolist(),
                                 list(range(a + 1, a + 1 + self.D)))
                for i in rows.tolist():
                    seen = mask[b, i].nonzero().flatten().tolist()
                    self.assertEqual(seen, list(range(a)) + rows.tolist())
            self.assertFalse(mask[b, :self.L, self.L:].any())  # clean never reads noise
            self.assertTrue(torch.equal(mask[b, :self.L, :self.L],
                                        torch.ones(self.L, self.L).tril().bool()))
        self.assertTrue(torch.equal(ar_t, tokens[:, 1:]))

    def test_parallel_layout_equals_standalone_block_forwards(self):
        model = tiny_model(5)
        g = torch.Generator().manual_seed(9)
        tokens = torch.randint(0, 290, (2, self.L + 1), generator=g)
        offsets = np.array([1, 2])
        inputs, positions, mask, _, _ = sdlm.build_batch(tokens, offsets, self.D, self.MASK)
        with torch.no_grad():
            logits = model(inputs, positions, mask)
            causal = model(tokens[:, :self.L])
            self.assertLess(float((logits[:, :self.L] - causal).abs().max()), 1e-4)
            for b in range(2):
                for k, a in enumerate(sdlm.anchors(int(offsets[b]), self.L, self.D)):
                    seq = tokens[b, :a + 1].tolist() + [self.MASK] * (self.D - 1)
                    m = torch.ones(len(seq), len(seq)).tril().bool()
                    m[a:, a:] = True
                    want = model(torch.tensor([seq]), mask=m)[0, a:]
                    got = logits[b, self.L + k * self.D:self.L + (k + 1) * self.D]
                    self.assertLess(float((want - got).abs().max()), 1e-4, (b, k))

    def test_block_size_one_is_next_token_prediction(self):
        model = tiny_model(6)
        tokens = torch.randint(0, 290, (1, self.L + 1), generator=torch.Generator().manual_seed(3))
        inputs, positions, mask, ar_t, blk_t = sdlm.build_batch(tokens, np.array([0]), 1, self.MASK)
        with torch.no_grad():
            logits = model(inputs, positions, mask)
        K = self.L - 1
        # Block k holds x[k] alone and predicts x[k+1]: the AR row k, targets included.
        self.assertLess(float((logits[0, self.L:] - logits[0, :K]).abs().max()), 1e-4)
        self.assertTrue(torch.equal(blk_t[0], ar_t[0, :K]))

    def test_reference_decodes(self):
        model = tiny_model(7)
        prompt = list(range(10, 30))
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(10):
                seq.append(int(model(torch.tensor([seq]))[0, -1].argmax()))
        cases = [{"prompt_ids": prompt, "continuation_ids": seq[len(prompt):]}]
        ref = sdlm.references(model, cases, self.MASK, self.D, 10)
        self.assertTrue(ref["verified"]["all_match_ar_greedy"])
        full = sdlm.longest_prefix_decode(model, prompt, 10, self.MASK, self.D, 0.0)
        self.assertEqual(full["forwards"], 3)  # tau 0 keeps whole blocks: 4 + 4 + 2
        one = sdlm.longest_prefix_decode(model, prompt, 10, self.MASK, self.D, 1.0)
        self.assertEqual(one["forwards"], 10)


class IdlmLayoutTest(unittest.TestCase):
    L, S = 16, 4

    def test_mask_is_strictly_causal_and_blockwise(self):
        L, S = self.L, self.S
        m = idlm.idlm_mask(L, S)
        for i in range(L):
            for j in range(L):
                self.assertEqual(bool(m[L + i, L + j]), j <= i)  # clean: causal
                self.assertFalse(bool(m[L + i, j]))  # clean never sees masks
                self.assertEqual(bool(m[i, j]), j // S == i // S and j <= i)
                self.assertEqual(bool(m[i, L + j]), j < (i // S) * S)

    def test_no_row_sees_what_it_predicts(self):
        """Changing x[j] leaves a clean row i < j and a mask row whose block starts at or
        before j unchanged: neither reads the token it (or a later row) is trained on."""
        L, S = self.L, self.S
        model = tiny_model(3)
        tokens = torch.randint(0, TINY.vocab_size - 1, (1, L + 1),
                               generator=torch.Generator().manual_seed(0))
        layout = (idlm.idlm_mask(L, S), idlm.idlm_positions(L))
        mask_id = TINY.vocab_size - 1
        with torch.no_grad():
            base = model(idlm.build_batch(tokens, mask_id)[0], layout[1], layout[0])
            for j in (5, 9):
                changed = tokens.clone()
                changed[0, j] = (changed[0, j] + 1) % (TINY.vocab_size - 1)
                out = model(idlm.build_batch(changed, mask_id)[0], layout[1], layout[0])
                same = (out - base).abs().amax(-1)[0] < 1e-5
                for i in range(L):
                    self.assertEqual(bool(same[L + i]), i < j, f"clean row {i}, x[{j}] changed")
                    self.assertEqual(bool(same[i]), (i // S) * S <= j, f"mask row {i}, x[{j}]")

    def test_auto_balanced_loss(self):
        model = tiny_model(4)
        tokens = torch.randint(0, TINY.vocab_size - 1, (2, self.L + 1),
                               generator=torch.Generator().manual_seed(1))
        layout = (idlm.idlm_mask(self.L, self.S), idlm.idlm_positions(self.L))
        loss, clean, masked, s = idlm.losses(model, tokens, TINY.vocab_size - 1, layout)
        self.assertAlmostEqual(s.item(), masked.item() / clean.item(), places=5)
        self.assertAlmostEqual(loss.item(), 2 * masked.item(), places=5)
        # s is a constant: the gradient is grad(L_mask) + s * grad(L_clean).
        loss.backward()
        got = model.lm_head.weight.grad.clone()
        model.zero_grad()
        _, clean2, masked2, _ = idlm.losses(model, tokens, TINY.vocab_size - 1, layout)
        (masked2 + s.item() * clean2).backward()
        torch.testing.assert_close(got, model.lm_head.weight.grad)
        # The clean rows are a plain causal AR forward.
        with torch.no_grad():
            ar = torch.nn.functional.cross_entropy(
                model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        self.assertAlmostEqual(clean.item(), ar.item(), places=5)

    def test_appendix_b_tpf(self):
        for n in (2, 3, 5):
            self.assertAlmostEqual(idlm.appendix_b_tpf([1.0] * (n - 1), n), n)
            self.assertAlmostEqual(idlm.appendix_b_tpf([0.0] * (n - 1), n), 1.0)
        self.assertAlmostEqual(idlm.appendix_b_tpf([0.5, 0.5], 3), 2.5 / 1.75)


class GatedLoraTest(unittest.TestCase):
    """Gated LoRA adapters (lora.py) on the I-DLM and dual-stream layouts."""

    L = 16

    def adapted(self, seed: int = 5) -> tuple:
        model = tiny_model(seed)
        gate = lora.attach(model, rank=4, alpha=8.0, targets=lora.ATTN + lora.MLP, seed=seed)
        with torch.no_grad():  # a non-zero B, so the adapter changes the gated rows
            g = torch.Generator().manual_seed(seed)
            for m in lora.adapters(model).values():
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.2)
        return model, gate

    def tokens(self, seed: int = 0, batch: int = 2) -> torch.Tensor:
        return torch.randint(0, TINY.vocab_size - 1, (batch, self.L + 1),
                             generator=torch.Generator().manual_seed(seed))

    def test_verify_rows_are_bit_identical_to_the_base_model(self):
        mask_id = TINY.vocab_size - 1
        for objective, S in (("risd", 4), ("self_spec_lora", 8)):
            model, gate = self.adapted()
            base = tiny_model(5)
            tokens = self.tokens()
            inputs, positions, attention, g, draft, verify = lora.layout(
                objective, self.L, S, mask_id, tokens)
            with torch.no_grad():
                gate.mask = g
                got = model(inputs, positions, attention)
                gate.mask = None
                want = base(inputs, positions, attention)
            self.assertTrue(torch.equal(got[:, verify], want[:, verify]), objective)
            self.assertGreater(float((got[:, draft] - want[:, draft]).abs().amax()), 1e-3,
                               objective)
            # Off everywhere: the base model exactly.
            with torch.no_grad():
                self.assertTrue(torch.equal(model(inputs, positions, attention), want))

    def test_save_writes_the_peft_layout_and_loads_back(self):
        from safetensors.torch import load_file
        model, gate = self.adapted()
        with tempfile.TemporaryDirectory() as tmp:
            lora.save(Path(tmp), model, 4, 8.0, lora.ATTN + lora.MLP, "tiny")
            config = json.loads((Path(tmp) / "adapter_config.json").read_text())
            self.assertEqual((config["peft_type"], config["r"], config["lora_alpha"],
                              config["bias"]), ("LORA", 4, 8.0, "none"))
            tensors = load_file(str(Path(tmp) / "adapter_model.safetensors"))
            self.assertEqual(len(tensors), 2 * 7 * TINY.num_hidden_layers)
            a = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"]
            b = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
            self.assertEqual(tuple(a.shape), (4, TINY.hidden_size))
            self.assertEqual(tuple(b.shape), (TINY.num_key_value_heads * TINY.head_dim, 4))
            self.assertEqual(a.dtype, torch.float32)
            reloaded = tiny_model(5)
            gate2 = lora.load(Path(tmp), reloaded)
        tokens = self.tokens(1)
        inputs, positions, attention, g, _, _ = lora.layout("risd", self.L, 4,
                                                            TINY.vocab_size - 1, tokens)
        with torch.no_grad():
            gate.mask, gate2.mask = g, g
            self.assertTrue(torch.equal(model(inputs, positions, attention),
                                        reloaded(inputs, positions, attention)))

    def test_accepted_plus_one(self):
        q = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]), 10).float()
        labels = torch.tensor([[1, 2, 0, 4, -100, 6, 0, 8]])
        got = lora.accepted_plus_one(q, labels, 4)
        # Block 0: slots 0, 1 hit, slot 2 is the first miss. Block 1: slot 0 unlabelled.
        self.assertEqual(got.tolist(), [[True, True, True, False, False, False, False, False]])

    def test_training_moves_only_the_adapter(self):
        mask_id = TINY.vocab_size - 1
        for objective, S in (("risd", 4), ("self_spec_lora", 8)):
            model, gate = self.adapted(6)
            frozen = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
            opt = torch.optim.AdamW(lora.trainable(model), lr=1e-2)
            value, active = lora.loss(objective, model, gate, self.tokens(2), S, mask_id)
            self.assertGreater(active, 0)
            value.backward()
            opt.step()
            for k, v in model.state_dict().items():
                if "lora_" not in k:
                    self.assertTrue(torch.equal(v, frozen[k]), k)
            moved = [m.lora_B.grad.abs().sum() > 0 for m in lora.adapters(model).values()]
            self.assertTrue(all(moved), objective)


class AdapterLoopTest(unittest.TestCase):
    """lora.optimise, the training loop the adapter recipes (lora.py, pcllm.py) share."""

    def run_loop(self, steps: int, minutes: float | None):
        recipe = dataclasses.replace(RECIPES["pcllm"], stages=(Stage("pcllm", steps, 1.0),),
                                     warmup_steps=2)
        args = type("Args", (), {"minutes": minutes})()
        run = type("Run", (), {"t_start": __import__("time").time()})()
        weight = torch.nn.Parameter(torch.tensor([3.0]))
        seen = []

        def step_loss(step):
            seen.append(step)
            value = (weight ** 2).sum()
            return value, {"square": value.item(), "index": float(step)}

        out = lora.optimise(args, recipe, run, [weight], step_loss, {"square": 4, "index": 1})
        return out, seen, weight

    def test_steps_schedule_and_windowed_history(self):
        (history, done, truncated), seen, weight = self.run_loop(23, None)
        self.assertEqual((done, truncated), (23, False))
        self.assertEqual(seen, list(range(23)))
        self.assertLess(abs(weight.item()), 3.0)  # the loss went down
        self.assertEqual([h["step"] for h in history], [10, 20, 23])
        # Each record averages its own window of steps: 0..9, 10..19, 20..22.
        self.assertEqual([h["index"] for h in history], [4.5, 14.5, 21.0])
        self.assertEqual(list(history[0]),
                         ["step", "lr", "square", "index", "s_per_step", "elapsed_s"])
        recipe = dataclasses.replace(RECIPES["pcllm"], stages=(Stage("pcllm", 23, 1.0),),
                                     warmup_steps=2)
        self.assertEqual([h["lr"] for h in history], [recipe.lr_at(s) for s in (9, 19, 22)])

    def test_minutes_stops_early_and_says_so(self):
        (history, done, truncated), seen, _ = self.run_loop(50, minutes=-1.0)
        self.assertEqual((done, truncated, seen, history), (0, True, [], []))


class PcllmTest(unittest.TestCase):
    """pcLLM consistency distillation (pcllm.py) on a tiny random model."""

    n = 4

    def rows(self, model, count: int = 3, row_len: int = 17) -> tuple:
        stream = np.random.default_rng(1).integers(0, 290, 2000).astype(np.int32)
        spec = distill.DistillSpec(target="x", rows=count, prompt_lens=(4, 8), gen_batch=count)
        return distill.build_rows(model, stream, spec, row_len, log=lambda *a, **k: None)

    def test_packed_mask_is_the_noise_aware_causal_mask(self):
        L, n = 8, 4
        m = pcllm.packed_mask(L, n)
        for i in range(2 * L):
            for j in range(2 * L):
                if i < L:  # clean: causal over the clean stream only
                    want = j < L and j <= i
                else:  # noisy row of block [c, c + n): the clean prefix, its block causally
                    q, c = i - L, (i - L) // n * n
                    want = j < c if j < L else (c <= j - L <= q)
                self.assertEqual(bool(m[i, j]), want, (i, j))
        with self.assertRaises(ValueError):
            pcllm.packed_mask(10, 4)

    def test_trajectories_start_at_the_guess_and_end_at_the_fixed_point(self):
        model = tiny_model(seed=8)
        rows, plens = self.rows(model)
        traj = pcllm.trajectories(model, rows, plens, self.n, log=lambda *a, **k: None)
        L = rows.shape[1] - 1
        self.assertEqual(traj.shape, (3, L // self.n, self.n + 1, self.n))
        for r in range(3):
            for b in range(L // self.n):
                c = b * self.n
                block = rows[r, c:c + self.n].tolist()
                if c < plens[r]:  # prompt blocks hold the clean tokens
                    self.assertEqual(traj[r, b, 0].tolist(), block)
                    continue
                self.assertEqual(traj[r, b, 0].tolist(),
                                 pcllm.initial_guess(rows[r, :c], self.n).tolist())
                # Greedy Jacobi converges within n iterations to the greedy continuation, and
                # state k has at least its first k tokens right.
                self.assertEqual(traj[r, b, -1].tolist(), block)
                for k in range(self.n + 1):
                    self.assertEqual(traj[r, b, k, :k].tolist(), block[:k])

    def test_progressive_states_and_labels(self):
        model = tiny_model(seed=8)
        rows, plens = self.rows(model)
        traj = pcllm.trajectories(model, rows, plens, self.n, log=lambda *a, **k: None)
        noisy, labelled = pcllm.pick_states(np.random.default_rng(0), traj, rows, plens, self.n)
        L = rows.shape[1] - 1
        for r in range(3):
            self.assertEqual(labelled[r].tolist(), [i >= plens[r] for i in range(L)])
            self.assertEqual(noisy[r, :plens[r]].tolist(), rows[r, :plens[r]].tolist())
        # The first continuation block is the least noisy, the last the noisiest.
        wrong = (noisy.numpy() != rows[:, :L]).reshape(3, L // self.n, self.n).mean(-1)
        for r in range(3):
            first = int(plens[r]) // self.n
            self.assertLessEqual(wrong[r, first], wrong[r, -1])

    def test_loss_trains_only_the_adapter_and_starts_at_the_target(self):
        model = tiny_model(seed=9)
        rows, plens = self.rows(model)
        traj = pcllm.trajectories(model, rows, plens, self.n, log=lambda *a, **k: None)
        noisy, labelled = pcllm.pick_states(np.random.default_rng(1), traj, rows, plens, self.n)
        tokens = torch.from_numpy(rows.astype(np.int64))
        L = rows.shape[1] - 1
        with torch.no_grad():
            base = model(tokens[:, :L])
        gate = lora.attach(model, rank=4, alpha=8.0, targets=lora.ATTN + lora.MLP, seed=1)
        frozen = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
        value, parts = pcllm.loss(model, gate, base, tokens, noisy, labelled, self.n)
        self.assertAlmostEqual(parts["kl"], 0.0, places=5)  # B = 0: the adapter is the identity
        self.assertGreater(parts["pc"], 0.0)
        opt = torch.optim.AdamW(lora.trainable(model), lr=1e-2)
        value.backward()
        opt.step()
        for k, v in model.state_dict().items():
            if "lora_" not in k:
                self.assertTrue(torch.equal(v, frozen[k]), k)
        self.assertIsNone(gate.mask)
        with torch.no_grad():  # now the adapter is on every row, and changes the model
            moved = pcllm.forward(model, gate, tokens[:, :L])
        self.assertGreater(float((moved - base).abs().amax()), 1e-4)

    def test_jacobi_decode_equals_greedy(self):
        model = tiny_model(seed=10)
        gate = lora.attach(model, rank=4, alpha=8.0, targets=lora.ATTN + lora.MLP, seed=2)
        with torch.no_grad():
            for m in lora.adapters(model).values():
                m.lora_B.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(3))
        prompt = [5, 9, 5, 11, 7]
        for g in (None, gate):
            run = pcllm.jacobi_decode(model, g, prompt, 12, self.n)
            self.assertEqual(run["tokens"], pcllm.greedy(model, g, prompt, 12))
            self.assertLessEqual(run["forwards"], 12)
        self.assertNotEqual(pcllm.greedy(model, None, prompt, 12),
                            pcllm.greedy(model, gate, prompt, 12))

    def test_initial_guess_copies_after_an_earlier_occurrence(self):
        self.assertEqual(pcllm.initial_guess(np.array([3, 4, 5, 3]), 3).tolist(), [4, 5, 3])
        self.assertEqual(pcllm.initial_guess(np.array([1, 2]), 3).tolist(), [2, 2, 2])
        self.assertEqual(pcllm.distinct_bigrams([1, 2, 1, 2, 1]), 0.5)


class DFlashTest(unittest.TestCase):
    """The DFlash drafter (dflash.py) on tiny shapes: target = tiny_model, k = 2 tapped layers."""

    B, LAYERS, MASK = 4, (1, 2), 299

    def setUp(self):
        self.target = tiny_model(8)
        self.drafter = dflash.DFlashDrafter(TINY, len(self.LAYERS), self.B)
        self.drafter.init_weights(torch.Generator().manual_seed(3))
        with torch.no_grad():
            g = torch.Generator().manual_seed(4)
            for name, p in self.drafter.named_parameters():
                if name.endswith("norm.weight"):
                    p.add_(0.2 * torch.randn(p.shape, generator=g))
        self.drafter.eval()
        self.tokens = torch.randint(0, 290, (2, 24), generator=torch.Generator().manual_seed(5))

    def logits(self, tokens, hidden, starts, anchors):
        with torch.no_grad():
            return dflash.draft_logits(self.drafter, self.target, tokens, hidden,
                                       torch.tensor(starts), torch.tensor(anchors), self.MASK)

    def test_block_layout_and_attention_pattern(self):
        starts, anchors = torch.tensor([[3, 10]]), torch.tensor([[1, 3]])
        ids, pos, mask, drafted = dflash.block_layout(starts, anchors, self.tokens[:1], self.B,
                                                      self.MASK)
        x = self.tokens[0]
        self.assertEqual(ids[0].tolist(), [x[3], self.MASK, self.MASK, self.MASK,
                                           x[10], x[11], x[12], self.MASK])
        self.assertEqual(pos[0].tolist(), [3, 4, 5, 6, 10, 11, 12, 13])
        self.assertEqual(drafted[0].tolist(), [False, True, True, True, False, False, False, True])
        t = self.tokens.shape[1]
        self.assertEqual(mask.shape, (1, 8, t + 8))
        for q in range(8):
            j, p = q // self.B, [3, 10][q // self.B]
            # Context rows strictly before the block's start; every row of its own block
            # (bidirectional), none of the other block.
            self.assertEqual(mask[0, q, :t].tolist(), [c < p for c in range(t)])
            self.assertEqual(mask[0, q, t:].tolist(), [k // self.B == j for k in range(8)])

    def test_batched_blocks_equal_one_block_with_its_own_context(self):
        hidden, _ = dflash.target_states(self.target, self.tokens, self.LAYERS)
        starts, anchors = [[2, 9, 15], [5, 5, 20]], [[1, 2, 4], [1, 3, 1]]
        got = self.logits(self.tokens, hidden, starts, anchors)
        for r in range(2):
            for j, (p, a) in enumerate(zip(starts[r], anchors[r])):
                # Reference: only the context rows 0..p-1, one block, no mask at all.
                ids = self.tokens[r, p:p + self.B].clone()
                ids[a:] = self.MASK
                with torch.no_grad():
                    h = self.drafter(self.target.model.embed_tokens(ids[None]),
                                     torch.arange(p, p + self.B)[None], hidden[r:r + 1, :p],
                                     torch.arange(p)[None], None)
                    ref = self.target.lm_head(h)[0]
                torch.testing.assert_close(got[r, j], ref, atol=1e-5, rtol=1e-5)

    def test_context_changes_drafts_and_future_rows_do_not(self):
        tokens = self.tokens[:1]
        with torch.no_grad():  # larger weights than the init, so context can flip an argmax
            for name, p in self.drafter.named_parameters():
                if p.dim() == 2:
                    p.mul_(8.0)
        hidden, _ = dflash.target_states(self.target, tokens, self.LAYERS)
        base = self.logits(tokens, hidden, [[12]], [[1]])[0, 0]
        later = hidden.clone()
        later[:, 12:] += 5.0  # rows at and after the block start are not context
        torch.testing.assert_close(self.logits(tokens, later, [[12]], [[1]])[0, 0], base)
        earlier = hidden.clone()
        earlier[:, :12] = torch.randn(earlier[:, :12].shape, generator=torch.Generator()
                                      .manual_seed(6))
        changed = self.logits(tokens, earlier, [[12]], [[1]])[0, 0]
        self.assertGreater(float((changed - base).abs().max()), 1e-2)
        self.assertFalse(torch.equal(changed[1:].argmax(-1), base[1:].argmax(-1)))

    def test_target_states_are_the_residual_stream(self):
        hidden, logits = dflash.target_states(self.target, self.tokens, (0, 2))
        h = TINY.hidden_size
        torch.testing.assert_close(hidden[..., :h], self.target.model.embed_tokens(self.tokens))
        with torch.no_grad():
            torch.testing.assert_close(logits, self.target(self.tokens))
            # Layer 2 (the last) is the stream before the final norm.
            torch.testing.assert_close(self.target.lm_head(self.target.model.norm(
                hidden[..., h:])), logits)

    def test_sampler_blocks_draft_the_continuation_and_are_keyed_by_step(self):
        rows = np.random.default_rng(0).integers(0, 290, (5, 33)).astype(np.int32)
        plens = np.array([8, 16, 8, 24, 16], dtype=np.int32)
        stream = np.arange(2000, dtype=np.int32) % 290
        spec = DFlashSpec(target="x", max_anchor=3, blocks_per_row=6)
        sampler = dflash.RowSampler(rows, plens, stream, 0.25, spec, self.B)
        tokens, starts, anchors = sampler(data.step_rng(1, 0, 2), 8)
        again = sampler(data.step_rng(1, 0, 2), 8)
        self.assertTrue(all(torch.equal(x, y) for x, y in zip((tokens, starts, anchors), again)))
        self.assertEqual(tokens.shape, (8, 33))
        self.assertTrue(bool(((anchors >= 1) & (anchors <= 3)).all()))
        self.assertTrue(bool(((starts >= 1) & (starts + self.B <= 33)).all()))
        for r in range(6):  # distilled rows: drafted slots lie in the greedy continuation
            match = [i for i in range(5) if np.array_equal(rows[i], tokens[r].numpy())]
            self.assertEqual(len(match), 1)
            self.assertTrue(bool((starts[r] + anchors[r] >= int(plens[match[0]])).all()))
        w = dflash.slot_weights(self.B, anchors, 2.0)
        self.assertTrue(bool(((w > 0).sum(-1) == self.B - anchors).all()))
        self.assertAlmostEqual(float(w[0, 0, int(anchors[0, 0])]), 1.0)

    def test_loss_trains_only_the_drafter(self):
        spec = DFlashSpec(target="x", target_layer_ids=self.LAYERS, max_anchor=2)
        self.drafter.train()
        loss, ce, kl, acc = dflash.step_loss(self.drafter, self.target, spec, self.tokens,
                                             torch.tensor([[1, 7], [4, 12]]),
                                             torch.tensor([[1, 2], [2, 1]]), self.MASK, self.B)
        self.assertTrue(torch.isfinite(loss))
        self.assertGreaterEqual(float(kl), -1e-6)
        loss.backward()
        self.assertIsNotNone(self.drafter.fc.weight.grad)
        self.assertIsNone(self.target.model.embed_tokens.weight.grad)

    def test_export_round_trip(self):
        tok = tokenizer_lib.train(tiny_texts(), vocab_size=TINY.vocab_size)
        recipe = dataclasses.replace(DFLASH, model=TINY, block_size=self.B,
                                     dflash=DFlashSpec(target="t", target_layer_ids=self.LAYERS))
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            dflash.write(folder, self.drafter, recipe, tok)
            cfg = json.loads((folder / "config.json").read_text())
            self.assertEqual(cfg["architectures"], ["TandemDFlashDrafter"])
            self.assertEqual(cfg["block_size"], self.B)
            self.assertEqual(cfg["dflash"], {"target_layer_ids": [1, 2], "target": "t",
                                             "max_anchor": 4})
            self.assertEqual(cfg["tandem"]["modes"], ["spec"])
            from safetensors.torch import load_file
            names = set(load_file(str(folder / "model.safetensors")))
            self.assertIn("fc.weight", names)
            self.assertIn("layers.1.self_attn.k_norm.weight", names)
            self.assertFalse(any("embed" in n or "lm_head" in n for n in names))
            loaded, _ = dflash.load(folder)
            rounded = dflash.DFlashDrafter(TINY, len(self.LAYERS), self.B)
            rounded.load_state_dict({k: v.bfloat16().float()
                                     for k, v in self.drafter.state_dict().items()})
            hidden, _ = dflash.target_states(self.target, self.tokens, self.LAYERS)
            args = (self.target, self.tokens, hidden, torch.tensor([[3], [8]]),
                    torch.tensor([[1], [2]]), self.MASK)
            with torch.no_grad():
                torch.testing.assert_close(dflash.draft_logits(loaded, *args),
                                           dflash.draft_logits(rounded.eval(), *args))


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
