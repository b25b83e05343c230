"""Writes and reads a bundled model folder in the Hugging Face layout.

Folder contents: config.json (Qwen3ForCausalLM, plus "block_size", "mask_token_id" and a
"tandem" object for diffusion-capable recipes), model.safetensors (bf16, HF tensor names, tied
lm_head omitted), tokenizer.json, generation_config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

import tokenizer as tokenizer_lib
from model import ModelConfig, Qwen3LM
from recipes import Recipe

WEIGHTS_DTYPE = torch.bfloat16


def hf_config(recipe: Recipe, tok: Tokenizer) -> dict:
    c = recipe.model
    specials = tokenizer_lib.special_ids(tok)
    eos = specials[tokenizer_lib.ENDOFTEXT]
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": c.tie_word_embeddings,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * c.num_hidden_layers,
        "initializer_range": c.initializer_range,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "block_size": recipe.block_size,
        "mask_token_id": specials[tokenizer_lib.MASK],
        "tandem": {
            "recipe": recipe.name,
            "description": recipe.description,
            "modes": list(recipe.modes),
            # A separate drafter names its role and the model it drafts for.
            **({"role": "drafter", "drafter_for": f"models/{recipe.distill.target}"}
               if recipe.is_drafter else {}),
        } | ({"nsp": {
            "block_size": recipe.block_size,
            "mask_token_id": specials[tokenizer_lib.MASK],
            # Noise block [x[T-1], <|mask|> x (D-1)] at positions T-1..T+D-2: row p predicts
            # p + 1, like AR logits. See tools/train/sdlm.py.
            "prediction": "shifted",
            "attention": "noise block bidirectional within itself + causal prefix before "
                         "its first (anchor) token",
            "base_model": recipe.init_from,
        }} if recipe.objective == "sdlm" else {"isd": {
            "block_size": recipe.block_size,
            "max_stride": recipe.block_size + 1,
            "mask_token_id": specials[tokenizer_lib.MASK],
            # Logits at p predict p + 1 for clean and <|mask|> tokens alike; the k-th mask
            # after the clean tail proposes the token k + 1 places past it. See idlm.py.
            "prediction": "shifted",
            "attention": "strictly causal: masks see the clean prefix and earlier masks",
            "base_model": recipe.init_from,
        }} if recipe.objective == "idlm" else {"diffusion": {
            "block_size": recipe.block_size,
            "mask_token_id": specials[tokenizer_lib.MASK],
            # Logits of a <|mask|> at position p predict the token at p (AR logits at p
            # predict p + 1). See tools/train/diffusion.py.
            "prediction": "same_position",
            "attention": "masked block bidirectional within itself + causal clean prefix",
        }}),
    }


def write(out: Path, model: Qwen3LM, recipe: Recipe, tok: Tokenizer) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(recipe, tok)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"],
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    sd = {k: v.to("cpu", WEIGHTS_DTYPE).contiguous() for k, v in model.export_state_dict().items()}
    save_file(dict(sorted(sd.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(out / "tokenizer.json"))


def model_config_from_hf(config: dict) -> ModelConfig:
    return ModelConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        max_position_embeddings=config["max_position_embeddings"],
        rope_theta=config["rope_parameters"]["rope_theta"],
        rms_norm_eps=config["rms_norm_eps"],
        tie_word_embeddings=config["tie_word_embeddings"],
    )


def load(folder: Path) -> tuple[Qwen3LM, dict, Tokenizer]:
    """The exported model as our module, fp32 (bf16 weights upcast exactly)."""
    config = json.loads((folder / "config.json").read_text())
    model = Qwen3LM(model_config_from_hf(config))
    sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    if config["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model, config, Tokenizer.from_file(str(folder / "tokenizer.json"))
