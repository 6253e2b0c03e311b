"""fd.schedule_profile and fd.plot_schedule: groups counted by hand for a small batch, and checked
against what the scheduler itself built (nodes, loop items, saved rows) for random trees."""

from __future__ import annotations

import random

import jax.numpy as jnp
import matplotlib
import pytest

import fold as fd

matplotlib.use("Agg")


def test_a_fold_over_two_sequences_counted_by_hand():
    model = fd.Map(fd.Scalar()) >> fd.Fold(fd.Concat() >> fd.FC(4), fd.Zeros(fd.TensorType((4,)))) >> fd.FC(2)
    compiler = fd.Compiler.create(model)
    groups, chunk = fd.schedule_profile(compiler, [[1.0, 2.0, 3.0, 4.0, 5.0], [6.0]])
    # The fused Concat >> FC step runs at depths 1-5 on 2, 1, 1, 1, 1 rows; the readout FC once per
    # example. (With three elements the step's every call would be within TAIL_DEPTH of the result.)
    cell = [g for g in groups if "Concat" in compiler.program.ops[g.op].spec.label]
    assert [(g.depth, g.rows) for g in cell] == [(1, 2), (2, 1), (3, 1), (4, 1), (5, 1)]
    assert [g.stage for g in cell] == ["hoisted", "loop", "loop", "loop", "loop"]
    readout = [g for g in groups if g not in cell]
    assert [(g.rows, g.stage) for g in readout] == [(2, "tail")]
    # Hoisted and tail groups run on at least 8 rows; loop items of a batch of two at their size.
    assert [g.computed for g in groups] == [8, 1, 1, 1, 1, 8]
    assert chunk == 32


def _tree(rng: random.Random, leaves: int):
    if leaves == 1:
        return rng.random()
    k = rng.randint(1, leaves - 1)
    return (_tree(rng, k), _tree(rng, leaves - k))


@pytest.mark.parametrize("batch_size", [3, 40])
def test_groups_add_up_to_the_batch_the_scheduler_builds(batch_size):
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((8,)))
    leaf = fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.FC(8)
    inner = fd.Record((node(), node())) >> fd.Concat() >> fd.FC(8, activation=jnp.tanh)
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))
    compiler = fd.Compiler.create(node() >> fd.FC(1, activation=None), backward="save")
    rng = random.Random(batch_size)
    examples = [_tree(rng, rng.randint(1, 30)) for _ in range(batch_size)]
    groups, chunk = fd.schedule_profile(compiler, examples)
    batch = compiler.build_batch(examples, exact_layout=True)
    stats = batch.built_stats()
    assert sum(g.rows for g in groups) == stats.num_nodes
    loop = [g for g in groups if g.stage == "loop"]
    assert sum(-(-g.rows // chunk) for g in loop) == stats.num_items
    assert sum(g.computed for g in loop) == sum(stats.saved_rows)  # saving keeps one row per computed row
    assert max(g.depth for g in groups) == stats.max_depth
    assert all(g.rows <= g.computed for g in groups)

    ax = fd.plot_schedule(compiler, examples)
    heights = sum(patch.get_height() for patch in ax.patches)
    assert heights == pytest.approx(sum(g.computed for g in groups))
    assert f"{stats.num_nodes:,} nodes" in ax.get_title()


def test_a_block_in_place_of_the_compiler_is_a_type_error():
    """Both raised AttributeError ("'Pipe' object has no attribute 'build_batch'")."""
    model = fd.Map(fd.Scalar()) >> fd.Sum()
    for call in (fd.schedule_profile, fd.plot_schedule):
        with pytest.raises(TypeError, match=f"^{call.__name__} takes a Compiler \\(fd.Compiler.create\\(model\\)\\), "
                                            "got Pipe$"):
            call(model, [[1.0]])


def test_the_plot_names_layers_and_says_which_depths_it_leaves_out():
    """The legend said ``Function(FC)`` for every layer, and depths without work vanished from the
    x axis without a word."""
    model = fd.Map(fd.Scalar()) >> fd.Fold(fd.Concat() >> fd.FC(4), fd.Zeros(fd.TensorType((4,)))) >> fd.FC(2)
    compiler = fd.Compiler.create(model)
    examples = [[1.0, 2.0, 3.0, 4.0, 5.0], [6.0]]
    groups, _ = fd.schedule_profile(compiler, examples)
    shown = {g.depth for g in groups}
    missing = sorted(set(range(1, max(shown) + 1)) - shown)
    assert missing  # its tail runs after depths that hold no operation
    ax = fd.plot_schedule(compiler, examples)
    assert f"depths {', '.join(map(str, missing))} run nothing and are left out" in ax.get_xlabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    layers = [layer for layer, _ in compiler.program.layers.values()]
    assert {f"{type(layer).__name__} {layer.name!r}" for layer in layers} <= {t.partition(": ")[2] for t in legend}
    assert not any("Function(FC)" in t for t in legend)
