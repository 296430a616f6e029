#!/usr/bin/env python3
"""Writes a small Hugging Face Llama directory as transformers' save_pretrained lays it out: config.json
(the keys transformers 4 or 5 writes), model.safetensors with random weights in F32, BF16 or F16
laid out byte for byte as the safetensors library writes them (numpy only, no torch), and, where asked, tokenizer.json and generation_config.json. For the tests
of train_llama --hf (tests/scripts/train_llama_hf.sh).

    python3 make_llama_dir.py DIR --hidden 32 --heads 4 --kv-heads 2 --head-dim 12 --intermediate 40 \
        --layers 2 --vocab 560 [--tie] [--eps 1e-6] [--theta 500000] [--rope llama3] [--form 4|5] \
        [--dtype bfloat16|float16|float32] [--tokenizer tokenizer.json] [--eos 557] [--set key=json ...]
"""
import argparse
import json
import os
import shutil

import numpy as np


def save_safetensors(path, tensors, dtype):
    kinds = {"float32": ("F32", np.float32), "float16": ("F16", np.float16), "bfloat16": ("BF16", None)}
    code, np_type = kinds[dtype]
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in sorted(tensors.items()):  # (one dtype: by name, as the safetensors library orders them)
        if code == "BF16":  # round to nearest even, as torch converts
            u = t.astype(np.float32).view(np.uint32).astype(np.uint64)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        else:
            raw = t.astype(np_type).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    for flag, kind, default in [("--hidden", int, 32), ("--heads", int, 4), ("--kv-heads", int, 2), ("--head-dim", int, 0),
                                ("--intermediate", int, 40), ("--layers", int, 2), ("--vocab", int, 560), ("--eps", float, 1e-5),
                                ("--theta", float, 10000.0), ("--rope", str, "default"), ("--form", int, 5),
                                ("--dtype", str, "float32"), ("--tokenizer", str, None), ("--eos", int, None), ("--seed", int, 1)]:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--tie", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="key=json: a config.json value to add or replace")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    dh = a.head_dim or a.hidden // a.heads
    rope = {"rope_type": a.rope}
    if a.rope == "llama3":
        rope.update(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)
    config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": None, "eos_token_id": a.eos,
              "head_dim": dh, "hidden_act": "silu", "hidden_size": a.hidden, "intermediate_size": a.intermediate,
              "max_position_embeddings": 128, "mlp_bias": False, "model_type": "llama", "num_attention_heads": a.heads,
              "num_hidden_layers": a.layers, "num_key_value_heads": a.kv_heads, "rms_norm_eps": a.eps,
              "tie_word_embeddings": a.tie, "vocab_size": a.vocab}
    if a.form == 5:  # transformers 5: theta inside rope_parameters, "dtype"
        config.update(rope_parameters=dict(rope, rope_theta=a.theta), dtype=a.dtype)
    else:  # transformers 4: rope_theta, rope_scaling, "torch_dtype"
        config.update(rope_theta=a.theta, rope_scaling=None if a.rope == "default" else rope, torch_dtype=a.dtype)
    for kv in a.set:
        key, value = kv.split("=", 1)
        config[key] = json.loads(value)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    rng = np.random.default_rng(a.seed)
    w = lambda *shape: (rng.standard_normal(shape) * 0.2).astype(np.float32)
    D, F, V = a.hidden, a.intermediate, a.vocab
    tensors = {"model.embed_tokens.weight": w(V, D)}
    for l in range(a.layers):
        at = "model.layers.%d." % l
        tensors.update({at + "input_layernorm.weight": 1 + w(D), at + "self_attn.q_proj.weight": w(a.heads * dh, D),
                        at + "self_attn.k_proj.weight": w(a.kv_heads * dh, D), at + "self_attn.v_proj.weight": w(a.kv_heads * dh, D),
                        at + "self_attn.o_proj.weight": w(D, a.heads * dh), at + "post_attention_layernorm.weight": 1 + w(D),
                        at + "mlp.gate_proj.weight": w(F, D), at + "mlp.up_proj.weight": w(F, D), at + "mlp.down_proj.weight": w(D, F)})
    tensors["model.norm.weight"] = 1 + w(D)
    if not a.tie:
        tensors["lm_head.weight"] = w(V, D)
    save_safetensors(os.path.join(a.dir, "model.safetensors"), tensors, a.dtype)
    if a.tokenizer:
        shutil.copyfile(a.tokenizer, os.path.join(a.dir, "tokenizer.json"))
    if a.eos is not None:
        with open(os.path.join(a.dir, "generation_config.json"), "w") as f:
            json.dump({"eos_token_id": a.eos}, f)


if __name__ == "__main__":
    main()
