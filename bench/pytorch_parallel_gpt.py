#!/usr/bin/env python3
"""The GPT of tests/reference/gpt_reference.py trained as a PyTorch user parallelises it: DDP over
every rank (--mode ddp, --batch sequences in all), or DTensor tensor parallelism (--mode tp:
parallelize_module with ColwiseParallel for q, k, v and fc1 and RowwiseParallel for proj and fc2,
Megatron's layout; --batch sequences on every rank). gloo, one thread a process, float, random
weights and tokens; AdamW; gradients clipped to 1 under DDP (PyTorch's clip_grad_norm_ refuses a
model whose parameters mix DTensors and tensors, so the tensor-parallel run does not clip).
Prints the tokens/s of the steps after the first, as bench/run_scaling.sh's runs do.

    python3 -m torch.distributed.run --standalone --nproc_per_node 4 bench/pytorch_parallel_gpt.py \
        --mode ddp --batch 32 --dmodel 1024 --heads 16 --seq 256 --vocab 1024 --layers 2 --steps 3
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from gpt_reference import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "tp"], required=True)
    for flag, default in [("--batch", 8), ("--dmodel", 1024), ("--heads", 16), ("--seq", 256), ("--vocab", 1024),
                          ("--layers", 2), ("--steps", 3), ("--hidden", 0), ("--peak-n", 0)]:
        ap.add_argument(flag, type=int, default=default)
    a = ap.parse_args()
    a.hidden = a.hidden or 4 * a.dmodel
    a.eod, a.reset_position_ids = -1, False  # one document a row, as train_transformer's bench runs
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(1)
    model = GPT(a)
    rows = a.batch // n if a.mode == "ddp" else a.batch
    if a.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (n,))
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        for block in model.blocks:
            parallelize_module(block, mesh, plan)
            block.heads //= n  # the heads each rank holds
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    g = torch.Generator().manual_seed(7 + (rank if a.mode == "ddp" else 0))
    start = None
    for step in range(a.steps):
        if step == 1:
            dist.barrier()
            start = time.perf_counter()
        ids = torch.randint(0, a.vocab, (rows, a.seq + 1), generator=g)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a.vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        if a.mode == "ddp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dist.barrier()
    if rank == 0 and a.steps > 1:
        seconds = time.perf_counter() - start
        tokens = (a.steps - 1) * a.batch * a.seq
        print("  pytorch %s, %s %-17d %9.0f tokens/s" % (torch.__version__.split("+")[0], "DDP" if a.mode == "ddp" else "DTensor TP",
                                                       n, tokens / seconds), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
