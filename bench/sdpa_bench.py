#!/usr/bin/env python3
# PyTorch's CPU attention on the shapes bench/attention_bench.cpp times, for the column beside
# tshard's: torch.nn.functional.scaled_dot_product_attention (its flash kernel on CPU, causal,
# forward and backward) and the same attention written out (matmul, causal mask, softmax,
# matmul), in float on one thread, medians of interleaved runs after one warm-up. GFLOP/s are
# counted as attention_bench counts them (the causal half of 4 B H T^2 Dh, times 3.5). With
# --against FILE (attention_bench's output) each row also gives tshard's fused time over SDPA's.
# Needs PyTorch >= 2 (Debian's 1.13 has no scaled_dot_product_attention), and >= 2.5 for
# --kv-heads below --heads (enable_gqa): exits 77 without them.
#   python3 bench/sdpa_bench.py [--batch 2] [--heads 4] [--kv-heads 4] [--dh 16]
#                               [--seq 1024,2048,4096] [--written-max 4096] [--reps 3] [--against FILE]
import argparse
import math
import re
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("skipped: PyTorch is not importable")
    sys.exit(77)
if not hasattr(F, "scaled_dot_product_attention"):
    print(f"skipped: PyTorch {torch.__version__} has no scaled_dot_product_attention")
    sys.exit(77)

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--kv-heads", type=int, default=0)
parser.add_argument("--dh", type=int, default=16)
parser.add_argument("--seq", default="1024,2048,4096")
parser.add_argument("--written-max", type=int, default=4096)
parser.add_argument("--reps", type=int, default=3)
parser.add_argument("--against", default=None)
args = parser.parse_args()
kv_heads = args.kv_heads or args.heads
if args.heads % kv_heads:
    sys.exit("sdpa_bench.py: --kv-heads must divide --heads")
if kv_heads != args.heads:  # grouped-query attention reads K/V in place only with enable_gqa (2.5)
    try:
        x = torch.zeros(1, 2, 1, 1)
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
    except TypeError:
        print(f"skipped: PyTorch {torch.__version__}'s scaled_dot_product_attention has no enable_gqa")
        sys.exit(77)
torch.set_num_threads(1)
torch.manual_seed(1)

# tshard's fused times by sequence length, from attention_bench's "T  N: fused X ms" lines.
tshard_ms = {}
if args.against:
    for line in open(args.against):
        m = re.match(r"T\s+(\d+): fused\s+([\d.]+) ms", line)
        if m:
            tshard_ms[int(m.group(1))] = float(m.group(2))


def step(fn, q, k, v):
    q.grad = k.grad = v.grad = None
    fn(q, k, v).sum().backward()


def sdpa(q, k, v):
    if kv_heads == args.heads:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def written_out(q, k, v):
    group = args.heads // kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    t = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


def seconds(fn, q, k, v):
    start = time.perf_counter()
    step(fn, q, k, v)
    return time.perf_counter() - start


print(f"PyTorch {torch.__version__}, one thread: attention forward + backward, float, B {args.batch}, "
      f"{args.heads} query heads over {kv_heads} key-value heads, Dh {args.dh}")
for t in [int(s) for s in args.seq.split(",")]:
    q = torch.randn(args.batch, args.heads, t, args.dh, requires_grad=True)
    k = torch.randn(args.batch, kv_heads, t, args.dh, requires_grad=True)
    v = torch.randn(args.batch, kv_heads, t, args.dh, requires_grad=True)
    variants = [sdpa] + ([written_out] if t <= args.written_max else [])
    for fn in variants:
        step(fn, q, k, v)
    times = [[] for _ in variants]
    for r in range(args.reps):
        for j in range(len(variants)):
            i = (j + r) % len(variants)
            times[i].append(seconds(variants[i], q, k, v))
    ms = [statistics.median(x) * 1e3 for x in times]
    flops = 4.0 * args.batch * args.heads * t * t * args.dh / 2 * 3.5
    row = f"T {t:6d}: SDPA {ms[0]:9.2f} ms, {flops / ms[0] / 1e6:6.1f} GFLOP/s"
    row += f" | written out {ms[1]:9.2f} ms: SDPA {ms[1] / ms[0]:.1f}x faster" if len(ms) > 1 else \
        f" | written out not run (T > --written-max {args.written_max})"
    if t in tshard_ms:
        row += f" | tshard fused {tshard_ms[t]:9.2f} ms: {ms[0] / tshard_ms[t]:.2f}x SDPA's speed"
    print(row, flush=True)
