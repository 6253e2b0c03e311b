"""One weave module (Kearnes et al. 2016, sec. 3.3), in PyTorch.

The same function as ``weave_fold.py``, one molecule at a time.
"""

import torch
from torch import nn


class Weave(nn.Module):
    def __init__(self, atom_in, pair_in, hidden=50, atom_out=50, pair_out=50):
        super().__init__()
        self.f_aa, self.f_pa = nn.Linear(atom_in, hidden), nn.Linear(pair_in, hidden)
        self.f_ap, self.f_pp = nn.Linear(2 * atom_in, hidden), nn.Linear(pair_in, hidden)
        self.f_a, self.f_p = nn.Linear(2 * hidden, atom_out), nn.Linear(2 * hidden, pair_out)

    def forward(self, atoms, pairs):
        atoms, pairs = torch.tensor(atoms, dtype=torch.float32), torch.tensor(pairs, dtype=torch.float32)
        n = len(atoms)
        a_i, a_j = atoms[:, None].expand(n, n, -1), atoms[None].expand(n, n, -1)
        a_to_p = torch.relu(self.f_ap(torch.cat([a_i, a_j], -1))) + torch.relu(self.f_ap(torch.cat([a_j, a_i], -1)))
        p_to_a = torch.relu(self.f_pa(pairs)).sum(1)
        new_atoms = torch.relu(self.f_a(torch.cat([torch.relu(self.f_aa(atoms)), p_to_a], -1)))
        return new_atoms, torch.relu(self.f_p(torch.cat([a_to_p, torch.relu(self.f_pp(pairs))], -1)))
