"""Runs a schedule on the device: arenas, hoisted ops, one ``while_loop``.

See ``docs/design.md``. In short:

* One arena per tensor type: constants, then node outputs, in as many rows
  as that type needs rounded up to a power of two, then ``C`` dump rows.
* Depth-1 groups read only constants; they run once, before the loop, on
  their row count padded to a power of two, and are differentiated by
  ordinary autodiff (gathering their inputs again in the backward pass
  rather than keeping the gathered copy).
  Tail groups (operations only a few calls from a result, such as a
  per-node readout and loss) run the same way after the loop.
* Deeper groups are work items ``(branch, first node, count)``; the loop
  runs one per iteration, dispatching with one ``lax.switch`` over
  (operation, item size). Branches *read* arenas and return padded
  ``C``-row chunks; the ``dynamic_update_slice`` happens outside the
  switch so XLA never copies an arena through a conditional.
* Reverse mode is a ``jax.custom_vjp`` whose residual is the final arena
  and whose backward pass is a second loop over the items in reverse:
  recompute each item's ``vjp``, mask padded rows, and scatter-add input
  cotangents into the cotangent arena in one scatter per type.
* Stochastic layers get a key folded from the ``apply`` key and the
  item's index (hoisted and tail groups: the group's index), so the backward loop
  recomputes each item with the same random draws as the forward loop.
* Padded rows of an item read the item's first real row, so they compute
  on real (finite) data; their output cotangents are zero and their input
  cotangents go to the dump row, so padding never leaks into results or
  gradients, even for ``log`` or ``sqrt(|x|)``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from fold.scheduler.schedule import item_sizes

__all__ = ["Executor"]

# Index literals must match the int32 index arrays, also when x64 is on.
_I0 = np.int32(0)

_LOOP_ARRAYS = ("in_idx", "items_branch", "items_node", "items_count", "items_out", "items_saved", "n_items")

# Streams of per-call keys: loop items, hoisted and tail groups never share a key.
_LOOP_STREAM, _HOIST_STREAM, _TAIL_STREAM = 0, 1, 2

_GATHERED = "fold_gathered_inputs"  # checkpoint name of a whole group's gathered input rows
# A tail group's backward runs in at most this many pieces (``Executor._in_pieces``): its
# temporaries shrink to a piece's rows for a few more loop iterations.
_PIECES = 8

# What ``backward="save"`` keeps of a loop item: its matmuls' outputs. The backward pass recomputes
# the rest (elementwise work, concatenations, the gathered inputs) from them, which costs little next
# to the matmuls and keeps a Tree-LSTM cell's saved rows at its gates (5H) instead of every
# intermediate autodiff would keep.
_SAVED = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def _is_float(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


class Executor:
    """Executes batches for one compiled model (holds only static structure)."""

    def __init__(self, model: Any):
        self.model = model
        self.types = model.types
        self.ops = model.ops
        self.float_types = [t for t, tt in enumerate(self.types) if _is_float(tt.dtype)]

    # ------------------------------------------------------------- helpers
    def _params_for(self, op: Any, params: Any) -> Any:
        return None if op.layer is None else params[op.layer.name]

    def _gather_inputs(self, op: Any, arenas: dict, in_idx: jax.Array, first: jax.Array,
                       count: jax.Array, size: int) -> tuple[list, jax.Array, jax.Array]:
        """The item's input rows: padded rows repeat the first real row."""
        n_in = len(op.in_tidx)
        idx = lax.dynamic_slice(in_idx, (first, _I0), (size, in_idx.shape[1]))[:, :n_in]
        valid = jnp.arange(size) < count
        idx = jnp.where(valid[:, None], idx, idx[:1])
        xs = [arenas[t][idx[:, i]] for i, t in enumerate(op.in_tidx)]
        return xs, idx, valid

    def _slots(self, op_ids: tuple, which: str) -> dict[int, int]:
        """Per arena type, the most outputs (or inputs) of that type any op has."""
        k: dict[int, int] = {}
        for o in op_ids:
            for t, j in getattr(self.ops[o], which):
                k[t] = max(k.get(t, 0), j + 1)
        return k

    def _call(self, op: Any, params: Any, rng: Any, xs: list) -> list:
        """Runs ``op``, checking its results against its declared types."""
        return _check(op, op.spec.fn(self._params_for(op, params), rng, *xs))

    def _vjp(self, op: Any, p: Any, rng: Any, xs: list, float_types: Any, save: bool) -> tuple:
        """``op``'s outputs, its ``vjp`` in ``(p, *float inputs)`` (other inputs held fixed) and
        the positions of those float inputs. ``save`` keeps only the matmul outputs in the ``vjp``."""
        diff = [i for i, t in enumerate(op.in_tidx) if t in float_types]

        def f(p, *dxs):
            full = list(xs)
            for i, dx in zip(diff, dxs):
                full[i] = dx
            return op.spec.fn(p, rng, *full)

        if save:
            f = jax.checkpoint(f, prevent_cse=False, policy=_SAVED)
        ys, vjp = jax.vjp(f, p, *[xs[i] for i in diff])
        return ys, vjp, diff

    def _saved_leaves(self, op: Any, p: Any, rng: Any, float_types: Any, sizes: tuple) -> tuple:
        """The leaves of ``op``'s ``vjp`` that the forward loop saves, as ``(leaf index, row
        shape, dtype)``: those with one row per item row at every item size (so they can live in
        an arena-like buffer), except the input rows themselves (the backward gathers those
        again). Leaves that are not per row (parameters, their transposes) are cheap to
        recompute. Empty when the leaves do not line up across item sizes."""
        per_size = []
        for size in (*sizes, 2 * sizes[-1]):  # 2C: a parameter can't match every size
            is_input: list = []

            def leaves(p, rng, *xs):
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

    def saved_row_bytes(self, o: int, params: Any, chunk: int) -> int:
        """Bytes that ``backward="save"`` keeps per loop row of operation ``o`` with chunk size
        ``chunk`` (0 when it keeps nothing). ``params`` may be abstract (shapes and dtypes)."""
        op = self.ops[o]
        if not op.out_slots:
            return 0
        saved = self._saved_leaves(op, _abstract(self._params_for(op, params)), None, self.float_types,
                                   item_sizes(chunk))
        return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for _, shape, dtype in saved)

    # ------------------------------------------------------------- forward
    def initial_arenas(self, arrays: dict, layout: Any) -> dict:
        """One ``[rows + C, *shape]`` arena per type (``rows = layout.arena_rows[t]``),
        constants in their rows, zeros elsewhere."""
        C = layout.chunk
        arenas = {}
        for t, tt in enumerate(self.types):
            key = str(t)
            if key in arrays["consts"]:
                pad = jnp.zeros((C, *tt.shape), tt.dtype)
                arenas[t] = jnp.concatenate([jnp.asarray(arrays["consts"][key]), pad])
            else:
                arenas[t] = jnp.zeros((layout.arena_rows[t] + C, *tt.shape), tt.dtype)
        return arenas

    def run_groups(self, params: Any, arenas: dict, in_idx: Any, groups: dict, ops: tuple, sizes: tuple,
                   key: Any, stream: int, chunk: int | None = None) -> dict:
        """Runs whole groups (hoisted before the loop, or tail groups after it) in order, group
        ``h`` once on ``sizes[h]`` padded rows, and writes their outputs. With ``chunk`` (tail
        groups), each group runs in pieces (``_in_pieces``)."""
        S = in_idx.shape[0]
        for h, (o, size) in enumerate(zip(ops, sizes)):
            rows = jnp.arange(size)
            op = self.ops[o]
            first, count = groups["node"][h], groups["count"][h]
            valid = rows < count
            idx = in_idx[jnp.minimum(first + rows, S - 1)][:, : len(op.in_tidx)]
            idx = jnp.where(valid[:, None], idx, idx[:1])
            # S is out of bounds: padded rows' writes are dropped.
            dest = [jnp.where(valid, groups["out"][h, self.model.slot_index[slot]] + rows, S) for slot in op.out_slots]
            rng, p = _fold(key, stream, h), self._params_for(op, params)
            touched = set(op.in_tidx) | set(op.out_tidx)
            f_arenas = {t: arenas[t] for t in touched if t in self.float_types}
            i_arenas = {t: arenas[t] for t in touched if t not in self.float_types}
            group = self._regathered(op) if chunk is None else self._in_pieces(op, _piece_rows(size, chunk))
            f_out, i_out = group(p, f_arenas, i_arenas, {"idx": idx, "valid": valid, "dest": dest, "rng": rng})
            arenas = {**arenas, **f_out, **i_out}
        return arenas

    def _regathered(self, op: Any) -> Any:
        """``group(p, f_arenas, i_arenas, aux)`` running ``op`` once on all of a group's rows,
        differentiated by autodiff without keeping the gathered input rows: the backward pass
        gathers them again from the arenas (which it keeps anyway). Everything else the op's
        backward needs is kept as usual, so nothing but the gather is recomputed."""

        def run(p, arenas, idx, rng):
            xs = [checkpoint_name(arenas[t][idx[:, i]], _GATHERED) for i, t in enumerate(op.in_tidx)]
            return _check(op, op.spec.fn(p, rng, *xs))

        call = jax.checkpoint(run, policy=jax.checkpoint_policies.save_anything_except_these_names(_GATHERED))

        def group(p, f_arenas, i_arenas, aux):
            arenas = {**f_arenas, **i_arenas}
            return self._split(_write_rows(arenas, op, call(p, arenas, aux["idx"], aux["rng"]), aux))

        return group

    def _in_pieces(self, op: Any, piece: int) -> Any:
        """``group(p, f_arenas, i_arenas, aux)`` running ``op`` on a group's rows ``piece`` at a
        time, in a loop, forward and backward: the backward recomputes each piece's forward for
        its ``vjp`` and scatter-adds the piece's input cotangents into the cotangent arenas in
        place. A tail group such as a per-node readout reads every node's state: run whole, its
        gathered inputs and their cotangents are each as large as those rows. Piece ``k`` draws
        with ``fold_in(aux["rng"], k)``, forward and backward alike."""
        float_types = self.float_types

        def pieces(aux: dict) -> jax.Array:
            return (jnp.sum(aux["valid"], dtype=jnp.int32) + piece - 1) // piece

        def piece_of(aux: dict, k: Any) -> tuple:
            """Piece ``k``'s input rows, valid mask, destination rows (per output) and key."""
            at = lambda a: lax.dynamic_slice_in_dim(a, k * piece, piece)  # noqa: E731
            rng = None if aux["rng"] is None else jax.random.fold_in(aux["rng"], k)
            return at(aux["idx"]), at(aux["valid"]), [at(d) for d in aux["dest"]], rng

        def gather(arenas: dict, idx: jax.Array) -> list:
            return [arenas[t][idx[:, i]] for i, t in enumerate(op.in_tidx)]

        @jax.custom_vjp
        def group(p, f_arenas, i_arenas, aux):
            read = {**f_arenas, **i_arenas}
            written = {t: read[t] for t in op.out_tidx}  # only these ride in the loop's carry

            def body(k, written):
                idx, valid, dest, rng = piece_of(aux, k)
                ys = _check(op, op.spec.fn(p, rng, *gather({**read, **written}, idx)))
                return _write_rows(written, op, ys, {"valid": valid, "dest": dest})

            return self._split({**read, **lax.fori_loop(0, pieces(aux), body, written)})

        def group_fwd(p, f_arenas, i_arenas, aux):
            out = group(p, f_arenas, i_arenas, aux)
            # The outputs hold the input rows unchanged (an op writes only its own rows).
            return out, (p, out, aux)

        def group_bwd(res, cts):
            p, (f_out, i_out), aux = res
            arenas = {**f_out, **i_out}

            def body(k, carry):
                ct, p_acc = dict(carry[0]), carry[1]
                idx, valid, dests, rng = piece_of(aux, k)
                _, vjp, diff = self._vjp(op, p, rng, gather(arenas, idx), float_types, False)
                out_cts = []
                for (t, _), dest in zip(op.out_slots, dests):
                    if t in ct:
                        out_cts.append(_masked(valid, ct[t].at[dest].get(mode="fill", fill_value=0)))
                        ct[t] = ct[t].at[dest].set(0, mode="drop")  # the forward overwrote these rows
                    else:
                        out_cts.append(np.zeros((piece, *self.types[t].shape), jax.dtypes.float0))
                p_ct, *x_cts = vjp(out_cts)
                for i, x_ct in zip(diff, x_cts):
                    t = op.in_tidx[i]
                    rows = jnp.where(valid, idx[:, i], ct[t].shape[0])  # out of bounds: dropped
                    ct[t] = ct[t].at[rows].add(_masked(valid, x_ct), mode="drop")
                return ct, jax.tree_util.tree_map(jnp.add, p_acc, p_ct)

            p0 = jax.tree_util.tree_map(jnp.zeros_like, p)
            ct, p_ct = lax.fori_loop(0, pieces(aux), body, (dict(cts[0]), p0))
            return p_ct, ct, None, None

        group.defvjp(group_fwd, group_bwd)
        return group

    def _split(self, arenas: dict) -> tuple[dict, dict]:
        """``arenas`` as (float arenas, other arenas)."""
        return ({t: a for t, a in arenas.items() if t in self.float_types},
                {t: a for t, a in arenas.items() if t not in self.float_types})

    def _plans(self, layout: Any, lparams: Any, key: Any, float_types: Any) -> dict:
        """Per loop operation (by position in ``layout.loop_ops``), the ``vjp`` leaves its
        forward items save (see ``_saved_leaves``); empty unless the batch saves (its layout has
        ``saved_rows``)."""
        if not layout.saved_rows:
            return {}
        rng = None if key is None else jax.eval_shape(lambda k: _fold(k, _LOOP_STREAM, 0), key)
        plans = {}
        for q, o in enumerate(layout.loop_ops):
            op = self.ops[o]
            if not (layout.saved_rows[q] and op.out_slots):  # no buffer: nothing to trace for
                continue
            saved = self._saved_leaves(op, _abstract(self._params_for(op, lparams)), rng, float_types,
                                       item_sizes(layout.chunk))
            if saved:
                plans[q] = saved
        return plans

    def _saved_start(self, arrays: dict, layout: Any, i: Any, q: int) -> Any:
        """Where item ``i`` keeps its saved leaves in the buffers of loop operation ``q``: the
        schedule lays that operation's items out one after another (``layout.saved_rows[q]`` rows
        in all), each writing ``C`` rows from where the previous one's padded rows end, so a padded
        tail only ever lands on rows a later item writes. Items of other operations write to the
        ``C`` dump rows past the end."""
        mine = arrays["items_branch"][i] // len(item_sizes(layout.chunk)) == q
        return jnp.where(mine, arrays["items_saved"][i], layout.saved_rows[q])

    def _forward_branches(self, layout: Any, k_out: dict, plans: dict, float_types: Any) -> list:
        C = layout.chunk
        branches = []
        for q, o in enumerate(layout.loop_ops):
            op = self.ops[o]
            for size in item_sizes(layout.chunk):
                def branch(lparams, rng, arenas, in_idx, first, count, op=op, q=q, size=size):
                    xs, _, _ = self._gather_inputs(op, arenas, in_idx, first, count, size)
                    saved = {r: [jnp.zeros((C, *shape), dtype) for _, shape, dtype in leaves]
                             for r, leaves in plans.items()}
                    if q in plans:
                        ys, vjp, _ = self._vjp(op, self._params_for(op, lparams), rng, xs, float_types, True)
                        ys = _check(op, ys)
                        leaves = jax.tree_util.tree_leaves(vjp)
                        saved[q] = [s.at[:size].set(leaves[j]) for s, (j, _, _) in zip(saved[q], plans[q])]
                    else:
                        ys = self._call(op, lparams, rng, xs)
                    out = {t: jnp.zeros((k, C, *self.types[t].shape), self.types[t].dtype)
                           for t, k in k_out.items()}
                    for y, (t, k) in zip(ys, op.out_slots):
                        out[t] = out[t].at[k, :size].set(y)
                    return out, saved
                branches.append(branch)
        return branches

    def _forward_loop(self, lparams: Any, arenas: dict, arrays: dict, layout: Any, key: Any,
                      plans: dict) -> tuple[dict, dict]:
        """The arenas after the loop, and the ``vjp`` leaves saved for ``plans``' operations."""
        k_out = self._slots(layout.loop_ops, "out_slots")
        branches = self._forward_branches(layout, k_out, plans, self.float_types)
        slot_index = self.model.slot_index
        saved0 = {q: [jnp.zeros((layout.saved_rows[q] + layout.chunk, *shape), dtype)
                      for _, shape, dtype in leaves] for q, leaves in plans.items()}

        def body(state):
            i, arenas, saved = state
            chunks, saved_chunks = lax.switch(arrays["items_branch"][i], branches, lparams,
                                              _fold(key, _LOOP_STREAM, i), arenas, arrays["in_idx"],
                                              arrays["items_node"][i], arrays["items_count"][i])
            arenas, saved = dict(arenas), dict(saved)
            for t, k_max in k_out.items():
                for k in range(k_max):
                    arenas[t] = _write_at(arenas[t], chunks[t][k], arrays["items_out"][i, slot_index[(t, k)]])
            for q in saved:
                start = self._saved_start(arrays, layout, i, q)
                saved[q] = [_write_at(b, c, start) for b, c in zip(saved[q], saved_chunks[q])]
            return i + 1, arenas, saved

        _, arenas, saved = lax.while_loop(lambda s: s[0] < arrays["n_items"], body,
                                          (jnp.int32(0), arenas, saved0))
        return arenas, saved

    # ------------------------------------------------------------ backward
    def _backward_branches(self, layout: Any, k_in: dict, float_types: list, plans: dict) -> list:
        C = layout.chunk
        dump = layout.arena_rows  # per type, the first row past its arena's real rows
        branches = []
        for q, o in enumerate(layout.loop_ops):
            op = self.ops[o]
            for size in item_sizes(layout.chunk):
                def branch(lparams, rng, arenas, in_idx, first, count, ct_chunks, saved, op=op, q=q, size=size):
                    xs, idx, valid = self._gather_inputs(op, arenas, in_idx, first, count, size)

                    def rows_mask(x):
                        return valid.reshape((size,) + (1,) * (x.ndim - 1))

                    p = self._params_for(op, lparams)
                    _, vjp, diff = self._vjp(op, p, rng, xs, float_types, q in plans)
                    if q in plans:
                        # The saved leaves replace their recomputation, which XLA then drops.
                        # Padded rows take the first row's, as in the forward loop (the buffer
                        # holds those or a later item's rows there).
                        leaves, tree = jax.tree_util.tree_flatten(vjp)
                        for (j, _, _), s in zip(plans[q], saved[q]):
                            rows = s[:size]
                            leaves[j] = jnp.where(rows_mask(rows), rows, rows[:1])
                        vjp = jax.tree_util.tree_unflatten(tree, leaves)
                    cts = []
                    for t, k in op.out_slots:
                        if t in float_types:
                            ct = ct_chunks[t][k, :size]
                            cts.append(jnp.where(rows_mask(ct), ct, jnp.zeros((), ct.dtype)))
                        else:
                            cts.append(np.zeros((size, *self.types[t].shape), jax.dtypes.float0))
                    p_ct, *x_cts = vjp(cts)
                    in_cts = {t: jnp.zeros((k, C, *self.types[t].shape), self.types[t].dtype)
                              for t, k in k_in.items()}
                    in_rows = {t: jnp.full((k, C), dump[t], jnp.int32) for t, k in k_in.items()}
                    for i, x_ct in zip(diff, x_cts):
                        t, k = op.in_slots[i]
                        in_cts[t] = in_cts[t].at[k, :size].set(jnp.where(rows_mask(x_ct), x_ct,
                                                                         jnp.zeros((), x_ct.dtype)))
                        in_rows[t] = in_rows[t].at[k, :size].set(jnp.where(valid, idx[:, i], dump[t]))
                    p_full = {name: jax.tree_util.tree_map(jnp.zeros_like, v) for name, v in lparams.items()}
                    if op.layer is not None:
                        p_full[op.layer.name] = p_ct
                    return ({t: v.reshape((-1, *v.shape[2:])) for t, v in in_cts.items()},
                            {t: v.reshape(-1) for t, v in in_rows.items()}, p_full)
                branches.append(branch)
        return branches

    def _backward_loop(self, lparams: Any, arenas: dict, ct: dict, arrays: dict, layout: Any, key: Any,
                       plans: dict, saved: dict) -> tuple:
        float_types = sorted(ct)
        k_out = self._slots(layout.loop_ops, "out_slots")
        k_in = {t: k for t, k in self._slots(layout.loop_ops, "in_slots").items() if t in float_types}
        branches = self._backward_branches(layout, k_in, float_types, plans)
        slot_index = self.model.slot_index
        C = layout.chunk

        def body(state):
            i, ct, p_acc = state
            ct_chunks = {}
            for t, k_max in k_out.items():
                if t not in float_types:
                    continue
                shape = self.types[t].shape
                ct_chunks[t] = jnp.stack([
                    lax.dynamic_slice(ct[t], (arrays["items_out"][i, slot_index[(t, k)]], *(_I0,) * len(shape)),
                                      (C, *shape))
                    for k in range(k_max)])
            saved_chunks = {}
            for q in saved:
                start = self._saved_start(arrays, layout, i, q)
                saved_chunks[q] = [lax.dynamic_slice_in_dim(b, start, C) for b in saved[q]]
            in_cts, in_rows, p_ct = lax.switch(
                arrays["items_branch"][i], branches, lparams, _fold(key, _LOOP_STREAM, i), arenas, arrays["in_idx"],
                arrays["items_node"][i], arrays["items_count"][i], ct_chunks, saved_chunks)
            ct = dict(ct)
            for t in in_cts:
                ct[t] = ct[t].at[in_rows[t]].add(in_cts[t])
            p_acc = jax.tree_util.tree_map(jnp.add, p_acc, p_ct)
            return i - 1, ct, p_acc

        p0 = jax.tree_util.tree_map(jnp.zeros_like, lparams)
        _, ct, p_acc = lax.while_loop(lambda s: s[0] >= 0, body, (arrays["n_items"] - 1, ct, p0))
        return p_acc, ct

    def _make_loop(self, layout: Any):
        float_ids = self.float_types
        int_ids = [t for t in range(len(self.types)) if t not in float_ids]

        def join(f: dict, i: dict) -> dict:
            return {**f, **i}

        def forward(lparams, f_arenas, i_arenas, arrays, plans):
            out, saved = self._forward_loop(lparams, join(f_arenas, i_arenas), arrays, layout, arrays["key"], plans)
            return ({t: out[t] for t in float_ids}, {t: out[t] for t in int_ids}), saved

        # ``key`` rides in ``arrays`` (non-differentiable); None means deterministic.
        @jax.custom_vjp
        def loop(lparams, f_arenas, i_arenas, arrays):
            return forward(lparams, f_arenas, i_arenas, arrays, {})[0]

        def loop_fwd(lparams, f_arenas, i_arenas, arrays):
            out, saved = forward(lparams, f_arenas, i_arenas, arrays,
                                 self._plans(layout, lparams, arrays["key"], float_ids))
            return out, (lparams, out, arrays, saved)

        def loop_bwd(res, cts):
            lparams, (f_out, i_out), arrays, saved = res
            ct_f, _ = cts
            plans = self._plans(layout, lparams, arrays["key"], float_ids)
            p_ct, ct = self._backward_loop(lparams, join(f_out, i_out), dict(ct_f), arrays, layout, arrays["key"],
                                           plans, saved)
            return p_ct, ct, None, None

        loop.defvjp(loop_fwd, loop_bwd)

        def run(lparams, arenas, arrays, key):
            f_out, i_out = loop(lparams, {t: arenas[t] for t in float_ids},
                                {t: arenas[t] for t in int_ids}, {**arrays, "key": key})
            return join(f_out, i_out)

        return run

    # ------------------------------------------------------------------ run
    def arenas(self, params: Any, batch: Any, key: Any = None) -> dict:
        """All arenas after running ``batch`` (pure; differentiable in ``params``).

        ``key`` seeds stochastic layers; None runs them deterministically.
        """
        arrays = jax.tree_util.tree_map(jnp.asarray, batch.arrays)
        layout = batch.layout
        params = self.model.prepare_params(params)
        arenas = self.initial_arenas(arrays, layout)
        in_idx = arrays["in_idx"]
        arenas = self.run_groups(params, arenas, in_idx, arrays["hoist"], layout.hoist_ops, layout.hoist_sizes,
                                 key, _HOIST_STREAM, layout.chunk)
        if layout.loop_ops:
            names = sorted({self.ops[o].layer.name for o in layout.loop_ops if self.ops[o].layer is not None})
            lparams = {name: params[name] for name in names}
            loop_arrays = {k: arrays[k] for k in _LOOP_ARRAYS}
            arenas = self._make_loop(layout)(lparams, arenas, loop_arrays, key)
        return self.run_groups(params, arenas, in_idx, arrays["tail"], layout.tail_ops, layout.tail_sizes, key,
                               _TAIL_STREAM, layout.chunk)


def _piece_rows(size: int, chunk: int) -> int:
    """Rows per piece of a group of ``size`` rows whose backward runs in pieces: at most
    ``_PIECES`` pieces, none smaller than ``chunk`` unless the group is."""
    return size // min(_PIECES, max(1, size // chunk))


def _masked(valid: jax.Array, x: jax.Array) -> jax.Array:
    """``x`` with the rows where ``valid`` is False set to zero."""
    return jnp.where(valid.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))


def _write_rows(arenas: dict, op: Any, ys: list, aux: dict) -> dict:
    """``arenas`` with ``op``'s outputs ``ys`` written to rows ``aux["dest"]`` (one array per
    output; out-of-bounds rows are dropped) and zeros on padded rows."""
    arenas = dict(arenas)
    for y, (t, _), dest in zip(ys, op.out_slots, aux["dest"]):
        arenas[t] = arenas[t].at[dest].set(_masked(aux["valid"], y), mode="drop")
    return arenas


def _write_at(buffer: jax.Array, chunk: jax.Array, start: Any) -> jax.Array:
    """``buffer`` with ``chunk`` written from row ``start`` on (in place inside the loop)."""
    return lax.dynamic_update_slice(buffer, chunk, (start, *(_I0,) * (buffer.ndim - 1)))


def _check(op: Any, ys: list) -> list:
    """``op``'s results ``ys``, checked against its declared types."""
    for y, t in zip(ys, op.spec.out_types):
        if y.shape[1:] != t.shape or y.dtype != t.dtype:
            raise TypeError(
                f"{op.spec.label} returned {y.dtype}{list(y.shape[1:])} but its type is {t}: were the "
                "params made by compiler.init (same dtypes and shapes)?"
            )
    return ys


def _abstract(tree: Any) -> Any:
    """``tree`` with its arrays (or tracers) replaced by their shapes and dtypes."""
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _fold(key: Any, stream: int, i: Any) -> Any:
    """The key of call ``i`` of ``stream``, or None when running deterministically."""
    if key is None:
        return None
    return jax.random.fold_in(jax.random.fold_in(key, stream), i)
