"""Your first job, before microco: a plain PyTorch script (docs/first-job.md starts here)."""

import torch
from sklearn.datasets import load_digits

x, y = load_digits(return_X_y=True)
x, y = torch.tensor(x, dtype=torch.float32) / 16, torch.tensor(y)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = torch.nn.CrossEntropyLoss()
torch.manual_seed(0)

for epoch in range(3):
    order = torch.randperm(len(x))
    for i in range(0, len(x), 64):
        batch = order[i : i + 64]
        loss = loss_fn(model(x[batch]), y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}", flush=True)
