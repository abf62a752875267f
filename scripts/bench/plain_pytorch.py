"""The plain PyTorch loop that gpurun is compared against: the same MLP as gpurun's `mlp` model
(flatten -> [Linear -> ReLU] per hidden width -> Linear), Adam, Fashion-MNIST from the IDX
files, batches gathered on the host and copied to the device as gpurun does. Prints samples/s
over the steps after a warm-up on its last line.

Usage: plain_pytorch.py --device cuda|cpu --data DIR --hidden "[1024, 1024]" --batch 128 --steps 60
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda")
p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--hidden", default="[1024, 1024]")
p.add_argument("--batch", type=int, default=128)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)

with gzip.open(os.path.join(a.data, "train-images-idx3-ubyte.gz")) as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
with gzip.open(os.path.join(a.data, "train-labels-idx1-ubyte.gz")) as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8)
n = a.batch * a.steps
x_all = torch.from_numpy(images[:n].astype(np.float32) / 255.0)
y_all = torch.from_numpy(labels[:n].astype(np.int64))

layers, width = [], 784
for h in json.loads(a.hidden):
    layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
    width = h
model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(a.device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
order = torch.randperm(n)


def sync():
    if a.device == "cuda":
        torch.cuda.synchronize()


warmup = max(1, a.steps // 10)
for i in range(a.steps):
    if i == warmup:
        sync()
        start = time.perf_counter()
    idx = order[i * a.batch:(i + 1) * a.batch]
    x, y = x_all[idx].to(a.device), y_all[idx].to(a.device)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
sync()
print((a.steps - warmup) * a.batch / (time.perf_counter() - start))
