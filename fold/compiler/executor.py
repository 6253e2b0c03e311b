"""Runs a schedule on the device: arenas, hoisted ops, one ``while_loop``.

See ``docs/design.md``. In short:

* One arena per tensor type: constants, then node outputs, in as many rows
  as that type needs rounded up to a power of two, then ``C`` dump rows.
* Depth-1 groups read only constants; they run before the loop, each on
  its row count padded to a power of two. Tail groups (operations only a
  few calls from a result, such as a per-node readout and loss) run the
  same way after the loop. Both run in a small loop over at most 8 pieces,
  so no stage holds a whole group's gathered inputs or their cotangents.
* Deeper groups are work items ``(branch, first node, count)``; the loop
  runs one per iteration, dispatching with one ``lax.switch`` over
  (operation, item size). Branches *read* arenas and return padded
  ``C``-row chunks; the ``dynamic_update_slice`` happens outside the
  switch so XLA never copies an arena through a conditional.
* Reverse mode is one ``jax.custom_vjp`` over hoisted groups, loop and tail
  groups whose residual is the final arenas (every row is written once,
  before anything reads it): the backward pass runs the tail groups', the
  loop's and the hoisted groups' pieces and items in reverse, recomputing
  each one's ``vjp``, masking padded rows, and scatter-adding input
  cotangents into one cotangent arena per float type, in place.
* Stochastic layers get a key folded from the ``apply`` key and the
  item's index (hoisted and tail groups: the group's and the piece's), so
  the backward pass recomputes each with the same random draws as the
  forward pass.
* Padded rows of an item read the item's first real row, so they compute
  on real (finite) data; their output cotangents are zero and their input
  cotangents go to the dump row, so padding never leaks into results or
  gradients, even for ``log`` or ``sqrt(|x|)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import DTypeLike

from fold.scheduler.batch import Batch, BatchArrays, BatchLayout
from fold.scheduler.schedule import MIN_ITEM, item_sizes, layout_item_sizes, piece_rows
from fold.typing import Params, PyTree

if TYPE_CHECKING:
    from fold.scheduler.program import CompiledOp, Program

__all__ = ["Executor", "Arenas"]

Arenas = dict[int, jax.Array]
"""Per arena type index, its rows: the values of a batch while it runs."""

_Plan = tuple[tuple[int, tuple[int, ...], DTypeLike], ...]
"""What a saving loop operation keeps: per saved ``vjp`` leaf, its index, row shape and dtype."""

_Branch = Callable[..., tuple[object, ...]]
"""One case of the loop's ``lax.switch``: one operation at one item size."""


_Vjp = Callable[[list[jax.Array | np.ndarray]], tuple[PyTree, ...]]
"""An operation's ``vjp``: output cotangents to the cotangents of ``(params, *float inputs)``."""

_Run = Callable[[Params, Arenas, BatchArrays, "jax.Array | None"], Arenas]
"""A layout's whole run (``Executor._make_run``): hoisted groups, the loop and tail groups."""

class _Stage(NamedTuple):
    """Hoisted or tail groups, as ``_groups`` takes them."""

    which: str                  # the ``BatchArrays`` field of their rows: "hoist" or "tail"
    ops: tuple[int, ...]        # each group's operation
    sizes: tuple[int, ...]      # each group's padded row count
    chunk: int                  # C: the most rows of one iteration
    stream: int                 # their key stream (``_fold``)

_Residual = tuple[Params, tuple[Arenas, Arenas], BatchArrays, "jax.Array | None", list[jax.Array]]
"""What the backward pass keeps: the parameters, the final arenas, the arrays, the key, saved leaves."""


class _Rows(NamedTuple):
    """Rows of one operation run whole (a hoisted or tail group, or the weight pass's rows of a
    loop operation), or one piece of them (``piece``): index arrays and key."""

    idx: jax.Array          # input rows, per row and input
    valid: jax.Array        # which rows are real
    dest: list[jax.Array]   # per output, the rows it writes (padded rows out of bounds)
    rng: jax.Array | None   # the key (of the whole; a piece's is folded from it)

    def pieces(self, piece: int) -> jax.Array:
        """How many pieces of ``piece`` rows hold the real rows."""
        return (jnp.sum(self.valid, dtype=jnp.int32) + piece - 1) // piece

    def piece(self, piece: int, k: jax.Array) -> _Rows:
        """Piece ``k``: ``piece`` rows from row ``k * piece``, drawing with ``fold_in(rng, k)``."""

        def at(a: jax.Array) -> jax.Array:
            return lax.dynamic_slice_in_dim(a, k * piece, piece)

        rng = None if self.rng is None else jax.random.fold_in(self.rng, k)
        return _Rows(at(self.idx), at(self.valid), [at(d) for d in self.dest], rng)

# Index literals must match the int32 index arrays, also when x64 is on.
_I0 = np.int32(0)

# Columns of a work item's row in ``Executor._item_table``.
_ITEM_NODE, _ITEM_COUNT, _ITEM_OUT = 0, 1, 2

# Streams of per-call keys: loop items, hoisted and tail groups never share a key.
_LOOP_STREAM, _HOIST_STREAM, _TAIL_STREAM = 0, 1, 2

# Rows per piece of the pass after the backward loop that computes a loop operation's parameter
# cotangents (``Executor._weight_pass``): its ``xᵀ·dY`` runs on this many rows at a time, at the
# matmul rate of large calls, while its last piece wastes at most this many rows.
WEIGHT_PIECE = 512
# A loop operation leaves its parameters' cotangents to that pass when its items hold few rows
# for the size of its parameters: ``item rows x (input + output widths) <= WEIGHT_PASS_SHARE x
# parameter entries`` (``Executor.item_share``). A loop item's ``xᵀ·dY`` and its addition to the
# running cotangent write the whole parameter whatever the item's rows, while the pass gathers
# each row again and computes its element-wise work once more, in proportion to its widths. The
# items' mean rows are part of the layout (``BatchLayout.item_rows``, rounded up to a power of
# two), so this adds no compilation. Measured on a 2-core CPU, taking turns: the pass was 7-9 %
# faster for the SST Tree-LSTM (H 150) at 16-25 trees (share 0.25) and for a BiLSTM tagger (H 50)
# at 16 sentences (word LSTMs 0.17, character LSTMs 1.0); item by item 20-25 % faster for the GGNN
# example at 8 graphs (its GRU 2.6, its message layer 7.8) and 7-11 % at 32.
WEIGHT_PASS_SHARE = 2.0
# ... and only in batches of at most this many examples: the SST Tree-LSTM's step at 128 and 256
# trees (share 0.5) ran 18-19 % faster item by item (``benchmarks.weight_pass``), at 64 4 %.
DEFER_BATCH = 32

# What ``backward="save"`` keeps of a loop item: its matmuls' outputs. The backward pass recomputes
# the rest (elementwise work, concatenations, the gathered inputs) from them, which costs little next
# to the matmuls and keeps a Tree-LSTM cell's saved rows at its gates (5H) instead of every
# intermediate autodiff would keep.
_SAVED = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def _is_float(dtype: str) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class Executor:
    """Executes batches for one compiled model (holds only static structure)."""

    def __init__(self, program: Program):
        self.program = program
        self.types = program.types
        self.ops = program.ops
        self.float_types = [t for t, tt in enumerate(self.types) if _is_float(tt.dtype)]
        self._reads_key: dict[int, bool] = {}  # per operation: whether its function reads its key
        # Where loop weight cotangents are summed (``_weights_after``): None lets each batch's
        # layout decide; benchmarks and tests set True (after the loop) or False (item by item).
        self.weight_pass: bool | None = None

    # ------------------------------------------------------------- helpers
    def _params_for(self, op: CompiledOp, params: Params) -> PyTree:
        return None if op.layer is None else params[op.layer.name]

    def _gather_inputs(self, op: CompiledOp, arenas: Arenas, in_idx: jax.Array, first: jax.Array,
                       count: jax.Array, size: int) -> tuple[list[jax.Array], jax.Array, jax.Array]:
        """The item's input rows: padded rows repeat the first real row."""
        n_in = len(op.in_tidx)
        idx = lax.dynamic_slice(in_idx, (first, _I0), (size, in_idx.shape[1]))[:, :n_in]
        valid = jnp.arange(size) < count
        idx = jnp.where(valid[:, None], idx, idx[:1])
        return _gather_rows(op, arenas, idx), idx, valid

    def _slots(self, op_ids: tuple[int, ...], which: str) -> dict[int, int]:
        """Per arena type, the most outputs (or inputs) of that type any op has."""
        k: dict[int, int] = {}
        for o in op_ids:
            for t, j in getattr(self.ops[o], which):
                k[t] = max(k.get(t, 0), j + 1)
        return k

    def _call(self, op: CompiledOp, params: Params, rng: jax.Array | None, xs: list[jax.Array]) -> list[jax.Array]:
        """Runs ``op``, checking its results against its declared types."""
        return _check(op, op.fn(self._params_for(op, params), rng, *xs))

    def _vjp(self, op: CompiledOp, p: PyTree, rng: jax.Array | None, xs: list[jax.Array], float_types: list[int],
             save: bool) -> tuple[list[jax.Array], _Vjp, list[int]]:
        """``op``'s outputs, its ``vjp`` in ``(p, *float inputs)`` (other inputs held fixed) and
        the positions of those float inputs. ``save`` keeps only the matmul outputs in the ``vjp``."""
        diff = [i for i, t in enumerate(op.in_tidx) if t in float_types]

        def f(p: PyTree, *dxs: jax.Array) -> list[jax.Array]:
            full = list(xs)
            for i, dx in zip(diff, dxs):
                full[i] = dx
            return op.fn(p, rng, *full)

        if save:
            f = jax.checkpoint(f, prevent_cse=False, policy=_SAVED)
        ys, vjp = jax.vjp(f, p, *[xs[i] for i in diff])
        return ys, vjp, diff

    def _saved_leaves(self, op: CompiledOp, p: PyTree, rng: jax.Array | None, float_types: list[int],
                      sizes: tuple[int, ...]) -> _Plan:
        """The leaves of ``op``'s ``vjp`` that the forward loop saves, as ``(leaf index, row
        shape, dtype)``: those with one row per item row at every item size (so they can live in
        an arena-like buffer), except the input rows themselves (the backward gathers those
        again). Leaves that are not per row (parameters, their transposes) are cheap to
        recompute. Empty when the leaves do not line up across item sizes."""
        per_size = []
        for size in (*sizes, 2 * sizes[-1]):  # 2C: a parameter can't match every size
            is_input: list[bool] = []

            def leaves(p: PyTree, rng: jax.Array | None, *xs: jax.Array) -> list[jax.Array]:
                out = jax.tree_util.tree_leaves(self._vjp(op, p, rng, list(xs), float_types, True)[1])
                is_input.extend(any(leaf is x for x in xs) for leaf in out)
                return out

            xs = [jax.ShapeDtypeStruct((size, *self.types[t].shape), self.types[t].dtype) for t in op.in_tidx]
            shapes = jax.eval_shape(leaves, _abstract(p), _abstract(rng), *xs)
            per_size.append([(s.shape[:1] == (size,), s.shape[1:], s.dtype, inp)
                             for s, inp in zip(shapes, is_input)])
        if len({len(leaves) for leaves in per_size}) != 1:
            return ()
        saved = []
        for j, seen in enumerate(zip(*per_size)):
            if all(per_row and not inp for per_row, _, _, inp in seen) and len({(r, d) for _, r, d, _ in seen}) == 1:
                saved.append((j, seen[0][1], seen[0][2]))
        return tuple(saved)

    def saved_row_bytes(self, o: int, params: Params, chunk: int) -> int:
        """Bytes that ``backward="save"`` keeps per loop row of operation ``o`` with chunk size
        ``chunk`` (0 when it keeps nothing). ``params`` may be abstract (shapes and dtypes)."""
        op = self.ops[o]
        if not op.out_slots:
            return 0
        # Every size from one row up: what lines up there lines up in every batch's ladder.
        saved = self._saved_leaves(op, _abstract(self._params_for(op, params)), None, self.float_types,
                                   item_sizes(chunk, 1))
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for _, shape, dtype in saved)

    def flops_per_row(self, o: int, params: Params, rows: int = 128) -> float | None:
        """XLA's count of the floating-point operations of one row of operation ``o`` (its forward
        pass on ``rows`` rows, divided by ``rows``), or None when the backend gives no count.
        ``params`` may be abstract; nothing is compiled or run."""
        op = self.ops[o]
        xs = [jax.ShapeDtypeStruct((rows, *self.types[t].shape), self.types[t].dtype) for t in op.in_tidx]
        lowered = jax.jit(lambda p, *xs: op.fn(p, None, *xs)).lower(
            _abstract(self._params_for(op, params)), *xs)
        cost = lowered.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
        flops = cost.get("flops") if isinstance(cost, dict) else None
        return None if flops is None else float(flops) / rows

    # ------------------------------------------------------------- forward
    def initial_arenas(self, arrays: BatchArrays, layout: BatchLayout) -> Arenas:
        """One ``[rows + C, *shape]`` arena per type (``rows = layout.arena_rows[t]``),
        constants in their rows, zeros elsewhere."""
        C = layout.chunk
        arenas = {}
        for t, tt in enumerate(self.types):
            key = str(t)
            if key in arrays.consts:
                pad = jnp.zeros((C, *tt.shape), tt.dtype)
                arenas[t] = jnp.concatenate([jnp.asarray(arrays.consts[key]), pad])
            else:
                arenas[t] = jnp.zeros((layout.arena_rows[t] + C, *tt.shape), tt.dtype)
        return arenas

    # ------------------------------------------------------- whole groups
    def _groups(self, arrays: BatchArrays, key: jax.Array | None, stage: _Stage) -> list[tuple[CompiledOp, int, _Rows]]:
        """Per hoisted or tail group of ``stage``, in order: ``(op, piece, rows)``, ``piece`` its
        rows per loop iteration and ``rows`` its rows (padded rows get an out-of-bounds
        destination, so their writes are dropped)."""
        in_idx, groups = arrays.in_idx, getattr(arrays, stage.which)
        S = in_idx.shape[0]
        chunk, stream = stage.chunk, stage.stream
        out = []
        for h, (o, size) in enumerate(zip(stage.ops, stage.sizes)):
            op = self.ops[o]
            rows = jnp.arange(size)
            valid = rows < groups.count[h]
            idx = in_idx[jnp.minimum(groups.node[h] + rows, S - 1)][:, : len(op.in_tidx)]
            idx = jnp.where(valid[:, None], idx, idx[:1])
            dest = [jnp.where(valid, groups.out[h, self.program.slot_index[slot]] + rows, S) for slot in op.out_slots]
            out.append((op, piece_rows(size, chunk), _Rows(idx, valid, dest, _fold(key, stream, h))))
        return out

    def _group_forward(self, op: CompiledOp, piece: int, p: PyTree, arenas: Arenas, rows: _Rows) -> Arenas:
        """``arenas`` after running a whole group, ``piece`` rows per iteration of a loop whose
        carry holds only the arenas the group writes."""

        def body(k: jax.Array, written: Arenas) -> Arenas:
            r = rows.piece(piece, k)
            ys = _check(op, op.fn(p, r.rng, *_gather_rows(op, {**arenas, **written}, r.idx)))
            return _write_rows(written, op, ys, r.valid, r.dest)

        written = {t: arenas[t] for t in set(op.out_tidx)}
        return {**arenas, **lax.fori_loop(0, rows.pieces(piece), body, written)}

    def _group_backward(self, op: CompiledOp, piece: int, p: PyTree, arenas: Arenas, ct: Arenas,
                        rows: _Rows) -> tuple[Arenas, PyTree]:
        """The group's backward pass, ``piece`` rows at a time: recompute the piece's forward
        (same keys) for its ``vjp`` from the final ``arenas``, read its output cotangents from the
        cotangent arenas ``ct`` and scatter-add its input cotangents into them in place. Returns
        ``ct`` and the cotangent of ``p``. A group run whole would hold its gathered inputs and
        their cotangents, each as large as its rows: for a per-node readout, every node's state."""

        def body(k: jax.Array, carry: tuple[Arenas, PyTree]) -> tuple[Arenas, PyTree]:
            ct, p_acc = dict(carry[0]), carry[1]
            r = rows.piece(piece, k)
            _, vjp, diff = self._vjp(op, p, r.rng, _gather_rows(op, arenas, r.idx), self.float_types, False)
            p_ct, *x_cts = vjp(self._out_cts(op, ct, r.valid, r.dest))
            for i, x_ct in zip(diff, x_cts):
                t = op.in_tidx[i]
                to = jnp.where(r.valid, r.idx[:, i], ct[t].shape[0])  # out of bounds: dropped
                ct[t] = ct[t].at[to].add(where_rows(r.valid, x_ct), mode="drop", wrap_negative_indices=False)
            return ct, jax.tree_util.tree_map(jnp.add, p_acc, p_ct)

        out: tuple[Arenas, PyTree] = lax.fori_loop(0, rows.pieces(piece), body,
                                                   (ct, jax.tree_util.tree_map(jnp.zeros_like, p)))
        return out

    def _out_cts(self, op: CompiledOp, ct: Arenas, valid: jax.Array,
                 dests: list[jax.Array]) -> list[jax.Array | np.ndarray]:
        """The cotangents of ``op``'s outputs at rows ``dests`` (one array per output), zero on rows
        that are not ``valid`` (and float0 for outputs of types without a cotangent arena)."""
        return [where_rows(valid, ct[t].at[dest].get(mode="fill", fill_value=0, wrap_negative_indices=False)) if t in ct
                else np.zeros((valid.shape[0], *self.types[t].shape), jax.dtypes.float0)
                for (t, _), dest in zip(op.out_slots, dests)]

    def _plans(self, layout: BatchLayout, lparams: Params, key: jax.Array | None, float_types: list[int]) -> dict[int,
               _Plan]:
        """Per loop operation (by position in ``layout.loop_ops``), the ``vjp`` leaves its
        forward items save (see ``_saved_leaves``); empty unless the batch saves (its layout has
        ``saved_rows``)."""
        if not layout.saved_rows:
            return {}
        rng = None if key is None else jax.eval_shape(lambda k: _fold(k, _LOOP_STREAM, 0), key)
        plans: dict[int, _Plan] = {}
        for q, o in enumerate(layout.loop_ops):
            op = self.ops[o]
            if not (layout.saved_rows[q] and op.out_slots):  # no buffer: nothing to trace for
                continue
            saved = self._saved_leaves(op, _abstract(self._params_for(op, lparams)), rng, float_types,
                                       layout_item_sizes(layout))
            if saved:
                plans[q] = saved
        return plans

    def _weights_after(self, layout: BatchLayout, lparams: Params, key: jax.Array | None) -> tuple[int, ...]:
        """The loop operations (positions in ``layout.loop_ops``) whose parameters' cotangents the
        backward pass computes after its loop (``_weight_pass``) rather than item by item: those
        with a layer and a float output whose function reads no key, and whose items hold few
        rows for their parameters' size (``WEIGHT_PASS_SHARE``), unless ``weight_pass`` says.
        A loop item's key depends on the item, so a random draw does too, and only the item can
        repeat it."""
        if self.weight_pass is False or (self.weight_pass is None and layout.num_examples > DEFER_BATCH):
            return ()
        rng = None if key is None else jax.eval_shape(lambda k: _fold(k, _LOOP_STREAM, 0), key)
        after = []
        for q, o in enumerate(layout.loop_ops):
            op = self.ops[o]
            if op.layer is None or not any(_is_float(self.types[t].dtype) for t in op.out_tidx):
                continue
            p = self._params_for(op, lparams)
            if rng is not None and self._reads(o, p, rng):
                continue
            if self.weight_pass is None and self.item_share(o, p, layout.item_rows[q]) > WEIGHT_PASS_SHARE:
                continue
            after.append(q)
        return tuple(after)

    def item_share(self, o: int, p: PyTree, item_rows: int) -> float:
        """``item_rows x (input + output widths) / parameter entries`` of operation ``o`` with
        parameters ``p``: what a loop item's rows cost the weight pass against what the item's own
        weight cotangent costs (``WEIGHT_PASS_SHARE``). Outputs count as the block returns them,
        a repeated one each time (``CompiledOp.out_leaves``), as when the threshold was measured:
        counted once, a GRU cell's ``(h, h)`` in the GGNN example at 8 graphs went to the weight
        pass, and its step took 1.07x as long."""
        op = self.ops[o]
        width = sum(math.prod(t.shape) for t in (*op.spec.in_types, *op.spec.out_types))
        entries: int = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(p))
        return item_rows * width / max(entries, 1)

    def _reads(self, o: int, p: PyTree, rng: jax.ShapeDtypeStruct) -> bool:
        """Whether operation ``o``'s function reads its key (passes it to anything at all)."""
        if o not in self._reads_key:
            op = self.ops[o]
            xs = [jax.ShapeDtypeStruct((MIN_ITEM, *self.types[t].shape), self.types[t].dtype) for t in op.in_tidx]
            closed = jax.make_jaxpr(lambda rng, p, *xs: op.fn(p, rng, *xs))(rng, _abstract(p), *xs)
            key_vars = closed.jaxpr.invars[:len(jax.tree_util.tree_leaves(rng))]
            read = [v for eqn in closed.jaxpr.eqns for v in eqn.invars] + list(closed.jaxpr.outvars)
            self._reads_key[o] = any(v is k for v in read for k in key_vars)
        return self._reads_key[o]

    def _weight_pass(self, q: int, lparams: Params, arenas: Arenas, ct: Arenas, arrays: BatchArrays,
                     layout: BatchLayout, key: jax.Array | None, plans: dict[int, _Plan], buffers: _SavedBuffers,
                     saved: list[jax.Array]) -> PyTree:
        """The cotangent of loop operation ``q``'s parameters, over all its rows at once, after the
        backward loop has made every row's cotangent whole: its rows (``_op_rows``) in pieces of
        ``WEIGHT_PIECE`` rows, each a ``vjp`` in the parameters alone, its forward pass read from
        the saved leaves where the batch saves. One large ``xᵀ·dY`` per piece replaces one per
        loop item, and the loop no longer adds a whole parameter cotangent per item: for a
        chain's items of a few rows, that was most of their backward cost."""
        op = self.ops[layout.loop_ops[q]]
        # Op q's rows are among those of each output type that has rows (an output nobody reads has
        # none, ``schedule._live_outputs``); if none has, no cotangent reaches the op at all.
        rows = max(layout.arena_rows[t] for t in op.out_tidx)
        piece = min(rows, WEIGHT_PIECE)
        item, j, valid = _op_rows(arrays, q, len(layout_item_sizes(layout)), rows)
        S = arrays.in_idx.shape[0]  # past every arena's rows: reads there give zeros
        idx = take_rows(arrays.in_idx, arrays.items_node[item] + j)[:, :len(op.in_tidx)]
        op_rows = _Rows(jnp.where(valid[:, None], idx, idx[:1]), valid,
                        [jnp.where(valid, arrays.items_out[item, self.program.slot_index[slot]] + j, S)
                         for slot in op.out_slots],
                        _fold(key, _LOOP_STREAM, 0))  # a key read by nothing (``_weights_after``)
        saved_rows = [buffers.first_rows[b][q] + arrays.items_saved[item] + j for b in buffers.of_leaves.get(q, [])]
        p = self._params_for(op, lparams)

        def body(k: jax.Array, acc: PyTree) -> PyTree:
            r = op_rows.piece(piece, k)
            _, vjp, _ = self._vjp(op, p, r.rng, _gather_rows(op, arenas, r.idx), self.float_types, q in plans)
            if q in plans:
                kept = [take_rows(saved[b], lax.dynamic_slice_in_dim(s, k * piece, piece))
                        for b, s in zip(buffers.of_leaves[q], saved_rows)]
                vjp = _with_saved(vjp, plans[q], kept, r.valid)
            return jax.tree_util.tree_map(jnp.add, acc, vjp(self._out_cts(op, ct, r.valid, r.dest))[0])

        out: PyTree = lax.fori_loop(0, op_rows.pieces(piece), body, jax.tree_util.tree_map(jnp.zeros_like, p))
        return out

    def _item_table(self, arrays: BatchArrays, layout: BatchLayout, buffers: _SavedBuffers) -> jax.Array:
        """Per work item, one int32 row that a loop iteration reads with one dynamic slice (each
        scalar read on its own was an operation of its own in every iteration): its first node,
        its real rows, per output slot the arena row it writes from (from column ``_ITEM_OUT``), then per
        saved buffer the row it writes (and reads back) its ``C`` rows from: its operation's region
        of that buffer plus the item's offset in it (the schedule lays each operation's items out
        one after another, each writing ``C`` rows from where the previous one's padded rows end,
        so a padded tail lands only on rows a later item of the same operation writes, or on its
        region's spill rows), or the ``C`` dump rows past the end when its operation keeps
        nothing there."""
        q = arrays.items_branch // len(layout_item_sizes(layout))
        starts = []
        for first_rows, rows in zip(buffers.first_rows, buffers.rows):
            first = jnp.asarray(first_rows)[q]
            starts.append(jnp.where(first >= 0, first + arrays.items_saved, rows)[:, None])
        cols = [arrays.items_node[:, None], arrays.items_count[:, None], arrays.items_out, *starts]
        return jnp.concatenate([jnp.asarray(c, jnp.int32) for c in cols], axis=1)

    def _branch_table(self, layout: BatchLayout, make: Callable[[int, CompiledOp, int], _Branch]) -> list[_Branch]:
        """The loop's ``lax.switch`` table: ``make(q, op, size)`` for each loop operation ``q`` and
        item size, in the order ``BatchArrays.items_branch`` numbers them (``item_sizes``)."""
        return [make(q, self.ops[o], size) for q, o in enumerate(layout.loop_ops) for size in layout_item_sizes(layout)]

    def _forward_branches(self, layout: BatchLayout, k_out: dict[int, int], plans: dict[int, _Plan],
                          buffers: _SavedBuffers, float_types: list[int]) -> list[_Branch]:
        C = layout.chunk

        def make(q: int, op: CompiledOp, size: int) -> _Branch:
            def branch(lparams: Params, rng: jax.Array | None, arenas: Arenas, in_idx: jax.Array,
                       row: jax.Array) -> tuple[Arenas, list[jax.Array]]:
                xs, _, _ = self._gather_inputs(op, arenas, in_idx, row[_ITEM_NODE], row[_ITEM_COUNT], size)
                saved = [jnp.zeros((C, *shape), dtype) for shape, dtype in buffers.rows_of]
                if q in plans:
                    ys, vjp, _ = self._vjp(op, self._params_for(op, lparams), rng, xs, float_types, True)
                    ys = _check(op, ys)
                    leaves = jax.tree_util.tree_leaves(vjp)
                    for (j, _, _), b in zip(plans[q], buffers.of_leaves[q]):
                        saved[b] = saved[b].at[:size].set(leaves[j])
                else:
                    ys = self._call(op, lparams, rng, xs)
                out = {t: jnp.zeros((k, C, *self.types[t].shape), self.types[t].dtype)
                       for t, k in k_out.items()}
                for y, (t, k) in zip(ys, op.out_slots):
                    out[t] = out[t].at[k, :size].set(y)
                return out, saved
            return branch

        return self._branch_table(layout, make)

    def _forward_loop(self, lparams: Params, arenas: Arenas, arrays: BatchArrays, layout: BatchLayout,
                      key: jax.Array | None,
                      plans: dict[int, _Plan]) -> tuple[Arenas, list[jax.Array]]:
        """The arenas after the loop, and the ``vjp`` leaves saved for ``plans``' operations."""
        k_out = self._slots(layout.loop_ops, "out_slots")
        buffers = _SavedBuffers.of(plans, layout.saved_rows, layout.chunk)
        branches = self._forward_branches(layout, k_out, plans, buffers, self.float_types)
        slot_index = self.program.slot_index
        saved0 = [jnp.zeros((rows + layout.chunk, *shape), dtype)
                  for rows, (shape, dtype) in zip(buffers.rows, buffers.rows_of)]

        table = self._item_table(arrays, layout, buffers)
        n_slots = arrays.items_out.shape[1]

        def body(state: tuple[jax.Array, Arenas, list[jax.Array]]) -> tuple[jax.Array, Arenas, list[jax.Array]]:
            i, arenas, saved = state
            row = lax.dynamic_index_in_dim(table, i, keepdims=False)
            chunks, saved_chunks = lax.switch(arrays.items_branch[i], branches, lparams,
                                              _fold(key, _LOOP_STREAM, i), arenas, arrays.in_idx, row)
            arenas = dict(arenas)
            for t, k_max in k_out.items():
                for k in range(k_max):
                    arenas[t] = _write_at(arenas[t], chunks[t][k], row[_ITEM_OUT + slot_index[(t, k)]])
            saved = [_write_at(b, c, row[_ITEM_OUT + n_slots + j]) for j, (b, c) in enumerate(zip(saved, saved_chunks))]
            return i + 1, arenas, saved

        _, arenas, saved = lax.while_loop(lambda s: s[0] < arrays.n_items, body,
                                          (jnp.int32(0), arenas, saved0))
        return arenas, saved

    # ------------------------------------------------------------ backward
    def _backward_branches(self, layout: BatchLayout, k_in: dict[int, int], float_types: list[int],
                           plans: dict[int, _Plan], buffers: _SavedBuffers, after: tuple[int, ...],
                           in_loop: list[str]) -> list[_Branch]:
        """The backward loop's branches: each returns its item's input cotangents (with the rows
        they go to) and, for an operation not in ``after``, its parameters' cotangents, as a
        dict over the layers ``in_loop`` (the layers of the operations not in ``after``)."""
        C = layout.chunk
        dump = layout.arena_rows  # per type, the first row past its arena's real rows

        def make(q: int, op: CompiledOp, size: int) -> _Branch:
            def branch(lparams: Params, rng: jax.Array | None, arenas: Arenas, in_idx: jax.Array, row: jax.Array,
                       ct: Arenas, saved: list[jax.Array]) -> tuple[Arenas, dict[int, jax.Array], Params]:
                xs, idx, valid = self._gather_inputs(op, arenas, in_idx, row[_ITEM_NODE], row[_ITEM_COUNT], size)
                out_rows = row[_ITEM_OUT:]

                p = self._params_for(op, lparams)
                _, vjp, diff = self._vjp(op, p, rng, xs, float_types, q in plans)
                if q in plans:
                    vjp = _with_saved(vjp, plans[q], [saved[b][:size] for b in buffers.of_leaves[q]], valid)
                cts: list[jax.Array | np.ndarray] = []
                for t, k in op.out_slots:
                    if t in float_types:
                        # Read here, not before the switch: only this operation's slots, only
                        # its rows, and beside the recomputation above rather than before it.
                        start = out_rows[self.program.slot_index[(t, k)]]
                        chunk = lax.dynamic_slice_in_dim(ct[t], start, size)
                        cts.append(where_rows(valid, chunk))
                    else:
                        cts.append(np.zeros((size, *self.types[t].shape), jax.dtypes.float0))
                p_ct, *x_cts = vjp(cts)
                in_cts = {t: jnp.zeros((k, C, *self.types[t].shape), self.types[t].dtype)
                          for t, k in k_in.items()}
                in_rows = {t: jnp.full((k, C), dump[t], jnp.int32) for t, k in k_in.items()}
                for i, x_ct in zip(diff, x_cts):
                    t, k = op.in_slots[i]
                    in_cts[t] = in_cts[t].at[k, :size].set(where_rows(valid, x_ct))
                    in_rows[t] = in_rows[t].at[k, :size].set(jnp.where(valid, idx[:, i], dump[t]))
                p_full = {name: jax.tree_util.tree_map(jnp.zeros_like, lparams[name]) for name in in_loop}
                if op.layer is not None and q not in after:
                    p_full[op.layer.name] = p_ct
                return ({t: v.reshape((-1, *v.shape[2:])) for t, v in in_cts.items()},
                        {t: v.reshape(-1) for t, v in in_rows.items()}, p_full)
            return branch

        return self._branch_table(layout, make)

    def _backward_loop(self, lparams: Params, arenas: Arenas, ct: Arenas, arrays: BatchArrays, layout: BatchLayout,
                       key: jax.Array | None, plans: dict[int, _Plan], saved: list[jax.Array]) -> tuple[Params, Arenas]:
        float_types = sorted(ct)
        k_in = {t: k for t, k in self._slots(layout.loop_ops, "in_slots").items() if t in float_types}
        buffers = _SavedBuffers.of(plans, layout.saved_rows, layout.chunk)
        after = self._weights_after(layout, lparams, key)
        in_loop = sorted({layer.name for q, o in enumerate(layout.loop_ops)
                          if q not in after and (layer := self.ops[o].layer) is not None})
        branches = self._backward_branches(layout, k_in, float_types, plans, buffers, after, in_loop)

        table = self._item_table(arrays, layout, buffers)
        n_slots = arrays.items_out.shape[1]

        def body(state: tuple[jax.Array, Arenas, Params]) -> tuple[jax.Array, Arenas, Params]:
            i, ct, p_acc = state
            row = lax.dynamic_index_in_dim(table, i, keepdims=False)
            # Saved chunks are sliced here: a saved buffer passed into the switch made SST's step
            # at batch 64 1.24x as long (the cotangent arenas, passed in, cost nothing).
            saved_chunks = [lax.dynamic_slice_in_dim(b, row[_ITEM_OUT + n_slots + j], layout.chunk)
                            for j, b in enumerate(saved)]
            in_cts, in_rows, p_ct = lax.switch(
                arrays.items_branch[i], branches, lparams, _fold(key, _LOOP_STREAM, i), arenas, arrays.in_idx,
                row, ct, saved_chunks)
            ct = dict(ct)
            for t in in_cts:
                ct[t] = ct[t].at[in_rows[t]].add(in_cts[t], wrap_negative_indices=False)
            p_acc = jax.tree_util.tree_map(jnp.add, p_acc, p_ct)
            return i - 1, ct, p_acc

        p0 = {name: jax.tree_util.tree_map(jnp.zeros_like, lparams[name]) for name in in_loop}
        _, ct, p_acc = lax.while_loop(lambda s: s[0] >= 0, body, (jnp.asarray(arrays.n_items) - 1, ct, p0))
        # Every row's cotangent is now whole (its readers ran before it in reverse order).
        for q in after:
            g = self._weight_pass(q, lparams, arenas, ct, arrays, layout, key, plans, buffers, saved)
            layer = self.ops[layout.loop_ops[q]].layer
            assert layer is not None  # _weights_after keeps operations with a layer
            name = layer.name
            p_acc[name] = jax.tree_util.tree_map(jnp.add, p_acc[name], g) if name in p_acc else g
        return p_acc, ct

    def _make_run(self, layout: BatchLayout) -> _Run:
        """``run(params, arenas, arrays, key) -> arenas``: hoisted groups, the loop and tail groups,
        differentiated as one ``custom_vjp`` (``_run``, ``_run_fwd``, ``_run_bwd`` below) whose
        residual is the final arenas. Rows are written once and read only after, so every
        backward stage reads its inputs there: no stage keeps an arena version of its own (a
        hoisted group writing the loop's type would otherwise keep a second copy of that arena)."""
        loop_layers = {layer.name for o in layout.loop_ops if (layer := self.ops[o].layer) is not None}
        spec = _RunSpec(self, layout, tuple(sorted(loop_layers)),
                        _Stage("hoist", layout.hoist_ops, layout.hoist_sizes, layout.chunk, _HOIST_STREAM),
                        _Stage("tail", layout.tail_ops, layout.tail_sizes, layout.chunk, _TAIL_STREAM))
        run = jax.custom_vjp(functools.partial(_run, spec))
        run.defvjp(functools.partial(_run_fwd, spec), functools.partial(_run_bwd, spec))
        return functools.partial(_call, spec, run)

    # ------------------------------------------------------------------ run
    def arenas(self, params: Params, batch: Batch, key: jax.Array | None = None) -> Arenas:
        """All arenas after running ``batch`` (pure; differentiable in ``params``, which
        ``Compiler.prepare_params`` checked).

        ``key`` seeds stochastic layers; None runs them deterministically.
        """
        arrays = jax.tree_util.tree_map(jnp.asarray, batch.arrays)
        layout = batch.layout
        arenas = self.initial_arenas(arrays, layout)
        # The loop reads neither constants (now in the arenas), roots nor metrics.
        return self._make_run(layout)(params, arenas, arrays._replace(consts={}, roots=[], metrics={}), key)


class _RunSpec(NamedTuple):
    """What a layout's run is, fixed when it is traced: the rules below read it."""

    executor: Executor
    layout: BatchLayout
    loop_names: tuple[str, ...]  # the layers of the loop's operations
    hoist: _Stage
    tail: _Stage

    def loop_params(self, params: Params) -> Params:
        return {name: params[name] for name in self.loop_names}

    def split(self, arenas: Arenas) -> tuple[Arenas, Arenas]:
        """Float arenas (differentiated) and the others."""
        floats = self.executor.float_types
        return ({t: a for t, a in arenas.items() if t in floats}, {t: a for t, a in arenas.items() if t not in floats})


def _forward(spec: _RunSpec, params: Params, arenas: Arenas, arrays: BatchArrays, key: jax.Array | None,
             plans: dict[int, _Plan]) -> tuple[tuple[Arenas, Arenas], list[jax.Array]]:
    """Hoisted groups, the loop (keeping what ``plans`` says), tail groups: the final arenas,
    split, and the loop's saved leaves."""
    ex = spec.executor
    for op, piece, rows in ex._groups(arrays, key, spec.hoist):
        arenas = ex._group_forward(op, piece, ex._params_for(op, params), arenas, rows)
    saved: list[jax.Array] = []
    if spec.layout.loop_ops:
        arenas, saved = ex._forward_loop(spec.loop_params(params), arenas, arrays, spec.layout, key, plans)
    for op, piece, rows in ex._groups(arrays, key, spec.tail):
        arenas = ex._group_forward(op, piece, ex._params_for(op, params), arenas, rows)
    return spec.split(arenas), saved


def _plans_for(spec: _RunSpec, params: Params, key: jax.Array | None) -> dict[int, _Plan]:
    return spec.executor._plans(spec.layout, spec.loop_params(params), key, spec.executor.float_types)


# ``arrays`` and ``key`` are not differentiated; a None ``key`` means deterministic.
def _run(spec: _RunSpec, params: Params, f_arenas: Arenas, i_arenas: Arenas, arrays: BatchArrays,
         key: jax.Array | None) -> tuple[Arenas, Arenas]:
    """The primal run: nothing saved."""
    return _forward(spec, params, {**f_arenas, **i_arenas}, arrays, key, {})[0]


def _run_fwd(spec: _RunSpec, params: Params, f_arenas: Arenas, i_arenas: Arenas, arrays: BatchArrays,
             key: jax.Array | None) -> tuple[tuple[Arenas, Arenas], _Residual]:
    out, saved = _forward(spec, params, {**f_arenas, **i_arenas}, arrays, key, _plans_for(spec, params, key))
    return out, (params, out, arrays, key, saved)


def _groups_backward(spec: _RunSpec, stage: _Stage, params: Params, arenas: Arenas, ct: Arenas,
                     arrays: BatchArrays, key: jax.Array | None, p_ct: Params) -> Arenas:
    """The cotangents before ``stage``'s groups, last group first; their layers' gradients added
    to ``p_ct``."""
    ex = spec.executor
    for op, piece, rows in reversed(ex._groups(arrays, key, stage)):
        ct, g = ex._group_backward(op, piece, ex._params_for(op, params), arenas, ct, rows)
        if op.layer is not None:
            _add_to(p_ct, op.layer.name, g)
    return ct


def _add_to(p_ct: Params, name: str, g: PyTree) -> None:
    p_ct[name] = jax.tree_util.tree_map(jnp.add, p_ct[name], g)


def _run_bwd(spec: _RunSpec, res: _Residual, cts: tuple[Arenas, Arenas]) -> tuple[Params, Arenas, None, None, None]:
    """Tail groups, the loop, hoisted groups, backwards: every stage reads the final arenas."""
    params, (f_out, i_out), arrays, key, saved = res
    arenas, ct = {**f_out, **i_out}, dict(cts[0])
    p_ct = jax.tree_util.tree_map(jnp.zeros_like, params)
    ct = _groups_backward(spec, spec.tail, params, arenas, ct, arrays, key, p_ct)
    if spec.layout.loop_ops:
        g_loop, ct = spec.executor._backward_loop(spec.loop_params(params), arenas, ct, arrays, spec.layout, key,
                                                  _plans_for(spec, params, key), saved)
        for name, g in g_loop.items():
            _add_to(p_ct, name, g)
    return p_ct, _groups_backward(spec, spec.hoist, params, arenas, ct, arrays, key, p_ct), None, None, None


def _call(spec: _RunSpec, run: Callable[..., tuple[Arenas, Arenas]], params: Params, arenas: Arenas,
          arrays: BatchArrays, key: jax.Array | None) -> Arenas:
    f_out, i_out = run(params, *spec.split(arenas), arrays, key)
    return {**f_out, **i_out}


class _SavedBuffers(NamedTuple):
    """The buffers a saving batch keeps its loop items' ``vjp`` leaves in, shared between loop
    operations: the ``n``-th leaf of a given row shape and dtype of every operation goes to the
    buffer of that (shape, dtype, n), in which each operation using it has rows of its own. An
    item writes and reads one ``C``-row chunk per buffer, not one per leaf of every operation (a
    model with several saving operations would otherwise pay for all of them in every item).

    An item always writes ``C`` rows, so an operation's last item (padded, or ending where its
    saved rows end) spills up to ``C`` rows past them: each region is its saved rows followed by
    ``C`` spill rows, or the next operation's earlier items would be overwritten. Nothing reads
    spill rows, so the last region's are also the buffer's dump rows, where operations without a
    region write their (zero) chunk."""

    rows_of: tuple[tuple[tuple[int, ...], DTypeLike], ...]  # per buffer: (row shape, dtype)
    rows: tuple[int, ...]  # per buffer: rows before its C dump rows
    first_rows: tuple[np.ndarray, ...]  # per buffer: per loop operation, its region's first row (-1: none)
    of_leaves: dict[int, list[int]]  # per saving loop operation: the buffer of each of its saved leaves

    @classmethod
    def of(cls, plans: dict[int, _Plan], saved_rows: tuple[int, ...], chunk: int) -> _SavedBuffers:
        """The buffers for ``plans`` (``Executor._plans``), operation ``q`` needing ``saved_rows[q]``
        rows and items writing ``chunk`` rows each."""
        keys: list[tuple[tuple[int, ...], DTypeLike, int]] = []  # (row shape, dtype, n)
        first: list[np.ndarray] = []
        ends: list[int] = []  # per buffer: the end of its last region's spill rows
        of_leaves: dict[int, list[int]] = {}
        for q in sorted(plans):
            seen: dict[tuple[tuple[int, ...], DTypeLike], int] = {}
            of_leaves[q] = []
            for _, shape, dtype in plans[q]:
                sig = (tuple(shape), np.dtype(dtype))
                seen[sig] = seen.get(sig, -1) + 1
                if (*sig, seen[sig]) not in keys:
                    keys.append((*sig, seen[sig]))
                    first.append(np.full(len(saved_rows), -1, np.int32))
                    ends.append(0)
                b = keys.index((*sig, seen[sig]))
                first[b][q] = ends[b]
                ends[b] += saved_rows[q] + chunk
                of_leaves[q].append(b)
        rows = tuple(end - chunk for end in ends)
        return cls(tuple((shape, dtype) for shape, dtype, _ in keys), rows, tuple(first), of_leaves)


def _op_rows(arrays: BatchArrays, q: int, n_sizes: int, rows: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Loop operation ``q``'s rows, one after another in loop order, padded to ``rows``: per row,
    its work item, its position in that item, and whether it is real (padding rows come last)."""
    items = jnp.arange(arrays.items_branch.shape[0])
    mine = (items < arrays.n_items) & (arrays.items_branch // n_sizes == q)
    count = jnp.where(mine, arrays.items_count, 0).astype(jnp.int32)
    end = jnp.cumsum(count, dtype=jnp.int32)
    r = jnp.arange(rows, dtype=jnp.int32)
    item = jnp.minimum(jnp.searchsorted(end, r, side="right"), end.shape[0] - 1).astype(jnp.int32)
    return item, r - (end[item] - count[item]), r < end[-1]


def _with_saved(vjp: _Vjp, plan: _Plan, rows: list[jax.Array], valid: jax.Array) -> _Vjp:
    """``vjp`` with its saved leaves (``plan``) replaced by ``rows``, so XLA drops their
    recomputation. Rows that are not ``valid`` take the first row's, as the forward loop's padded
    rows do. A leaf whose shape does not match its rows is kept (computed, not read)."""
    leaves, tree = jax.tree_util.tree_flatten(vjp)
    for (j, _, _), r in zip(plan, rows):
        if leaves[j].shape == r.shape and leaves[j].dtype == r.dtype:
            leaves[j] = where_rows(valid, r, r[:1])
    out: _Vjp = jax.tree_util.tree_unflatten(tree, leaves)
    return out


def _gather_rows(op: CompiledOp, arenas: Arenas, idx: jax.Array) -> list[jax.Array]:
    """``op``'s input rows ``idx`` (one column per input) from ``arenas``."""
    return [take_rows(arenas[t], idx[:, i]) for i, t in enumerate(op.in_tidx)]


def take_rows(a: jax.Array | np.ndarray, rows: jax.Array | np.ndarray) -> jax.Array:
    """``a[rows]`` for row numbers that are never negative. Plain indexing first maps negative
    numbers to rows from the end, and XLA's CPU backend fuses that test into the gather's loop,
    once per element rather than per row (a GGNN step was 3-5 % faster without it).

    One row is a ``dynamic_slice`` (clamped, as ``"clip"`` does) rather than a gather: XLA
    rewrites a one-index gather into an instruction named ``dynamic-slice.N``, and its CPU fusion
    emitter (jaxlib 0.10.2) miscompiles a fusion where such an instruction reads its start from
    one that JAX named ``dynamic_slice.M`` (here, the item's row of input indices): it reads the
    index from a float operand and fails ("SExt only operates on integer"). Renaming either
    instruction in the HLO compiles it."""
    a = jnp.asarray(a)
    if np.shape(rows) == (1,):
        # ``dynamic_slice`` wraps a negative start: clamp it first, as the gather does.
        return lax.dynamic_slice_in_dim(a, jnp.maximum(jnp.asarray(rows)[0], 0), 1)
    return a.at[rows].get(mode="clip", wrap_negative_indices=False)


def where_rows(mask: jax.Array, x: jax.Array, fill: jax.Array | float | None = None) -> jax.Array:
    """Per row (the leading axis), ``x`` where ``mask`` holds, else ``fill`` (zeros when None)."""
    fill = jnp.zeros((), x.dtype) if fill is None else fill
    return jnp.where(mask.reshape((-1,) + (1,) * (x.ndim - 1)), x, fill)


def _write_rows(arenas: Arenas, op: CompiledOp, ys: list[jax.Array], valid: jax.Array, dest: list[jax.Array]) -> Arenas:
    """``arenas`` with ``op``'s outputs ``ys`` written to rows ``dest`` (one array per output;
    out-of-bounds rows are dropped), zeros on rows that are not ``valid``."""
    arenas = dict(arenas)
    for y, (t, _), rows in zip(ys, op.out_slots, dest):
        arenas[t] = arenas[t].at[rows].set(where_rows(valid, y), mode="drop", wrap_negative_indices=False)
    return arenas


def _write_at(buffer: jax.Array, chunk: jax.Array, start: jax.Array) -> jax.Array:
    """``buffer`` with ``chunk`` written from row ``start`` on (in place inside the loop)."""
    return lax.dynamic_update_slice(buffer, chunk, (start, *(_I0,) * (buffer.ndim - 1)))


def _check(op: CompiledOp, ys: list[jax.Array]) -> list[jax.Array]:
    """``op``'s results ``ys``, checked against its declared types."""
    for y, t in zip(ys, op.out_types):
        if y.shape[1:] != t.shape or y.dtype != t.dtype:
            raise TypeError(
                f"{op.spec.label} returned {y.dtype}{list(y.shape[1:])} but its type is {t}: were the "
                "params made by compiler.init (same dtypes and shapes)?"
            )
    return ys


def _abstract(tree: PyTree) -> PyTree:
    """``tree`` with its arrays (or tracers) replaced by their shapes and dtypes."""
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _fold(key: jax.Array | None, stream: int, i: jax.Array | int) -> jax.Array | None:
    """The key of call ``i`` of ``stream``, or None when running deterministically."""
    if key is None:
        return None
    return jax.random.fold_in(jax.random.fold_in(key, stream), i)
