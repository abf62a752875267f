# PyTorch's side of scripts/bench/sharded.sh: gpurun's gpt (plugins/gpt.cpp: learned positions,
# pre-LayerNorm blocks, fused causal attention, a 4x GELU MLP, an untied head) in PyTorch,
# trained with DDP, ZeroRedundancyOptimizer + DDP, or FSDP2 (fully_shard per block) over Gloo,
# 1 thread a rank, AdamW, on random token ids already in memory. Prints rank 0's median seconds
# per optimizer step after 3 warm-up steps.
# Usage (under torchrun): sharded_gpt.py ddp|zero|fsdp2 LAYERS WIDTH HEADS CONTEXT BATCH STEPS
import os, statistics, sys, time, math
import torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
mode, layers, width, heads, context, batch, steps = sys.argv[1], *map(int, sys.argv[2:8])
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.norm1, s.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        s.qkv, s.projection = nn.Linear(width, 3 * width), nn.Linear(width, width)
        s.expand, s.contract = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
    def forward(s, x):
        b, t, w = x.shape
        q, k, v = s.qkv(s.norm1(x)).view(b, t, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, w)
        x = x + s.projection(y)
        return x + s.contract(F.gelu(s.expand(s.norm2(x))))
class Gpt(nn.Module):
    def __init__(s):
        super().__init__()
        s.tokens, s.positions = nn.Embedding(256, width), nn.Embedding(context, width)
        s.blocks = nn.ModuleList(Block() for _ in range(layers))
        s.norm, s.head = nn.LayerNorm(width), nn.Linear(width, 256, bias=False)
    def forward(s, ids):
        x = s.tokens(ids) + s.positions(torch.arange(ids.shape[1]))
        for b in s.blocks: x = b(x)
        return s.head(s.norm(x))
torch.manual_seed(0)
model = Gpt()
if mode == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
elif mode == "zero":
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-4, weight_decay=0.1)
elif mode == "fsdp2":
    from torch.distributed.fsdp import fully_shard
    for b in model.blocks: fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
local = batch // world
g = torch.Generator().manual_seed(rank)
ids = torch.randint(256, (local, context + 1), generator=g)
x, y = ids[:, :-1], ids[:, 1:]
times = []
for step in range(steps):
    t = time.perf_counter()
    opt.zero_grad()
    F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).backward()
    opt.step()
    times.append(time.perf_counter() - t)
if rank == 0: print(statistics.median(times[3:]))
dist.destroy_process_group()
