"""Feed-forward attention (Raffel & Ellis 2016, sec. 2.3) with its loss and accuracy, in PyTorch.

The same function as ``attention_fold.py``, one example at a time.
"""

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, hidden=100):
        super().__init__()
        self.encode, self.score = nn.Linear(2, hidden), nn.Linear(hidden, 1)
        self.hidden, self.out = nn.Linear(hidden, hidden), nn.Linear(hidden, 1)

    def forward(self, steps):
        h = torch.relu(self.encode(torch.tensor(steps, dtype=torch.float32)))
        alpha = torch.softmax(torch.tanh(self.score(h))[:, 0], dim=0)
        context = (alpha[:, None] * h).sum(0)
        return self.out(torch.relu(self.hidden(context)))[0]


def loss_and_accuracy(model, examples):
    errors = torch.stack([model(steps) - target for steps, target in examples])
    return (errors**2).mean(), (errors.abs() < 0.04).float().mean()
