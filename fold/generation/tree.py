"""``TreeDecoder``: a top-down tree decoder (Zhang et al.'s TD-TreeLSTM) trained and run by fold.

A node has a state. The root's is the start state; the ``k``-th child of a node gets
``child((parent state, state of child k - 1))``, zeros standing in for the sibling of the first
child. Each node decides its number of children among ``arities`` (``arity(state)`` gives their
logits, in that order); a node with none is a leaf and decides its label (``label(state)``
gives the labels' logits). A tree is written as a leaf's label (an int) or a tuple of
subtrees: ``((3, 1), 4)`` is a root with two children, the first of which has two leaves.

In a model, ``TreeDecoder`` scores a given tree (teacher forcing): its input is ``(start state,
tree)`` and its output one log-probability per decision in preorder (a node's arity, then a
leaf's label). ``fd.Generator`` decides trees on the device.

How the device generates (``decode``): every node is one entry of a queue shared by the batch,
made when its parent decides to expand (the first child) or when its previous sibling has its
state (the next one). Each iteration of one ``lax.while_loop`` takes the next ``frontier``
entries (whichever examples they belong to: every one is ready, its parent and previous sibling
having run in an earlier iteration), computes their states and arity decisions in one batched
call each, and appends the entries they make. An expanding node reserves its children's node
numbers at once, so each example's nodes are numbered as a per-example run would number them,
and its draws (keys folded from the example and node numbers) do not depend on the batch. A
label decides nothing about the structure: a second loop then labels the leaves, ``frontier``
at a time.

Bounds, per example: ``max_nodes`` nodes and ``max_levels`` levels below the root. A node that
would expand past either becomes a leaf (scored as one) and the example is flagged
(``GeneratedTrees.truncated``); once an example has been refused nodes it expands no further.
Memory: ``[examples * max_nodes]`` rows per state leaf, plus a queue and a list of leaves of as
many entries. The loop writes every state row before it reads it, so the state rows are a
*scratch* buffer ``fd.Generator.generate`` keeps between calls (``TreeDecoder.scratch``); the
per-node states it returns are a copy of the used rows, made only when asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fold.blocks.base import Block, run_leaf, set_child
from fold.blocks.host import BlockLike, HostContext, HostValue, HostWalk
from fold.blocks.inputs import zeros_value
from fold.blocks.tensors import Function
from fold.blocks.types import PyObjectType, SequenceType, TensorType, TupleType, Type, dtype_kind, is_tensor_tree
from fold.compiler.executor import where_rows
from fold.fields import documented
from fold.generation.decoder import Decoder, choose, positive, token_log_prob
from fold.generation.device import DeviceFunction
from fold.typing import Params, PyObject, PyTree

__all__ = ["TreeDecoder", "GeneratedTrees"]

_INDEX = TensorType((), "int32")


@documented
class GeneratedTrees(NamedTuple):
    """Trees generated for a batch of start states: per example, its nodes by number (the root
    is 0; a node's children are numbered after it, consecutively)."""

    parent: jax.Array
    """``[examples, max_nodes]``: each node's parent's number; -1 for the root and unused slots."""
    position: jax.Array
    """``[examples, max_nodes]``: which child of its parent a node is (0 first)."""
    arity: jax.Array
    """``[examples, max_nodes]``: how many children a node has; -1 for unused slots."""
    label: jax.Array
    """``[examples, max_nodes]``: a leaf's label; -1 for other nodes."""
    num_nodes: jax.Array
    """``[examples]``: how many nodes each tree has."""
    truncated: jax.Array
    """``[examples]``: whether a bound turned a node that chose children into a leaf."""
    log_prob: jax.Array
    """``[examples]``: log-probability of every decision the tree holds."""
    states: PyTree
    """Per leaf of the state, ``[examples, max_nodes, ...]``: each node's state (zeros for unused
    slots); None when ``generate`` was asked for no states."""

    def trees(self) -> list[PyObject]:
        """Per example, its tree as nested tuples with int labels at the leaves (the form
        ``TreeDecoder`` scores)."""
        parent, arity, label, count = (np.asarray(a) for a in (self.parent, self.arity, self.label, self.num_nodes))
        first = _first_children(parent, count)
        out = []
        for b in range(len(count)):
            n_nodes = int(count[b])
            kids, labels, firsts = arity[b, :n_nodes].tolist(), label[b, :n_nodes].tolist(), first[b].tolist()
            built: list[PyObject] = [None] * n_nodes
            # Children are numbered after their parent, consecutively: build from the last node back.
            for n in range(n_nodes - 1, -1, -1):
                k = kids[n]
                built[n] = labels[n] if k == 0 else tuple(built[firsts[n]:firsts[n] + k])
            out.append(built[0])
        return out


def _first_children(parent: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``[examples, max_nodes]``: each node's first child's number (the least number whose parent
    it is), for the nodes of ``count`` that have children."""
    examples, max_nodes = parent.shape
    first = np.full((examples, max_nodes), max_nodes, np.int64)
    b, m = np.nonzero((parent >= 0) & (np.arange(max_nodes) < count[:, None]))
    np.minimum.at(first, (b, parent[b, m]), m)
    return first


class TreeDecoder(Decoder):
    """``(start state, tree) -> per decision its log-probability``; generated by ``fd.Generator``
    (see the module docstring).

    Args:
      child: block ``(parent state, previous sibling's state) -> state``.
      arity: block ``state -> logits``, one per entry of ``arities``.
      label: block ``state -> logits`` over the leaves' labels.
      arities: the numbers of children a node may have, distinct ints >= 0, 0 among them.
      max_levels: the most levels below the root ``fd.Generator`` makes.
      max_nodes: the most nodes of one generated tree.
    """

    structure_type = PyObjectType()

    def __init__(self, child: BlockLike, arity: BlockLike, label: BlockLike, arities: Sequence[int] = (0, 2),
                 max_levels: int = 32, max_nodes: int = 256, name: str | None = None):
        arities = tuple(arities)
        if (not arities or any(isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in arities)
                or len(set(arities)) != len(arities) or 0 not in arities):
            raise ValueError(f"TreeDecoder: arities must be distinct ints >= 0 with 0 among them (a tree needs "
                             f"leaves), got {arities!r}")
        self.arities = arities
        self.max_levels = positive("TreeDecoder", "max_levels", max_levels)
        self.max_nodes = positive("TreeDecoder", "max_nodes", max_nodes)
        super().__init__(name)
        self.child = self._adopt(child)
        self.arity = self._adopt(arity)
        self.label = self._adopt(label)
        self._pick_arity = self._adopt(Function(token_log_prob, name="arity_log_prob"))
        self._pick_label = self._adopt(Function(token_log_prob, name="label_log_prob"))

    def children(self) -> list[Block]:
        return [self.child, self.arity, self.label, self._pick_arity, self._pick_label]

    def _check_input(self, t: Type) -> None:
        if not isinstance(t, TupleType) or len(t) != 2:
            raise TypeError(f"{self!r} takes (start state, tree), not {t}")
        if not is_tensor_tree(t[0]):
            raise TypeError(f"{self!r}: its start state must be tensors (and tuples of them), not {t[0]}")
        if not isinstance(t[1], PyObjectType):
            raise TypeError(f"{self!r}: its tree is a Python object (nested tuples, int labels), not {t[1]}")

    def _logits(self, block: Block, n: int | None) -> TensorType | None:
        logits = block.output_type
        if logits is None:
            return None
        if not isinstance(logits, TensorType) or len(logits.shape) != 1 or dtype_kind(logits.dtype) != "f":
            raise TypeError(f"{self!r}: {block!r} must return a float vector of logits, not {logits}")
        if n is not None and logits.shape[0] != n:
            raise TypeError(f"{self!r}: {block!r} returns {logits.shape[0]} logits, one per arity of {self.arities}")
        return logits

    def _infer(self) -> None:
        state = self.state_type
        if state is None:
            return
        set_child(self, TupleType(state, state), self.child, "input", "(parent state, sibling state)")
        if self.child.output_type is not None:
            set_child(self, state, self.child, "output", "a child's state")
        set_child(self, state, self.arity, "input", "the state")
        set_child(self, state, self.label, "input", "the state")
        arity, label = self._logits(self.arity, len(self.arities)), self._logits(self.label, None)
        if arity is not None:
            set_child(self, TupleType(arity, _INDEX), self._pick_arity, "input", "(arity logits, choice)")
        if label is not None:
            set_child(self, TupleType(label, _INDEX), self._pick_label, "input", "(label logits, label)")
        if arity is not None:
            set_child(self, SequenceType(TensorType((), arity.dtype)), self, "output", "output")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        root_state, tree = x
        state_type, label_type = self.state_type, self.label.output_type
        assert state_type is not None and isinstance(label_type, TensorType)  # a compiled model knows its types
        zeros = zeros_value(state_type, ctx)
        scores = []
        stack: list[tuple[PyObject, HostValue]] = [(tree, root_state)]
        while stack:
            node, state = stack.pop()
            logits = yield self.arity, state, "TreeDecoder[arity]"
            kids = self._node_children(node, label_type.shape[0])
            choice = ctx.const(_INDEX, np.int32(self.arities.index(len(kids))))
            scores.append(run_leaf(self._pick_arity, (logits, choice), ctx))
            if not kids:
                logits = yield self.label, state, "TreeDecoder[label]"
                scores.append(run_leaf(self._pick_label, (logits, ctx.const(_INDEX, np.int32(node))), ctx))
                continue
            sibling, states = zeros, []
            for k in range(len(kids)):
                sibling = yield self.child, (state, sibling), ("TreeDecoder[child {}]", k)
                states.append(sibling)
            stack.extend(reversed(list(zip(kids, states))))
        return scores

    def _node_children(self, node: PyObject, labels: int) -> tuple[PyObject, ...]:
        """A tree node's children (none for a leaf), checked."""
        if isinstance(node, (tuple, list)):
            if len(node) not in self.arities or not node:
                raise ValueError(f"{self!r}: a node has {len(node)} children, but its arities are {self.arities}")
            return tuple(node)
        if isinstance(node, (bool, np.bool_)) or not isinstance(node, (int, np.integer)) or not 0 <= node < labels:
            raise ValueError(f"{self!r}: a leaf must be a label, an int in [0, {labels}), got {node!r}")
        return ()

    # ------------------------------------------------------------------ generation
    def device_parts(self) -> dict[str, tuple[Block, Type]]:
        state = self.state_type
        assert state is not None  # fd.Generator sets it first
        return {"child": (self.child, TupleType(state, state)), "arity": (self.arity, state),
                "label": (self.label, state)}

    def scratch(self, start: PyTree) -> PyTree:
        """The per-node state buffers: ``rows * max_nodes`` rows per leaf of the state."""
        return jax.tree_util.tree_map(lambda a: jnp.zeros((a.shape[0] * self.max_nodes, *a.shape[1:]), a.dtype),
                                      start)

    def decode(self, fns: dict[str, DeviceFunction], params: Params, start: PyTree, key: jax.Array | None,
               examples: jax.Array, states: bool = True, scratch: PyTree = None,
               frontier: int | None = None) -> tuple[GeneratedTrees, PyTree]:
        """Generates every example's tree together (see the module docstring), ``frontier``
        entries per iteration (default: as many as rows). Returns the trees (their per-node
        states only if ``states``) and the per-node state buffers, which ``scratch`` (from
        ``self.scratch``, contents left by any earlier call) stands in for when given."""
        rows = jax.tree_util.tree_leaves(start)[0].shape[0]
        return _TreeLoop(self, fns, params, start, key, rows, frontier or rows).run(examples, states, scratch)


class _Queue(NamedTuple):
    """Nodes waiting for their state, in the order they run; node ids are global
    (``example * max_nodes + number``), ``G`` (the zero row) where there is none."""

    example: jax.Array
    parent: jax.Array   # global id; -1 for a root
    position: jax.Array
    sibling: jax.Array  # the previous sibling's global id, or G
    number: jax.Array   # the node's number in its example


class _Nodes(NamedTuple):
    """Per global node id (``G`` rows), what has been decided; id ``G`` (no node) reads as zeros."""

    state: PyTree
    parent: jax.Array
    position: jax.Array
    arity: jax.Array
    label: jax.Array
    depth: jax.Array


class _Carry(NamedTuple):
    head: jax.Array
    tail: jax.Array
    queue: _Queue
    nodes: _Nodes
    numbered: jax.Array   # [examples]: nodes numbered (reserved) so far
    refused: jax.Array    # [examples]: a node was refused its children for lack of nodes
    truncated: jax.Array  # [examples]
    log_prob: jax.Array   # [examples]


def _rows(state: PyTree, ids: jax.Array) -> PyTree:
    """The rows ``ids`` of every leaf of ``state``; zeros for id ``G`` (no node)."""
    return jax.tree_util.tree_map(lambda a: a.at[ids].get(mode="fill", fill_value=0), state)


def _per_example(x: jax.Array, valid: jax.Array, example: jax.Array, examples: int) -> jax.Array:
    """``x`` summed per example over the ``valid`` rows."""
    return jax.ops.segment_sum(jnp.where(valid, x, 0), example, examples)


class _TreeLoop:
    """One ``decode``: the loop's static sizes and its body (see the module docstring)."""

    def __init__(self, decoder: TreeDecoder, fns: dict[str, DeviceFunction], params: Params, start: PyTree,
                 key: jax.Array | None, rows: int, frontier: int):
        self.d, self.fns, self.params, self.start, self.key = decoder, fns, params, start, key
        self.B, self.N, self.F = rows, decoder.max_nodes, frontier
        self.G = rows * decoder.max_nodes
        self.arities = jnp.asarray(decoder.arities, jnp.int32)
        self.leaf_choice = decoder.arities.index(0)

    def initial(self, examples: jax.Array, state: PyTree) -> _Carry:
        B, G, F = self.B, self.G, self.F
        size = G + F  # entries run F at a time: the last slice may reach past the G there can be
        roots = jnp.arange(B, dtype=jnp.int32)

        def column(first: jax.Array, fill: int) -> jax.Array:
            return jnp.full(size, fill, jnp.int32).at[:B].set(first)

        none, zero = jnp.full(B, -1, jnp.int32), jnp.zeros(B, jnp.int32)
        queue = _Queue(column(roots, 0), column(none, -1), column(zero, 0), column(none + G + 1, G), column(zero, 0))
        logits = jax.eval_shape(lambda s: self.fns["arity"](self.params, s), self.start)

        def per_node(fill: int) -> jax.Array:
            return jnp.full(G, fill, jnp.int32)

        nodes = _Nodes(state, per_node(-1), per_node(0), per_node(-1), per_node(-1), per_node(0))
        return _Carry(jnp.int32(0), jnp.asarray(examples, jnp.int32), queue, nodes, jnp.ones(B, jnp.int32),
                      jnp.zeros(B, bool), jnp.zeros(B, bool), jnp.zeros(B, logits.dtype))

    def body(self, c: _Carry) -> _Carry:
        B, N, G, F = self.B, self.N, self.G, self.F
        e = _Queue(*(lax.dynamic_slice_in_dim(a, c.head, F) for a in c.queue))
        valid = c.head + jnp.arange(F) < c.tail
        is_root = e.parent < 0
        parent = jnp.maximum(e.parent, 0)
        me = jnp.where(valid, e.example * N + e.number, G)  # G: out of bounds, dropped

        # The entries' states: a root's is its start state, another's its child step's.
        parent_state = jax.tree_util.tree_map(lambda a: a[parent], c.nodes.state)
        sibling_state = _rows(c.nodes.state, e.sibling)
        stepped = self.fns["child"](self.params, (parent_state, sibling_state))
        start = jax.tree_util.tree_map(lambda a: a[e.example], self.start)
        state = jax.tree_util.tree_map(
            lambda s, r: where_rows(is_root, r, s), stepped, start)
        depth = jnp.where(is_root, 0, c.nodes.depth[parent] + 1)

        # Arity: what the node chooses, what the bounds grant.
        arity_logits = self.fns["arity"](self.params, state)
        chosen = choose(arity_logits, self.key, e.example, e.number, 0)
        wants = self.arities[chosen]
        asks = jnp.where(valid & (depth < self.d.max_levels) & ~c.refused[e.example], wants, 0)
        # Per entry, the children its example's entries ask for up to it, itself included: a
        # masked [F, F] sum (a cumsum over [F, examples] was a slow reduce-window on the CPU).
        up_to = (e.example[None, :] == e.example[:, None]) & (jnp.arange(F)[None, :] <= jnp.arange(F)[:, None])
        asked = jnp.sum(jnp.where(up_to, asks[None, :], 0), axis=1)
        fits = c.numbered[e.example] + asked <= N
        granted = (asks > 0) & fits
        arity = jnp.where(granted, wants, 0)
        choice = jnp.where(granted, chosen, self.leaf_choice)
        first_child = c.numbered[e.example] + asked - asks

        logp = token_log_prob(arity_logits, choice)

        def per_example(x: jax.Array) -> jax.Array:
            return _per_example(x, valid, e.example, B)

        nodes = _Nodes(
            jax.tree_util.tree_map(lambda a, s: a.at[me].set(s, mode="drop"), c.nodes.state, state),
            c.nodes.parent.at[me].set(jnp.where(is_root, -1, e.parent - e.example * N), mode="drop"),
            c.nodes.position.at[me].set(e.position, mode="drop"),
            c.nodes.arity.at[me].set(arity, mode="drop"),
            c.nodes.label,
            c.nodes.depth.at[me].set(depth, mode="drop"))

        # New entries: the next sibling (its parent decided before this iteration), then the first child.
        has_sibling = valid & ~is_root & (e.position + 1 < c.nodes.arity[parent])
        made = has_sibling.astype(jnp.int32) + granted
        at = c.tail + jnp.cumsum(made) - made
        size = G + F
        sib_at = jnp.where(has_sibling, at, size)
        kid_at = jnp.where(granted, at + has_sibling, size)
        g_me = e.example * N + e.number
        queue = _Queue(*(
            col.at[sib_at].set(sib, mode="drop").at[kid_at].set(kid, mode="drop")
            for col, sib, kid in zip(
                c.queue,
                (e.example, e.parent, e.position + 1, g_me, e.number + 1),
                (e.example, g_me, jnp.zeros_like(g_me), jnp.full_like(g_me, G), first_child))))
        return _Carry(
            c.head + jnp.sum(valid, dtype=jnp.int32), c.tail + jnp.sum(made, dtype=jnp.int32), queue, nodes,
            c.numbered + per_example(jnp.where(granted, wants, 0)),
            c.refused | (per_example((asks > 0) & ~fits) > 0),
            c.truncated | (per_example(valid & (wants > 0) & ~granted) > 0),
            c.log_prob + per_example(logp))

    def labels(self, c: _Carry) -> tuple[jax.Array, jax.Array]:
        """The leaves' labels and the log-probabilities with their labels' added. A label
        decides nothing about the structure, so the leaves are labelled after it is grown, ``F``
        at a time: no iteration of the structure's loop computes labels for the nodes that
        expand (half a binary tree's), and the logits over a large vocabulary run on full chunks."""
        G, F, N = self.G, self.F, self.N
        n = c.nodes
        leaf = n.arity == 0  # -1 in unused slots
        count = jnp.sum(leaf, dtype=jnp.int32)
        slot = jnp.where(leaf, jnp.cumsum(leaf, dtype=jnp.int32) - 1, G + F)
        leaves = jnp.full(G + F, G, jnp.int32).at[slot].set(jnp.arange(G, dtype=jnp.int32), mode="drop")

        def body(carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
            head, label, log_prob = carry
            node = lax.dynamic_slice_in_dim(leaves, head, F)  # G (no node) past the last leaf
            valid = head + jnp.arange(F) < count
            example, number = node // N, node % N
            logits = self.fns["label"](self.params, _rows(n.state, node))
            chosen = choose(logits, self.key, example, number, 1)
            label = label.at[node].set(chosen, mode="drop")  # G, past the last leaf: dropped
            return head + F, label, log_prob + _per_example(token_log_prob(logits, chosen), valid, example, self.B)

        _, label, log_prob = lax.while_loop(lambda carry: carry[0] < count, body,
                                            (jnp.int32(0), n.label, c.log_prob))
        return label, log_prob

    def run(self, examples: jax.Array, states: bool, scratch: PyTree) -> tuple[GeneratedTrees, PyTree]:
        # Rows the loop reads are written first (a root's parent row is read but not used, a missing
        # sibling is id G, read as zeros): scratch buffers need no clearing, only the output does.
        buffer = self.d.scratch(self.start) if scratch is None else scratch
        c = lax.while_loop(lambda c: c.head < c.tail, self.body, self.initial(examples, buffer))
        label, log_prob = self.labels(c)
        B, N = self.B, self.N
        n = c.nodes

        def per_example(a: jax.Array) -> jax.Array:
            return a.reshape((B, N, *a.shape[1:]))

        node_states = None
        if states:
            used = (jnp.arange(N)[None, :] < c.numbered[:, None]).reshape(-1)
            node_states = jax.tree_util.tree_map(lambda a: per_example(where_rows(used, a, 0)), n.state)
        trees = GeneratedTrees(per_example(n.parent), per_example(n.position), per_example(n.arity),
                               per_example(label), c.numbered, c.truncated, log_prob, node_states)
        return trees, n.state
