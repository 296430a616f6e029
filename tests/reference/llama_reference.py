#!/usr/bin/env python3
"""An independent Llama in PyTorch, written from Hugging Face's modeling_llama conventions (not
from tshard's code), to check examples/train_llama step by step: the same weights (a safetensors
file read here with json + numpy), the same bytes of text, AdamW and clipping from torch.

    python3 llama_reference.py --init w.safetensors --text README.md --steps 5 --layers 2 \
        --dmodel 32 --heads 4 --kv-heads 2 --hidden 128 --seq 16 --batch 5 [--lr 3e-3 --clip 1]

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


def rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(p, ids, a):
    B, T = ids.shape
    H, KV, D = a.heads, a.kv_heads, a.dmodel
    Dh = D // H
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, Dh, 2, dtype=torch.float64) / Dh))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(a.dtype), emb.sin().to(a.dtype)
    mask = torch.full((T, T), float("-inf"), dtype=a.dtype).triu(1)
    x = p["model.embed_tokens.weight"][ids]
    for l in range(a.layers):
        at = "model.layers.%d." % l
        h = rms_norm(x, p[at + "input_layernorm.weight"])
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
        h = rms_norm(x, p[at + "post_attention_layernorm.weight"])
        g = h @ p[at + "mlp.gate_proj.weight"].T
        u = h @ p[at + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ p[at + "mlp.down_proj.weight"].T
    logits = rms_norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
    return logits


def main():
    ap = argparse.ArgumentParser()
    for flag, kind, default in [("--init", str, None), ("--text", str, None), ("--steps", int, 5), ("--layers", int, 2),
                                ("--dmodel", int, 32), ("--heads", int, 4), ("--kv-heads", int, 0), ("--hidden", int, 0),
                                ("--seq", int, 16), ("--batch", int, 8), ("--lr", float, 3e-3), ("--clip", float, 1.0),
                                ("--weight-decay", float, 0.1)]:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--float", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    a.dtype = torch.float32 if a.float else torch.float64
    a.kv_heads = a.kv_heads or a.heads
    a.hidden = a.hidden or 4 * a.dmodel
    p = load_safetensors(a.init, np.float32 if a.float else np.float64)
    for t in p.values():
        t.requires_grad_(True)
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
