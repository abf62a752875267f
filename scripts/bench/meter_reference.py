"""PyTorch's own count for scripts/bench/meter_check.cpp's step: the same MLP, batch, loss and
optimizer in Python; prints torch.cuda.max_memory_allocated() of the second step."""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 10)).cuda()
# foreach=False: LibTorch's C++ SGD updates one parameter at a time, as this does.
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)
x = torch.randn(256, 784).cuda()
y = torch.randint(0, 10, (256,)).cuda()


def step():
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


step()
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
step()
torch.cuda.synchronize()
print(torch.cuda.max_memory_allocated())
