#!/usr/bin/env python3
"""Converts a Tandem (Hugging Face style) Qwen3 checkpoint to GGUF for llama.cpp.

The input is the directory Tandem loads: config.json (model_type qwen3), one
model.safetensors or the shards named by model.safetensors.index.json (F32, F16
or BF16 tensors, q/k/v stored as separate q_proj/k_proj/v_proj), and
tokenizer.json (byte-level BPE). The output is a GGUF file of architecture
`qwen3` that llama.cpp loads:

  * hyper-parameters: qwen3.context_length, embedding_length, block_count,
    feed_forward_length, attention.head_count, attention.head_count_kv,
    attention.key_length, attention.value_length,
    attention.layer_norm_rms_epsilon, rope.freq_base;
  * tensors under llama.cpp's names (token_embd, blk.N.attn_norm, attn_q,
    attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate,
    ffn_up, ffn_down, output_norm, and output when the embeddings are untied);
    matrices in f32 (default) or f16, norm weights always f32. Q and K are not
    permuted: Tandem, Hugging Face and llama.cpp's qwen3 graph all use the
    "rotate half" (NEOX) RoPE layout on the checkpoint's own row order, as
    llama.cpp's own convert_hf_to_gguf.py does for Qwen models;
  * tokenizer: tokenizer.ggml.model "gpt2" with the tokens, token types and
    merges of tokenizer.json, pre-tokenizer "qwen2" (the split regex of
    Qwen2/Qwen3 tokenizers, checked against tokenizer.json), eos/pad ids from
    config.json and bos from config.json or, when it is null as for Qwen3,
    the eos token (as Qwen GGUFs do); add_bos_token false.

Rope scaling, sliding windows, attention or MLP biases are refused rather than
silently dropped.

Needs the `gguf` and `numpy` packages (llamacpp_peer.py installs them in its
virtualenv). Usage:

  python3 tools/bench/to_gguf.py MODEL_DIR OUT.gguf [--type f32|f16]
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import numpy as np

# The pre-tokenizer split regex of Qwen2 / Qwen3 tokenizer.json files, which
# llama.cpp implements as pre-tokenizer type "qwen2".
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class ConversionError(Exception):
    """The checkpoint cannot be converted faithfully."""


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Tensors of one safetensors file as float32 arrays (BF16 widened exactly)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ConversionError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            tensors[name] = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            tensors[name] = raw.astype(np.float32)
    return tensors


def read_checkpoint(model_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of the checkpoint: model.safetensors or the shards of its index."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        raise ConversionError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        for key, value in read_safetensors(model_dir / name).items():
            if key in tensors:
                raise ConversionError(f"{model_dir}: tensor {key} appears in more than one shard")
            tensors[key] = value
    return tensors


def qwen3_hparams(config: dict) -> dict:
    """The hyper-parameters llama.cpp's qwen3 graph needs, with Tandem's defaults."""
    if config.get("model_type") != "qwen3":
        raise ConversionError(f"model_type is {config.get('model_type')!r}, expected 'qwen3'")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", None, ""):
        raise ConversionError(f"rope type {rope_type!r} is not supported by this converter")
    if config.get("use_sliding_window"):
        raise ConversionError("sliding-window attention is not supported by this converter")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConversionError("attention / MLP biases are not supported by this converter")
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or 128)  # Qwen3Config's default, as Tandem uses
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return {
        "vocab_size": int(config["vocab_size"]),
        "hidden": int(config["hidden_size"]),
        "intermediate": int(config["intermediate_size"]),
        "layers": int(config["num_hidden_layers"]),
        "heads": heads,
        "kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "context": int(config.get("max_position_embeddings") or 32768),
        "rms_eps": float(config.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        "tied": bool(config.get("tie_word_embeddings", False)),
        "bos": config.get("bos_token_id"),
        "eos": eos,
        "pad": config.get("pad_token_id"),
    }


def tokenizer_vocab(tokenizer: dict, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, GGUF token types and merges of a byte-level BPE tokenizer.json.

    Ids missing from the tokenizer below vocab_size (padding rows of the
    embedding) become UNUSED "[PAD<id>]" tokens, as in llama.cpp's converter.
    """
    import gguf

    model = tokenizer.get("model", {})
    if model.get("type") != "BPE":
        raise ConversionError(f"tokenizer.json model type {model.get('type')!r}, expected BPE")
    pre = tokenizer.get("pre_tokenizer") or {}
    splits = [p for p in pre.get("pretokenizers", [pre]) if p.get("type") == "Split"]
    regexes = [p.get("pattern", {}).get("Regex") for p in splits]
    if regexes != [QWEN2_SPLIT_REGEX]:
        raise ConversionError(
            f"tokenizer.json pre-tokenizer regex {regexes} is not Qwen2's; "
            "llama.cpp's 'qwen2' pre-tokenizer would split text differently")
    by_id: dict[int, tuple[str, int]] = {}
    for token, token_id in model["vocab"].items():
        by_id[token_id] = (token, gguf.TokenType.NORMAL)
    for added in tokenizer.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    if max(by_id) >= vocab_size:
        raise ConversionError(f"tokenizer has id {max(by_id)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for token_id in range(vocab_size):
        token, kind = by_id.get(token_id, (f"[PAD{token_id}]", gguf.TokenType.UNUSED))
        tokens.append(token)
        types.append(int(kind))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def convert(model_dir: Path, out_path: Path, weight_type: str = "f32") -> dict:
    """Writes out_path; returns a summary (hyper-parameters, tensor and parameter counts)."""
    import gguf

    if weight_type not in ("f32", "f16"):
        raise ConversionError(f"weight type {weight_type!r}, expected f32 or f16")
    config = json.loads((model_dir / "config.json").read_text())
    hp = qwen3_hparams(config)
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tokens, token_types, merges = tokenizer_vocab(tokenizer, hp["vocab_size"])
    tensors = read_checkpoint(model_dir)

    hidden, inter, d = hp["hidden"], hp["intermediate"], hp["head_dim"]
    q_out, kv_out = hp["heads"] * d, hp["kv_heads"] * d
    # (checkpoint name, GGUF name, expected shape, is a norm weight)
    plan = [("model.embed_tokens.weight", "token_embd.weight", (hp["vocab_size"], hidden), False)]
    for i in range(hp["layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        plan += [
            (p + "input_layernorm.weight", b + "attn_norm.weight", (hidden,), True),
            (p + "self_attn.q_proj.weight", b + "attn_q.weight", (q_out, hidden), False),
            (p + "self_attn.k_proj.weight", b + "attn_k.weight", (kv_out, hidden), False),
            (p + "self_attn.v_proj.weight", b + "attn_v.weight", (kv_out, hidden), False),
            (p + "self_attn.o_proj.weight", b + "attn_output.weight", (hidden, q_out), False),
            (p + "self_attn.q_norm.weight", b + "attn_q_norm.weight", (d,), True),
            (p + "self_attn.k_norm.weight", b + "attn_k_norm.weight", (d,), True),
            (p + "post_attention_layernorm.weight", b + "ffn_norm.weight", (hidden,), True),
            (p + "mlp.gate_proj.weight", b + "ffn_gate.weight", (inter, hidden), False),
            (p + "mlp.up_proj.weight", b + "ffn_up.weight", (inter, hidden), False),
            (p + "mlp.down_proj.weight", b + "ffn_down.weight", (hidden, inter), False),
        ]
    plan.append(("model.norm.weight", "output_norm.weight", (hidden,), True))
    if not hp["tied"]:
        plan.append(("lm_head.weight", "output.weight", (hp["vocab_size"], hidden), False))

    used = {src for src, _, _, _ in plan}
    # A tied checkpoint may still carry a copy of the head; anything else unread is an error.
    extra = sorted(set(tensors) - used - ({"lm_head.weight"} if hp["tied"] else set()))
    if extra:
        raise ConversionError(f"tensors this converter does not map: {extra[:8]}")

    writer = gguf.GGUFWriter(str(out_path), "qwen3")
    writer.add_name(model_dir.resolve().name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if weight_type == "f32"
                         else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(hp["context"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(hp["layers"])
    writer.add_feed_forward_length(inter)
    writer.add_head_count(hp["heads"])
    writer.add_head_count_kv(hp["kv_heads"])
    writer.add_key_length(d)
    writer.add_value_length(d)
    writer.add_layer_norm_rms_eps(hp["rms_eps"])
    writer.add_rope_freq_base(hp["rope_theta"])

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    if hp["eos"] is not None:
        writer.add_eos_token_id(int(hp["eos"]))
    bos = hp["bos"] if hp["bos"] is not None else hp["eos"]
    if bos is not None:
        writer.add_bos_token_id(int(bos))
    if hp["pad"] is not None:
        writer.add_pad_token_id(int(hp["pad"]))
    writer.add_add_bos_token(False)

    params = 0
    for src, dst, shape, is_norm in plan:
        if src not in tensors:
            raise ConversionError(f"{model_dir}: missing tensor {src}")
        array = tensors[src]
        if tuple(array.shape) != shape:
            raise ConversionError(f"{src}: shape {tuple(array.shape)}, expected {shape}")
        params += array.size
        out_dtype = np.float32 if is_norm or weight_type == "f32" else np.float16
        writer.add_tensor(dst, np.ascontiguousarray(array, dtype=out_dtype))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"hparams": hp, "tensors": len(plan), "parameters": params, "weight_type": weight_type}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="checkpoint directory (config.json, "
                        "*.safetensors, tokenizer.json)")
    parser.add_argument("out", type=Path, help="GGUF file to write")
    parser.add_argument("--type", choices=("f32", "f16"), default="f32",
                        help="matrix weight type (norm weights stay f32)")
    args = parser.parse_args(argv)
    try:
        summary = convert(args.model_dir, args.out, args.type)
    except ConversionError as error:
        print(f"to_gguf: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: {summary['tensors']} tensors, {summary['parameters']} parameters, "
          f"{summary['weight_type']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
