"""``Generator``: runs a decoder (``SequenceDecoder``, ``TreeDecoder``) on the device.

The decoder's parts become functions of batched arrays (``fold/generation/device.py``); its
``decode`` then decides every example's structure together in one ``lax.while_loop``, with no
host round trip per token or node: it runs under ``jit`` on CPU, GPU and TPU alike.
``generate`` pads the rows to a row count it has compiled for when one is at most ``REUSE`` times
the power of two the batch needs, else to a new count at least ``REUSE`` times the largest below
it: compiled counts are ``REUSE`` times apart, so a stream of batches of any sizes up to 512
compiles at most 4 times (8, 32, 128, 512 at worst), and a fixed batch size once.

Examples:
    >>> import fold as fd, jax, jax.numpy as jnp
    >>> emb = fd.Embedding(5, 4, name="emb")
    >>> step = fd.Record((fd.Identity(), emb)) >> fd.Function(lambda s, e: jnp.tanh(s + e))
    >>> decoder = fd.SequenceDecoder(step, fd.FC(5, activation=None, name="out"), end_token=0, max_length=6)
    >>> generator = fd.Generator(decoder, state_type=fd.TensorType((4,)))
    >>> params = generator.init(jax.random.key(0))
    >>> out = generator.generate(params, jnp.ones((3, 4)), key=jax.random.key(1))
    >>> out.tokens.shape, len(out.sequences())
    ((3, 6), 3)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from fold.blocks.types import TensorType, TupleType, Type, TypeLike, convert_to_type
from fold.compiler.params import LayerParams, is_key
from fold.generation.decoder import Generation
from fold.generation.device import DeviceFunction, device_function, device_layers
from fold.generation.sequence import SequenceDecoder
from fold.generation.tree import TreeDecoder
from fold.scheduler.schedule import next_pow2
from fold.typing import Params, PyTree

__all__ = ["Generator", "MIN_ROWS", "REUSE"]

# The fewest rows a generation runs: smaller batches pad to it, so batches of 1 to 8 share a compilation.
MIN_ROWS = 8
# A compiled row count serves a batch whose power of two is at least a REUSE-th of it: padded rows
# cost compute (each loop iteration computes every row), a new compilation seconds.
REUSE = 4


def _type_of(start: PyTree) -> Type:
    """The fold type of one row of ``start`` (arrays with a leading row axis, tuples of them)."""
    if isinstance(start, (tuple, list)):
        return TupleType(*[_type_of(s) for s in start])
    a = start if hasattr(start, "shape") else jnp.asarray(start)
    if a.ndim == 0:
        raise TypeError("a start state must have a leading axis of rows (one per example), got a scalar")
    return TensorType(a.shape[1:], a.dtype)


class Generator:
    """Generates with ``decoder`` on the device (see the module docstring).

    Args:
      decoder: a ``fd.SequenceDecoder`` or ``fd.TreeDecoder``. It may also be part of a compiled
        model: both use one set of parameters (keyed by layer name).
      state_type: the start state's type, where nothing else sets it (a compiled model using
        ``decoder`` does; else the first start states given do).
    """

    def __init__(self, decoder: SequenceDecoder | TreeDecoder, state_type: TypeLike | None = None):
        if not isinstance(decoder, (SequenceDecoder, TreeDecoder)):
            raise TypeError(f"Generator needs a fd.SequenceDecoder or fd.TreeDecoder, got {decoder!r}")
        self.decoder = decoder
        if state_type is not None:
            self._set_state_type(convert_to_type(state_type))
        if decoder.state_type is not None:
            self._functions()  # errors in the blocks surface here, not at the first generate
        self._generate = jax.jit(self._decode, static_argnames="states", donate_argnames="scratch")
        self._scratch: dict[int, PyTree] = {}  # per padded row count, the decoder's scratch buffers
        self._row_counts: list[int] = []  # the row counts ``generate`` compiled for, ascending

    def _row_count(self, rows: int) -> int:
        """The rows ``generate`` runs ``rows`` examples on (see ``generate``): a compiled count at
        most ``REUSE`` times the power of two they need, else a new one, at least ``REUSE`` times
        the largest compiled below it. Compiled counts are then at least ``REUSE`` times apart,
        so sizes up to ``MIN_ROWS * REUSE ** 3`` (512) never compile more than 4 times."""
        need = max(MIN_ROWS, next_pow2(rows))
        fits = [n for n in self._row_counts if need <= n <= REUSE * need]
        if fits:
            return fits[0]
        below = [n for n in self._row_counts if n < need]
        size = max(need, REUSE * below[-1]) if below else need
        self._row_counts = sorted([*self._row_counts, size])
        return size

    def _set_state_type(self, state: Type) -> None:
        d = self.decoder
        if d.state_type is None:
            d.set_state_type(state)
        elif d.state_type != state:
            raise TypeError(f"Generator: start states of type {state} given to {d!r}, whose start state is "
                            f"{d.state_type}")

    def _functions(self) -> dict[str, DeviceFunction]:
        """The decoder's parts as functions of batched arrays."""
        d = self.decoder
        if d.state_type is None:
            raise TypeError(f"Generator: the start state type of {d!r} is not known: pass state_type= or a start "
                            "state")
        return {name: device_function(block, t, f"{d!r}'s {name}") for name, (block, t) in d.device_parts().items()}

    def init(self, key: jax.Array) -> Params:
        """Parameters for the decoder's layers (a compiled model using the decoder makes the same
        keys; use one set for both)."""
        if not is_key(key):
            raise TypeError(f"init needs a PRNG key such as jax.random.key(0), got {key!r}")
        self._functions()
        layers = {name: lt for block, _ in self.decoder.device_parts().values()
                  for name, lt in device_layers(block).items()}
        return LayerParams(layers, {name: name for name in layers}).init(key)

    def apply(self, params: Params, start: PyTree, key: jax.Array | None = None, *,
              states: bool = True) -> Generation:
        """Generates from ``start`` (one row per example), greedy without ``key``, with every
        node's (step's) state if ``states``: pure and jittable, one compilation per row count
        (``generate`` pads rows to bound them)."""
        out, _ = self._decode(params, start, key, jax.tree_util.tree_leaves(start)[0].shape[0], None, states=states)
        return out

    def _decode(self, params: Params, start: PyTree, key: jax.Array | None, examples: jax.Array | int,
                scratch: PyTree, states: bool) -> tuple[Generation, PyTree]:
        self._set_state_type(_type_of(start))
        start = jax.tree_util.tree_map(jnp.asarray, start)  # NumPy start states given to apply
        return self.decoder.decode(self._functions(), params, start, key, jnp.asarray(examples, jnp.int32),
                                   states, scratch)

    def generate(self, params: Params, start: PyTree, key: jax.Array | None = None, *,
                 states: bool = True) -> Generation:
        """``apply``, jitted, its rows padded to a row count compiled before if one is at most
        ``REUSE`` times the power of two they need (at least ``MIN_ROWS``), else to a new count
        (see the module docstring): batches of any sizes up to 512 compile at most 4 times. The
        padded rows repeat the first example, generate nothing and are dropped from the result.

        The decoder's scratch buffers (a tree decoder's per-node states: rows x ``max_nodes``
        rows per state leaf) are kept from one call to the next, one set per row count compiled
        for (at most 4), so a call neither allocates nor clears them; ``states=False`` leaves out
        the per-node states, the one output as large as they are."""
        if key is not None and not is_key(key):
            raise TypeError(f"generate's key must be a PRNG key such as jax.random.key(0) or None, got {key!r}")
        leaves = jax.tree_util.tree_leaves(start)
        if not leaves:
            raise TypeError("generate needs a start state: arrays with one row per example")
        rows = leaves[0].shape[0]
        if rows == 0 or any(leaf.shape[:1] != (rows,) for leaf in leaves):
            raise ValueError(f"generate: every array of the start state needs the same, non-zero number of rows; "
                             f"got {[tuple(leaf.shape) for leaf in leaves]}")
        padded = self._row_count(rows)
        # One transfer (or one jitted padding) for all arrays: an op per array was most of a
        # batch of 1's time.
        start = jax.device_put(start) if padded == rows else _repeat_first_row(start, padded)
        # Taken out while in use: a call from another thread meanwhile makes its own.
        scratch = self._scratch.pop(padded, None)
        if scratch is None:
            scratch = self.decoder.scratch(start)
        out: Generation
        out, self._scratch[padded] = self._generate(params, start, key, rows, scratch, states=states)
        return out if padded == rows else type(out)(*_first_rows(tuple(out), rows))


@functools.partial(jax.jit, static_argnums=1)
def _repeat_first_row(start: PyTree, rows: int) -> PyTree:
    """``start`` padded to ``rows`` rows with copies of its first."""
    return jax.tree_util.tree_map(lambda a: jnp.concatenate([a, jnp.repeat(a[:1], rows - a.shape[0], 0)]), start)


@functools.partial(jax.jit, static_argnums=1)
def _first_rows(tree: PyTree, rows: int) -> PyTree:
    """The first ``rows`` rows of every array of ``tree``."""
    return jax.tree_util.tree_map(lambda a: a[:rows], tree)
