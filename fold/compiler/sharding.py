"""Data parallelism: one step's examples split over the devices of a mesh, one layout for all.

``Compiler.batches(..., devices=...)`` and ``build_batch(..., devices=...)`` build a
``ShardedBatch``: the examples are recorded once, split into one part per device balanced by
*node count* (longest first, each to the lightest part: a device with the deep trees does not
hold the others up), each part is built into a batch, and the parts are padded into one shared
layout and stacked on a leading device axis, so that one compilation serves every device.
``Compiler.apply`` runs a ``ShardedBatch`` under ``shard_map``: parameters replicated, each device
running the loop over its own part; outputs come back one row per example in the order given,
and metrics as one ``MetricValues`` over every device's entries (real entries first, by example,
as from one device), so ``metrics[name].mean()`` is the mean over the whole step.
Differentiating a loss of them gives the gradient of the whole step: ``shard_map`` sums the
replicated parameters' cotangents over the devices with a collective, inside the jitted step.

Several processes (``jax.distributed.initialize``, a mesh over every process's devices): each
process passes *its own* examples, builds the parts of its own devices only, and the processes
agree on the shared layout by exchanging their parts' layouts (``process_allgather``: a few
hundred bytes per step). The global arrays are assembled from each process's parts with
``jax.make_array_from_process_local_data``. Outputs and metrics are then global arrays, the
examples of process 0 first; a loss reduced to a scalar is what every process can read.

With a PRNG key (dropout), device ``d`` uses ``fold_in(key, d)``: draws differ from a
single-device run of the same examples.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Sequence
from typing import TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fold.compiler.result import MetricValues, Outputs, Result
from fold.scheduler.batch import Batch, BatchArrays, BatchLayout
from fold.scheduler.layouts import TypeShape, empty, fits, join, pad_to
from fold.scheduler.schedule import next_pow2
from fold.typing import Params, PyTree

__all__ = ["AXIS", "Devices", "ShardedBatch", "SharedLayouts", "device_mesh", "partition"]

Devices: TypeAlias = "int | Mesh | Sequence[jax.Device]"
"""What a sharded batch is spread over: a device count, a list of devices or a ``Mesh``."""

_Static: TypeAlias = "tuple[BatchLayout, str | None, Mesh, str]"
"""A sharded batch's static part: its layout, owner, mesh and axis."""

_Parts: TypeAlias = "tuple[Outputs, dict[str, MetricValues]]"
"""What each device's part of a step returns: its outputs and metrics."""

# The mesh axis a ``ShardedBatch`` is split over when the caller gives a device count.
AXIS = "data"


def device_mesh(devices: Devices, axis: str = AXIS) -> Mesh:
    """A one-axis mesh named ``axis``: over the first ``devices`` devices (an int), over the
    given devices, or ``devices`` itself (a ``Mesh``, which must have the axis)."""
    if isinstance(devices, Mesh):
        if axis not in devices.axis_names:
            raise ValueError(f"the mesh has axes {devices.axis_names}, not {axis!r}; pass axis=one of them")
        return devices
    if isinstance(devices, bool):
        raise TypeError("devices must be a device count, a list of devices or a Mesh, not a bool")
    if isinstance(devices, (int, np.integer)):
        if devices < 1:
            raise ValueError(f"devices must be a device count >= 1, got {devices}")
        if devices > jax.device_count():
            raise ValueError(f"devices={devices}, but there are {jax.device_count()} devices "
                             "(on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)")
        return Mesh(np.asarray(jax.devices()[:devices]), (axis,))
    listed = list(devices)
    if not listed:
        raise ValueError("devices is empty")
    if not all(isinstance(d, jax.Device) for d in listed):
        raise TypeError(f"devices must be a device count, a list of jax devices or a Mesh, got {devices!r}")
    repeated = sorted({str(d) for d in listed if listed.count(d) > 1})
    if repeated:
        raise ValueError(f"devices lists {', '.join(repeated)} more than once: a batch's parts go to distinct devices")
    return Mesh(np.asarray(listed), (axis,))


def partition(costs: np.ndarray, parts: int) -> list[np.ndarray]:
    """Splits examples of the given costs into ``parts`` lists of indices with near-equal total
    cost: the costliest example first, each to the part with the least so far (each part's
    indices sorted). A part may be empty when there are fewer examples than parts."""
    loads = np.zeros(parts)
    members: list[list[int]] = [[] for _ in range(parts)]
    for i in np.argsort(-np.asarray(costs), kind="stable"):
        p = int(np.argmin(loads))
        members[p].append(int(i))
        loads[p] += costs[i]
    return [np.sort(np.asarray(m, np.int64)) for m in members]


def _with_examples(batch: Batch, num_examples: int) -> Batch:
    """``batch`` with room for ``num_examples`` examples: the extra roots read row 0, and their
    outputs are dropped (``ShardedBatch.positions`` never selects them)."""
    have = batch.layout.num_examples
    if have == num_examples:
        return batch
    roots = [np.concatenate([r, np.zeros(num_examples - have, r.dtype)]) for r in batch.arrays.roots]
    return batch.replace(batch.arrays._replace(roots=roots), batch.layout._replace(num_examples=num_examples))


def _without_saving(parts: list[Batch]) -> list[Batch]:
    return [p.replace(layout=p.layout._replace(saved_rows=())) for p in parts]


class SharedLayouts:
    """The layouts handed out to sharded batches of one compiler: a step's parts are padded into
    the cheapest earlier layout they all fit, or into a new one with headroom (as
    ``LayoutPolicy`` does for single batches), so a stream compiles a handful of times."""

    def __init__(self, type_shapes: Sequence[TypeShape]):
        self.type_shapes = type_shapes
        self.layouts: list[BatchLayout] = []

    def choose(self, need: BatchLayout) -> BatchLayout:
        fitting = [layout for layout in self.layouts if fits(need, layout)]
        if fitting:
            return min(fitting, key=lambda layout: (layout.size_class, sum(layout.arena_rows)))
        family = [layout for layout in self.layouts if (layout.num_examples, layout.chunk, bool(layout.saved_rows))
                  == (need.num_examples, need.chunk, bool(need.saved_rows))]
        base = family[-1] if family else empty(need)
        layout = join(base, need, headroom=True)
        self.layouts.append(layout)
        return layout

    def pad(self, parts: list[Batch], gather: Callable[[BatchLayout], list[BatchLayout]]) -> list[Batch]:
        """``parts`` padded into one layout; ``gather(layout)`` returns every process's need (the
        local need alone in one process), so that all processes choose the same layout."""
        # One part, here or in another process, that does not save makes them all recompute, so
        # that they share a layout.
        parts = _without_saving(parts) if not all(p.layout.saved_rows for p in parts) else parts
        examples = next_pow2(max(p.layout.num_examples for p in parts))
        parts = [_with_examples(p, examples) for p in parts]
        needs = gather(functools.reduce(join, [p.layout for p in parts]))
        if not all(n.saved_rows for n in needs):
            parts = _without_saving(parts)
            needs = [n._replace(saved_rows=()) for n in needs]
        examples = max(n.num_examples for n in needs)
        needs = [n._replace(num_examples=examples) for n in needs]
        parts = [_with_examples(p, examples) for p in parts]
        need = functools.reduce(join, needs)
        layout = self.choose(need)
        return [pad_to(p, layout, self.type_shapes) for p in parts]


def gather_layouts(need: BatchLayout) -> list[BatchLayout]:
    """Every process's ``need``, in process order (a collective: every process must call it)."""
    if jax.process_count() == 1:
        return [need]
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(tuple(need)), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(data)], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:len(data)] = data
    everyone = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [BatchLayout(*pickle.loads(row[:n].tobytes())) for row, n in zip(everyone, sizes)]


def gather_positions(local: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Every process's ``local`` positions (``counts[p]`` of them), concatenated in process order."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    padded = np.full(int(counts.max()), -1, np.int32)
    padded[:len(local)] = local
    everyone = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(counts), -1)
    return np.concatenate([row[:n] for row, n in zip(everyone, counts)])


def gather_counts(count: int) -> np.ndarray:
    """Every process's ``count``, in process order."""
    if jax.process_count() == 1:
        return np.asarray([count])
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(np.asarray([count], np.int64))).reshape(-1)


@jax.tree_util.register_pytree_node_class
class ShardedBatch:
    """One step's examples split over the devices of ``mesh`` (axis ``axis``), in one layout.

    ``arrays`` are the parts' ``BatchArrays`` stacked on a leading device axis and sharded over
    it; ``example_map[d, r]`` is the position (in the step's examples, all processes' in process
    order) of row ``r`` of device ``d``'s part, -1 for padding; ``positions[i]`` is the flat row
    ``d * B + r`` of example ``i``. Host only: ``example_indices`` (this process's examples'
    positions in what it gave ``batches``), ``parts`` (this process's parts, for ``stats``) and
    ``nodes`` (operation calls per device of this process).
    """

    def __init__(self, arrays: BatchArrays, example_map: jax.Array, positions: jax.Array, layout: BatchLayout,
                 owner: str | None, mesh: Mesh, axis: str):
        self.arrays = arrays
        self.example_map = example_map
        self.positions = positions
        self.layout = layout
        self.owner = owner
        self.mesh = mesh
        self.axis = axis
        self.example_indices: np.ndarray | None = None
        self.parts: list[Batch] = []
        self.nodes: np.ndarray | None = None

    def tree_flatten(self) -> tuple[tuple[BatchArrays, jax.Array, jax.Array], _Static]:
        return (self.arrays, self.example_map, self.positions), (self.layout, self.owner, self.mesh, self.axis)

    @classmethod
    def tree_unflatten(cls, static: _Static, children: tuple[BatchArrays, jax.Array, jax.Array]) -> ShardedBatch:
        arrays, example_map, positions = children
        layout, owner, mesh, axis = static
        return cls(arrays, example_map, positions, layout, owner, mesh, axis)

    def replicate(self, tree: PyTree) -> PyTree:
        """``tree`` (parameters, optimizer state) placed whole on every device of the mesh, as a
        jitted step over sharded batches returns them: give the first step its parameters this
        way, or it compiles once for them as they are and again for the placement it returns."""
        return jax.device_put(tree, NamedSharding(self.mesh, P()))

    @property
    def num_devices(self) -> int:
        return int(self.mesh.shape[self.axis])

    def __repr__(self) -> str:
        nodes = f", nodes per device={self.nodes.tolist()}" if self.nodes is not None else ""
        return f"ShardedBatch(devices={self.num_devices}, examples={len(self.positions)}{nodes})"


def assemble(parts: list[Batch], example_map: np.ndarray, positions: np.ndarray, mesh: Mesh, axis: str,
             owner: str | None) -> ShardedBatch:
    """Stacks this process's padded ``parts`` (one per local device, in mesh order) into global
    arrays sharded over ``axis``; ``example_map`` holds their rows' global positions."""
    sharded = NamedSharding(mesh, P(axis))
    replicated = NamedSharding(mesh, P())
    devices = mesh.shape[axis]

    def global_array(local: np.ndarray) -> jax.Array:
        shape = (devices, *local.shape[1:])
        placed: jax.Array = (jax.device_put(local, sharded) if jax.process_count() == 1
                             else jax.make_array_from_process_local_data(sharded, local, shape))
        return placed

    stacked = jax.tree.map(lambda *xs: global_array(np.stack(xs)), *[p.arrays for p in parts])
    batch = ShardedBatch(stacked, global_array(example_map), jax.device_put(positions, replicated)
                         if jax.process_count() == 1 else _replicated(positions, replicated),
                         parts[0].layout, owner, mesh, axis)
    batch.parts = parts
    return batch


def _replicated(x: np.ndarray, sharding: NamedSharding) -> jax.Array:
    """``x`` (equal on every process) as a global array replicated over the mesh."""
    replicated: jax.Array = jax.make_array_from_process_local_data(sharding, x, x.shape)
    return replicated


def local_devices(mesh: Mesh, axis: str) -> list[int]:
    """Positions along ``axis`` of this process's devices."""
    devices = np.moveaxis(mesh.devices, mesh.axis_names.index(axis), 0).reshape(mesh.shape[axis], -1)[:, 0]
    return [d for d, device in enumerate(devices) if device.process_index == jax.process_index()]


def apply_sharded(apply: Callable[..., Result], params: Params, batch: ShardedBatch,
                  key: jax.Array | None = None) -> Result:
    """``apply`` (the compiler's single-batch apply) on every device's part under ``shard_map``;
    outputs in the step's example order, metrics over every device."""
    axis, layout, owner = batch.axis, batch.layout, batch.owner

    def local(params: Params, arrays: BatchArrays, example_map: jax.Array, key: jax.Array | None) -> _Parts:
        arrays = jax.tree.map(lambda x: x[0], arrays)
        example_map = example_map[0]
        if key is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(axis))
        result = apply(params, Batch(arrays, layout, owner=owner), key)
        metrics = {}
        for name, m in result.metrics.items():
            example = jnp.where(m.example >= 0, example_map[jnp.maximum(m.example, 0)], -1)
            metrics[name] = MetricValues.zero_padded(m.padded, m.mask & (example >= 0), example)
        parts: _Parts = jax.tree.map(lambda x: x[None], (result.outputs, metrics))
        return parts

    if key is None:
        deterministic: Callable[..., _Parts] = jax.shard_map(lambda p, a, e: local(p, a, e, None), mesh=batch.mesh,
                                      in_specs=(P(), P(axis), P(axis)), out_specs=P(axis), check_vma=False)
        outputs, metrics = deterministic(params, batch.arrays, batch.example_map)
    else:
        stochastic = jax.shard_map(local, mesh=batch.mesh, in_specs=(P(), P(axis), P(axis), P()), out_specs=P(axis),
                                   check_vma=False)
        outputs, metrics = stochastic(params, batch.arrays, batch.example_map, key)
    outputs, metrics = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), (outputs, metrics))
    outputs = jax.tree.map(lambda x: x[batch.positions], outputs)
    return Result(outputs, {name: _in_example_order(m) for name, m in metrics.items()})


def _in_example_order(m: MetricValues) -> MetricValues:
    """Every device's entries with the real ones first, by example (an example's entries, all on
    one device, keep their walk order), as ``MetricValues`` promises (``values`` reads them so)."""
    last = jnp.iinfo(m.example.dtype).max
    order = jnp.argsort(jnp.where(m.mask, m.example, last), stable=True)
    return MetricValues(m.padded[order], m.mask[order], m.example[order])
