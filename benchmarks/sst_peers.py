"""The SST Tree-LSTM written without fold, as its users would: the peers of ``sst_throughput``.

Every peer trains the same model as ``benchmarks.models.sst_model`` (binary
Tree-LSTM of Tai et al. 2015, a leaf reads its word's embedding, an internal
node reads zeros and its children's states, a per-node 5-way softmax loss,
mean over the nodes of a batch) with plain SGD, from the same parameters:

- ``TorchEager``: PyTorch, one tree at a time, one cell call per node
  (what the Cavs paper calls static unrolling);
- ``TorchLevels``: PyTorch with hand-written level-by-level batching (all
  nodes of the same height in one cell call, as DGL's Tree-LSTM does);
- ``JaxPerTree``: plain JAX, ``jit`` of each tree's gradient, traced per
  distinct tree shape (recompiles whenever a new shape arrives);
- ``DynetAutobatch``: DyNet's automatic batching (Neubig et al. 2017) of
  graphs written one tree at a time, where ``dynet38`` installs.

``plain_params`` converts fold's parameters into the shared layout, so
tests can check that every peer computes fold's loss and gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.against_dynet import start_dynet

CLASSES = 5
FORGET_BIAS = 1.0
DYNET_MEMORY_MB = 4096


def plain_params(fold_params: dict) -> dict[str, np.ndarray]:
    """fold's SST Tree-LSTM parameters as ``{embedding, cell_w, cell_b, out_w, out_b}`` NumPy arrays."""
    cell, fc = fold_params["binary_tree_lstm_cell"], fold_params["fc"]
    return {"embedding": np.asarray(fold_params["embedding"]["table"]), "cell_w": np.asarray(cell["w"]),
            "cell_b": np.asarray(cell["b"]), "out_w": np.asarray(fc["w"]), "out_b": np.asarray(fc["b"])}


def is_leaf(node: tuple) -> bool:
    return len(node) == 2


class Flat:
    """A batch of SST trees as arrays, nodes numbered so that every height is one contiguous range.

    ``word[n]`` (-1 for internal nodes), ``left[n]``/``right[n]`` (-1 for
    leaves), ``label[n]``; ``levels`` lists ``(start, stop)`` per height.
    """

    def __init__(self, trees: list[tuple], word_idx: dict[str, int]):
        nodes: list[tuple] = []  # (height, word, left, right, label) in post-order
        for tree in trees:
            todo: list[tuple[tuple, bool]] = [(tree, False)]
            done: list[int] = []
            while todo:
                node, ready = todo.pop()
                if is_leaf(node):
                    nodes.append((0, word_idx.get(node[1], -1), -1, -1, node[0]))
                    done.append(len(nodes) - 1)
                elif ready:
                    r, l_ = done.pop(), done.pop()
                    nodes.append((1 + max(nodes[l_][0], nodes[r][0]), -1, l_, r, node[0]))
                    done.append(len(nodes) - 1)
                else:
                    todo += [(node, True), (node[2], False), (node[1], False)]
        table = np.array(nodes, dtype=np.int64).reshape(-1, 5)
        order = np.argsort(table[:, 0], kind="stable")
        new_id = np.empty_like(order)
        new_id[order] = np.arange(len(order))
        t = table[order]
        self.word = t[:, 1]
        self.left = np.where(t[:, 2] >= 0, new_id[t[:, 2]], -1)
        self.right = np.where(t[:, 3] >= 0, new_id[t[:, 3]], -1)
        self.label = t[:, 4]
        bounds = np.flatnonzero(np.diff(t[:, 0])) + 1
        edges = [0, *bounds.tolist(), len(t)]
        self.levels = list(zip(edges[:-1], edges[1:]))


# ------------------------------------------------------------------- PyTorch
class _TorchModel:
    """Parameters as torch leaf tensors, the cell, and an SGD step per batch."""

    def __init__(self, params: dict[str, np.ndarray], word_idx: dict[str, int], lr: float = 0.05):
        import torch

        self.torch = torch
        self.word_idx = word_idx
        self.p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
        self.opt = torch.optim.SGD(list(self.p.values()), lr=lr)
        self.hidden = params["out_w"].shape[0]
        self.embed = params["embedding"].shape[1]

    def cell(self, x: Any, cl: Any, hl: Any, cr: Any, hr: Any) -> tuple[Any, Any]:
        torch = self.torch
        z = torch.cat([x, hl, hr], -1) @ self.p["cell_w"] + self.p["cell_b"]
        i, fl, fr, o, u = z.chunk(5, -1)
        c = (torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl + FORGET_BIAS) * cl
             + torch.sigmoid(fr + FORGET_BIAS) * cr)
        return c, torch.sigmoid(o) * torch.tanh(c)

    def loss(self, trees: list[tuple]) -> Any:
        raise NotImplementedError

    def train_step(self, trees: list[tuple]) -> float:
        loss = self.loss(trees)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return float(loss.detach())


class TorchEager(_TorchModel):
    """PyTorch, one tree at a time, one cell call per node; one SGD step per batch."""

    def loss(self, trees: list[tuple]) -> Any:
        torch = self.torch
        zero_h = torch.zeros(1, self.hidden)
        zero_x = torch.zeros(1, self.embed)
        hs, labels = [], []

        def node(t: tuple) -> tuple[Any, Any]:
            if is_leaf(t):
                w = self.word_idx.get(t[1], -1)
                x = self.p["embedding"][w:w + 1] if w >= 0 else zero_x
                c, h = self.cell(x, zero_h, zero_h, zero_h, zero_h)
            else:
                cl, hl = node(t[1])
                cr, hr = node(t[2])
                c, h = self.cell(zero_x, cl, hl, cr, hr)
            hs.append(h)
            labels.append(t[0])
            return c, h

        for tree in trees:
            node(tree)
        logits = torch.cat(hs) @ self.p["out_w"] + self.p["out_b"]
        return torch.nn.functional.cross_entropy(logits, torch.tensor(labels))


class TorchLevels(_TorchModel):
    """PyTorch with hand-written level batching: one cell call per tree height in the batch."""

    def loss(self, trees: list[tuple] | Flat) -> Any:
        """``trees`` may come flattened already (``Flat``), as a peer that prepares its batches once would."""
        torch = self.torch
        f = trees if isinstance(trees, Flat) else Flat(trees, self.word_idx)
        start, stop = f.levels[0]
        words = torch.from_numpy(f.word[start:stop])
        known = (words >= 0).unsqueeze(1)
        x = torch.where(known, self.p["embedding"][words.clamp(min=0)], torch.zeros(()))
        zero = torch.zeros(stop - start, self.hidden)
        c, h = self.cell(x, zero, zero, zero, zero)
        for start, stop in f.levels[1:]:
            left = torch.from_numpy(f.left[start:stop])
            right = torch.from_numpy(f.right[start:stop])
            x = torch.zeros(stop - start, self.embed)
            c_new, h_new = self.cell(x, c[left], h[left], c[right], h[right])
            c, h = torch.cat([c, c_new]), torch.cat([h, h_new])
        logits = h @ self.p["out_w"] + self.p["out_b"]
        return torch.nn.functional.cross_entropy(logits, torch.from_numpy(f.label))


# --------------------------------------------------------------------- DyNet
class DynetAutobatch:
    """DyNet with automatic batching (``autobatch=1``): each tree's graph written node by node, as
    in ``TorchEager``, and DyNet batching the operations of a minibatch's graph when it runs it;
    one SGD step per batch. DyNet is optional (``pip install dynet38``); its configuration is
    global, so the first ``DynetAutobatch`` of a process sets it."""

    def __init__(self, params: dict[str, np.ndarray], word_idx: dict[str, int], lr: float = 0.05):
        # Autobatching needs its memory pool allocated up front (it cannot grow): a batch of 256
        # SST trees at H 150 does not fit DyNet's default 512 MB.
        self.dy = dy = start_dynet(DYNET_MEMORY_MB)
        self.word_idx = word_idx
        self.model = dy.ParameterCollection()
        self.embedding = self.model.lookup_parameters_from_numpy(params["embedding"])
        # DyNet multiplies W x, so its weights are the transposes of the others' x W.
        self.p = {name: self.model.parameters_from_numpy(params[name].T if name.endswith("_w") else params[name])
                  for name in ("cell_w", "cell_b", "out_w", "out_b")}
        self.trainer = dy.SimpleSGDTrainer(self.model, learning_rate=lr)
        self.trainer.set_clip_threshold(0)  # DyNet clips gradients by default; the others do not
        self.hidden = params["out_w"].shape[0]
        self.embed = params["embedding"].shape[1]

    def cell(self, x: Any, cl: Any, hl: Any, cr: Any, hr: Any) -> tuple[Any, Any]:
        dy, n = self.dy, self.hidden
        z = self.p["cell_w"] * dy.concatenate([x, hl, hr]) + self.p["cell_b"]
        i, fl, fr, o, u = (dy.pick_range(z, k * n, (k + 1) * n) for k in range(5))
        c = (dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(dy.logistic(fl + FORGET_BIAS), cl)
             + dy.cmult(dy.logistic(fr + FORGET_BIAS), cr))
        return c, dy.cmult(dy.logistic(o), dy.tanh(c))

    def loss(self, trees: list[tuple]) -> Any:
        """The mean per-node loss of ``trees`` as a DyNet expression of a fresh graph."""
        dy = self.dy
        dy.renew_cg()
        zero_h, zero_x = dy.zeros(self.hidden), dy.zeros(self.embed)
        losses = []

        def node(t: tuple) -> tuple[Any, Any]:
            if is_leaf(t):
                w = self.word_idx.get(t[1], -1)
                c, h = self.cell(self.embedding[w] if w >= 0 else zero_x, zero_h, zero_h, zero_h, zero_h)
            else:
                cl, hl = node(t[1])
                cr, hr = node(t[2])
                c, h = self.cell(zero_x, cl, hl, cr, hr)
            losses.append(dy.pickneglogsoftmax(self.p["out_w"] * h + self.p["out_b"], t[0]))
            return c, h

        for tree in trees:
            node(tree)
        return dy.esum(losses) / len(losses)

    def train_step(self, trees: list[tuple]) -> float:
        loss = self.loss(trees)
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return float(value)

    def params(self) -> dict[str, np.ndarray]:
        """The current parameters, in ``plain_params``'s layout."""
        out = {name: p.as_array().T if name.endswith("_w") else p.as_array() for name, p in self.p.items()}
        return {"embedding": self.embedding.as_array(), **out}


# ---------------------------------------------------------------------- JAX
def shape_of(tree: tuple) -> Any:
    """The tree's structure without words and labels (the key ``jit`` traces on)."""
    return None if is_leaf(tree) else (shape_of(tree[1]), shape_of(tree[2]))


def _leaves_and_labels(tree: tuple, word_idx: dict[str, int]) -> tuple[list[int], list[int]]:
    words, labels = [], []

    def go(t: tuple) -> None:
        if is_leaf(t):
            words.append(word_idx.get(t[1], -1))
        else:
            go(t[1])
            go(t[2])
        labels.append(t[0])

    go(tree)
    return words, labels


def jax_cell(w: jax.Array, b: jax.Array, x: jax.Array, cl: jax.Array, hl: jax.Array, cr: jax.Array,
             hr: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The binary Tree-LSTM cell in plain ``jax.numpy`` (one node or rows of nodes): ``(c, h)``."""
    i, fl, fr, o, u = jnp.split(jnp.concatenate([x, hl, hr], -1) @ w + b, 5, -1)
    c = jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(fl + FORGET_BIAS) * cl + jax.nn.sigmoid(fr + FORGET_BIAS) * cr
    return c, jax.nn.sigmoid(o) * jnp.tanh(c)


def _jax_tree_loss(shape: Any) -> Callable:
    """Summed per-node loss of one tree shaped like ``shape``: ``f(params, words, labels)``."""

    def f(p: dict, words: jax.Array, labels: jax.Array) -> jax.Array:
        hidden, embed = p["out_w"].shape[0], p["embedding"].shape[1]
        zero_h, zero_x = jnp.zeros(hidden), jnp.zeros(embed)
        leaf_pos, hs = iter(range(words.shape[0])), []

        def cell(x, cl, hl, cr, hr):
            return jax_cell(p["cell_w"], p["cell_b"], x, cl, hl, cr, hr)

        def go(s: Any) -> tuple[jax.Array, jax.Array]:
            if s is None:
                w = words[next(leaf_pos)]
                x = jnp.where(w >= 0, p["embedding"][jnp.maximum(w, 0)], zero_x)
                c, h = cell(x, zero_h, zero_h, zero_h, zero_h)
            else:
                cl, hl = go(s[0])
                cr, hr = go(s[1])
                c, h = cell(zero_x, cl, hl, cr, hr)
            hs.append(h)
            return c, h

        go(shape)
        logits = jnp.stack(hs) @ p["out_w"] + p["out_b"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.sum(jnp.take_along_axis(logp, labels[:, None], 1))

    return f


class JaxPerTree:
    """Plain JAX: a jitted gradient per distinct tree shape, summed over the batch; one SGD step per batch."""

    def __init__(self, params: dict[str, np.ndarray], word_idx: dict[str, int], lr: float = 0.05):
        self.p = {k: jnp.asarray(v) for k, v in params.items()}
        self.word_idx = word_idx
        self.lr = lr
        self.compiled: dict[Any, Callable] = {}
        self.update = jax.jit(lambda p, g, n: jax.tree.map(lambda a, b: a - lr * b / n, p, g))

    def grad_fn(self, tree: tuple) -> Callable:
        shape = shape_of(tree)
        if shape not in self.compiled:
            self.compiled[shape] = jax.jit(jax.value_and_grad(_jax_tree_loss(shape)))
        return self.compiled[shape]

    def loss_and_grads(self, trees: list[tuple]) -> tuple[float, dict, int]:
        total, grads, nodes = 0.0, None, 0
        for tree in trees:
            words, labels = _leaves_and_labels(tree, self.word_idx)
            loss, g = self.grad_fn(tree)(self.p, jnp.asarray(words, jnp.int32), jnp.asarray(labels, jnp.int32))
            grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
            total += loss
            nodes += len(labels)
        return total / nodes, grads, nodes

    def train_step(self, trees: list[tuple]) -> float:
        loss, grads, nodes = self.loss_and_grads(trees)
        self.p = self.update(self.p, grads, nodes)
        return float(jax.block_until_ready(loss))
