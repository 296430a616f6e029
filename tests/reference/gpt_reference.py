#!/usr/bin/env python3
"""An independent GPT in PyTorch (GPT-2's pre-layernorm decoder, written with torch.nn, not from
tshard's code), to check examples/train_transformer step by step: the same initial weights (the
.npy files of a checkpoint `train_transformer --steps 0 --save DIR` writes), the same token rows
(an int32 .npy [N, seq + 1] from `train_transformer --write-data FILE`, batch s = rows s*batch..,
cycled), AdamW and gradient clipping from torch.

    python3 gpt_reference.py --init DIR --data tokens.npy --steps 8 --layers 2 --dmodel 32 \
        --heads 4 --seq 16 --batch 4 --vocab 16 [--hidden 0 --lr 3e-3 --clip 1]

The model: token + learned position embeddings; per block x + attn(ln1(x)), then + mlp(ln2(x))
(no dropout); causal attention with bias-free q, k, v projections, head dim ceil(D / H), scores
scaled by 1 / sqrt(head dim), an output projection with a bias; the MLP D -> F -> D with biases
and tanh-GELU; a final layernorm (eps 1e-5 everywhere) and an untied output projection with a
bias; the mean cross-entropy over every (row, position). AdamW with weight decay on every
parameter (train_transformer gives all its layers one setting), betas (0.9, 0.95), eps 1e-8,
weight decay 0.01, and clip_grad_norm_ to --clip; the optimizer's constants are the float32
values train_transformer writes (0.9f, ...), widened to double, and so is --lr.

--eod ID packs documents: each ends at token ID, and a query attends only to the keys of its own
document (Megatron's --reset-attention-mask; positions run on over documents, or restart at each
with --reset-position-ids, Megatron's flag of that name).

Prints "step <n> loss <%.17g>" per step (double precision, or --float), and with --time the
tokens/s of the steps after the first (--threads N sets torch's threads).
"""
import argparse
import math
import os
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def f32(x):  # a float literal of train_transformer's (0.9f, ...) as the double it becomes
    return float(np.float32(x))


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads, self.head_dim = heads, -(-d // heads)
        inner = self.heads * self.head_dim
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.q = nn.Linear(d, inner, bias=False)
        self.k = nn.Linear(d, inner, bias=False)
        self.v = nn.Linear(d, inner, bias=False)
        self.proj = nn.Linear(inner, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def attention(self, x, masked):
        B, T, _ = x.shape
        H, Dh = self.heads, self.head_dim
        q, k, v = (m(x).view(B, T, H, Dh).transpose(1, 2) for m in (self.q, self.k, self.v))  # [B, H, T, Dh]
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(Dh))
        s = s.masked_fill(masked, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, H * Dh)
        return self.proj(o)

    def forward(self, x, masked):
        x = x + self.attention(self.ln1(x), masked)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.eod, self.reset_positions = a.eod, a.reset_position_ids
        self.tokens = nn.Embedding(a.vocab, a.dmodel)
        self.positions = nn.Embedding(a.seq, a.dmodel)
        self.blocks = nn.ModuleList([Block(a.dmodel, a.heads, a.hidden) for _ in range(a.layers)])
        self.norm = nn.LayerNorm(a.dmodel, eps=1e-5)
        self.head = nn.Linear(a.dmodel, a.vocab)

    def forward(self, ids):
        T = ids.shape[1]
        masked = torch.ones(T, T, dtype=torch.bool).triu(1)  # [T, T]: the keys after the query
        positions = torch.arange(T)
        if self.eod >= 0:  # and those of another document: a new one after each eod token
            after_eod = F.pad((ids == self.eod).long(), (1, 0))[:, :-1]  # [B, T]: 1 where a document starts past 0
            doc = torch.cumsum(after_eod, dim=1)
            masked = (masked | (doc[:, :, None] != doc[:, None, :]))[:, None]  # [B, 1, T, T]
            if self.reset_positions:  # t less the start of its document
                t = positions.expand(ids.shape)
                positions = t - torch.where(after_eod.bool(), t, torch.zeros_like(t)).cummax(dim=1).values
        x = self.tokens(ids) + self.positions(positions)
        for b in self.blocks:
            x = b(x, masked)
        return self.head(self.norm(x))

    # The checkpoint's files, named by the model's parameter names, each the global tensor in
    # tshard's index order (Fortran-ordered .npy, so numpy reads [i, j, ..] as written):
    # tokens.weight [V, D], positions.weight [seq, D]; block<l>.ln1.weight, .ln1.bias [D];
    # .attention.wq, .wk, .wv [D, Dh, H]; .attention.wo [Dh, H, D] and its bias .bo [D]; .ln2;
    # .mlp.fc1.weight [D, F], .mlp.fc1.bias [F], .mlp.fc2.weight [F, D], .mlp.fc2.bias [D];
    # norm.weight, norm.bias [D]; head.weight [D, V], head.bias [V]. (Older checkpoints named the
    # k-th parameter of a layer <layer>_<k>, in the same order: those are read too.)
    BLOCK = ["ln1.weight", "ln1.bias", "attention.wq", "attention.wk", "attention.wv", "attention.wo", "attention.bo",
             "ln2.weight", "ln2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]
    TOP = {"tokens.weight": "tokens_0", "positions.weight": "positions_0", "norm.weight": "norm_0", "norm.bias": "norm_1",
           "head.weight": "head_0", "head.bias": "head_1"}

    def load(self, directory, dtype):
        def get(name, older):
            path = os.path.join(directory, name + ".npy")
            if not os.path.exists(path):
                path = os.path.join(directory, older + ".npy")
            return torch.from_numpy(np.load(path).astype(np.float64))

        def heads_out(w):  # [D, Dh, H] -> a Linear's weight [H * Dh, D], feature h * Dh + k
            return w.permute(2, 1, 0).reshape(-1, w.shape[0])

        want = {name: get(name, older) for name, older in self.TOP.items()}
        want["head.weight"] = want["head.weight"].T
        for l in range(len(self.blocks)):
            p = lambda i: get("block%d.%s" % (l, self.BLOCK[i]), "block%d_%d" % (l, i))
            at = "blocks.%d." % l
            wo = p(5)  # [Dh, H, D] -> [D, H * Dh]
            want.update({at + "ln1.weight": p(0), at + "ln1.bias": p(1), at + "q.weight": heads_out(p(2)),
                         at + "k.weight": heads_out(p(3)), at + "v.weight": heads_out(p(4)),
                         at + "proj.weight": wo.permute(2, 1, 0).reshape(wo.shape[2], -1), at + "proj.bias": p(6),
                         at + "ln2.weight": p(7), at + "ln2.bias": p(8), at + "fc1.weight": p(9).T,
                         at + "fc1.bias": p(10), at + "fc2.weight": p(11).T, at + "fc2.bias": p(12)})
        self.load_state_dict({k: v.to(dtype).contiguous() for k, v in want.items()}, strict=True)


def resident(field):
    """VmRSS or VmHWM of this process in bytes (Linux), 0 elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    for flag, kind, default in [("--init", str, None), ("--data", str, None), ("--steps", int, 10), ("--layers", int, 2),
                                ("--dmodel", int, 32), ("--heads", int, 4), ("--hidden", int, 0), ("--seq", int, 16),
                                ("--batch", int, 8), ("--vocab", int, 64), ("--lr", float, 3e-3), ("--clip", float, 1.0),
                                ("--weight-decay", float, 0.01), ("--eod", int, -1)]:
        ap.add_argument(flag, type=kind, default=default)
    ap.add_argument("--double", dest="float", action="store_false")
    ap.add_argument("--float", dest="float", action="store_true")
    ap.add_argument("--reset-position-ids", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if not a.init or not a.data:
        ap.error("--init DIR and --data FILE are required")
    if a.reset_position_ids and a.eod < 0:
        ap.error("--reset-position-ids needs --eod ID")
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.float else torch.float64
    a.hidden = a.hidden or 4 * a.dmodel
    torch.manual_seed(0)  # the constructor's own initialisation is overwritten by load()
    rss_before = resident("VmRSS")
    model = GPT(a).to(dtype)
    model.load(a.init, dtype)
    rows = torch.from_numpy(np.load(a.data).astype(np.int64))
    if rows.dim() != 2 or rows.shape[1] != a.seq + 1 or rows.shape[0] < a.batch:
        raise SystemExit("gpt_reference.py: --data must hold int [N >= batch, seq + 1] tokens")
    batches = rows.shape[0] // a.batch
    opt = torch.optim.AdamW(model.parameters(), lr=f32(a.lr), betas=(f32(0.9), f32(0.95)), eps=f32(1e-8),
                            weight_decay=f32(a.weight_decay))
    start = None
    for step in range(a.steps):
        if step == 1:
            start = time.perf_counter()
        first = (step % batches) * a.batch
        batch = rows[first:first + a.batch]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), a.clip)  # as train_transformer, whatever --clip
        opt.step()
        print("step %d loss %.17g" % (step, loss.item()), flush=True)
    if a.time and a.steps > 1:
        seconds = time.perf_counter() - start
        print("pytorch %s, %d threads: %.0f tokens/s" % ("float" if a.float else "double", torch.get_num_threads(),
                                                        (a.steps - 1) * a.batch * a.seq / seconds))
        # What the model and its training took, measured as train_transformer measures its own.
        print("pytorch resident memory: peak above that before the model %.1f MiB"
              % ((resident("VmHWM") - rss_before) / 1048576))


if __name__ == "__main__":
    main()
