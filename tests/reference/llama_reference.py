#!/usr/bin/env python3
"""An independent Llama in PyTorch, written from Hugging Face's modeling_llama conventions (not
from tshard's code), to check examples/train_llama step by step: the same weights (a safetensors
file read here with json + numpy), the same bytes of text, AdamW and clipping from torch.

    python3 llama_reference.py --init w.safetensors --text README.md --steps 5 --layers 2 \
        --dmodel 32 --heads 4 --kv-heads 2 --hidden 128 --seq 16 --batch 5 [--lr 3e-3 --clip 1]
    python3 llama_reference.py --hf DIR --data ids.npy --steps 3 --seq 12 --batch 4

--hf DIR takes the sizes, rms_norm_eps, rotary (rope_theta / rope_parameters, "llama3" scaling),
head_dim and tie_word_embeddings from DIR/config.json (transformers' keys) and the weights from
DIR/model.safetensors; --data reads int32 windows [N, seq + 1], batch s being rows
[(s mod N/batch) * batch, + batch). --eod ID packs documents: each ends at token ID, and a query
attends only within its own (positions run on, as Megatron's --reset-attention-mask).

Prints "step <n> loss <%.17g>" per step (double precision, or --float), and with --time the
tokens/s of the steps after the first (--threads N sets torch's threads).
"""
import argparse
import json
import math
import struct
import time

import numpy as np
import torch

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def load_safetensors(path, dtype=np.float64):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[8 + n + b:8 + n + end]
        if e["dtype"] == "BF16":
            words = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = words.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[e["dtype"]])
        out[name] = torch.from_numpy(arr.astype(dtype).reshape(e["shape"]).copy())
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(p, ids, a):
    B, T = ids.shape
    H, KV, D, eps = a.heads, a.kv_heads, a.dmodel, a.eps
    Dh = a.head_dim or D // H
    inv_freq = 1.0 / (a.theta ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    if a.llama3:  # transformers' _compute_llama3_parameters
        factor, low, high, old = a.llama3["factor"], a.llama3["low_freq_factor"], a.llama3["high_freq_factor"], \
            a.llama3["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv_freq = torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(a.dtype), emb.sin().to(a.dtype)
    mask = torch.full((T, T), float("-inf"), dtype=a.dtype).triu(1)
    if a.eod >= 0:  # packed documents: a new one after each eod token; a query sees only its own
        doc = torch.cumsum(torch.nn.functional.pad((ids == a.eod).long(), (1, 0))[:, :-1], dim=1)  # [B, T]
        same = doc[:, :, None] == doc[:, None, :]
        mask = torch.where(same, mask, torch.tensor(float("-inf"), dtype=a.dtype))[:, None]  # [B, 1, T, T]
    x = p["model.embed_tokens.weight"][ids]
    for l in range(a.layers):
        at = "model.layers.%d." % l
        h = rms_norm(x, p[at + "input_layernorm.weight"], eps)
        q = (h @ p[at + "self_attn.q_proj.weight"].T).view(B, T, H, Dh).transpose(1, 2)
        k = (h @ p[at + "self_attn.k_proj.weight"].T).view(B, T, KV, Dh).transpose(1, 2)
        v = (h @ p[at + "self_attn.v_proj.weight"].T).view(B, T, KV, Dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # HF's repeat_kv: head i reads key-value head i // G
        v = v.repeat_interleave(H // KV, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(Dh) + mask
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * Dh)
        x = x + o @ p[at + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[at + "post_attention_layernorm.weight"], eps)
        g = h @ p[at + "mlp.gate_proj.weight"].T
        u = h @ p[at + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ p[at + "mlp.down_proj.weight"].T
    head = p["model.embed_tokens.weight"] if a.tie else p["lm_head.weight"]
    logits = rms_norm(x, p["model.norm.weight"], eps) @ head.T
    return logits


def main():
    ap = argparse.ArgumentParser()
    for flag, kind, default in [("--init", str, None), ("--text", str, None), ("--hf", str, None), ("--data", str, None), ("--steps", int, 5), ("--layers", int, 2),
                                ("--dmodel", int, 32), ("--heads", int, 4), ("--kv-heads", int, 0), ("--hidden", int, 0),
                                ("--seq", int, 16), ("--batch", int, 8), ("--lr", float, 3e-3), ("--clip", float, 1.0),
                                ("--weight-decay", float, 0.1)]:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--eod", type=int, default=-1)
    ap.add_argument("--float", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    a.dtype = torch.float32 if a.float else torch.float64
    a.eps, a.theta, a.llama3, a.head_dim, a.tie = 1e-5, 10000.0, None, 0, False
    if a.hf:
        with open(a.hf + "/config.json") as f:
            c = json.load(f)
        a.dmodel, a.heads, a.hidden, a.layers = c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], c["num_hidden_layers"]
        a.kv_heads, a.head_dim, a.eps = c.get("num_key_value_heads"), c.get("head_dim") or 0, c.get("rms_norm_eps", 1e-6)
        a.tie = c.get("tie_word_embeddings", False)
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        a.theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        if rope.get("rope_type", rope.get("type")) == "llama3":
            a.llama3 = rope
        a.init = a.hf + "/model.safetensors"
    a.kv_heads = a.kv_heads or a.heads
    a.hidden = a.hidden or 4 * a.dmodel
    p = load_safetensors(a.init, np.float32 if a.float else np.float64)
    for t in p.values():
        t.requires_grad_(True)
    if a.data:
        data = np.load(a.data).astype(np.int64)
    else:
        text = open(a.text, "rb").read()
        train = len(text) - len(text) // 10
        length = a.seq + 1
        windows = train // length
    decay = [t for t in p.values() if t.dim() >= 2]
    rest = [t for t in p.values() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    start = None
    for step in range(a.steps):
        if step == 1:
            start = time.perf_counter()
        if a.data:
            first = (step % (len(data) // a.batch)) * a.batch
            batch = torch.from_numpy(data[first:first + a.batch].copy())
        else:
            rows = [text[((step * a.batch + b) % windows) * length:][:length] for b in range(a.batch)]
            batch = torch.tensor([list(r) for r in rows], dtype=torch.long)
        logits = forward(p, batch[:, :-1], a)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), a.clip)
        opt.step()
        print("step %d loss %.17g" % (step, loss.item()), flush=True)
    if a.time and a.steps > 1:
        seconds = time.perf_counter() - start
        print("pytorch %s, %d threads: %.0f tokens/s" % ("float" if a.float else "double", torch.get_num_threads(),
                                                        (a.steps - 1) * a.batch * a.seq / seconds))


if __name__ == "__main__":
    main()
