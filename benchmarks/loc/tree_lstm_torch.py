"""A binary constituency Tree-LSTM and one epoch of training for fine-grained SST (Tai et al. 2015,
sec. 5.1), in PyTorch.

The same function as ``tree_lstm_fold.py``, one tree at a time, recursively, as Tai et al.'s own
implementation did.
"""

import torch
import torch.nn.functional as F
from torch import nn


class TreeLSTM(nn.Module):
    def __init__(self, embeddings, state=150, classes=5):
        super().__init__()
        self.embeddings, self.state = torch.as_tensor(embeddings), state
        self.cell = nn.Linear(self.embeddings.shape[1] + 2 * state, 5 * state)
        self.readout = nn.Linear(state, classes)

    def forward(self, tree, losses):
        if len(tree) == 2:
            x, zero = self.embeddings[tree[1]], torch.zeros(self.state)
            (c_l, h_l), (c_r, h_r) = (zero, zero), (zero, zero)
        else:
            x = torch.zeros(self.embeddings.shape[1])
            (c_l, h_l), (c_r, h_r) = self(tree[1], losses), self(tree[2], losses)
        i, f_l, f_r, o, u = self.cell(torch.cat([x, h_l, h_r])).chunk(5)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l + 1) * c_l + torch.sigmoid(f_r + 1) * c_r
        h = torch.sigmoid(o) * torch.tanh(c)
        losses.append(F.cross_entropy(self.readout(h), torch.tensor(tree[0])))
        return c, h


def train_epoch(model, trees, batch_size=25):
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05, weight_decay=1e-4, initial_accumulator_value=0.1)
    for start in range(0, len(trees), batch_size):
        losses = []
        for tree in trees[start:start + batch_size]:
            model(tree, losses)
        optimizer.zero_grad()
        torch.stack(losses).mean().backward()
        optimizer.step()
