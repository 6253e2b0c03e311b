"""Quick start: a recursive network that learns to add up the numbers in a tree.

Every example is a differently shaped binary tree such as ``(1.5, (0.3, -2.0))``.
A leaf is embedded by a small dense layer; an inner node combines its two
children with another one, recursively; a linear read-out predicts the sum
of the leaves. fold batches all trees of a batch together, depth by depth,
inside one jitted loop.

Run: ``python -m examples.quickstart`` from the repository root, as every example (a few seconds on a laptop CPU).
"""

from __future__ import annotations

import argparse
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd


def random_tree(rng: random.Random, leaves: int):
    """A random binary tree with ``leaves`` leaves, each a float in [-1, 1]."""
    if leaves == 1:
        return round(rng.uniform(-1, 1), 3)
    left = rng.randint(1, leaves - 1)
    return (random_tree(rng, left), random_tree(rng, leaves - left))


def tree_sum(tree) -> float:
    return tree if not isinstance(tree, tuple) else tree_sum(tree[0]) + tree_sum(tree[1])


def build_model(hidden: int = 32) -> fd.Block:
    """(tree, target) -> squared error, reported as the 'loss' metric."""
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((hidden,)))
    leaf = fd.InputTransform(lambda x: [x]) >> fd.Vector(1) >> fd.FC(hidden, activation=jnp.tanh)
    inner = fd.Record((node(), node())) >> fd.Concat() >> fd.FC(hidden, activation=jnp.tanh)
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))
    predict = node() >> fd.FC(1, activation=None)
    error = fd.Function(lambda y, t: (y[:, 0] - t) ** 2)
    return fd.Record((predict, fd.Scalar())) >> error >> fd.Metric("loss")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32, help="trees per batch")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the parameters")
    parser.add_argument("--quick", action="store_true", help="100 steps (what the tests run): the loss still falls")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 100)
    if args.steps < 1 or args.batch_size < 1 or args.seed < 0:
        parser.error(f"need --steps and --batch-size >= 1 and --seed >= 0, got {args.steps}, {args.batch_size}, "
                     f"{args.seed}")

    rng = random.Random(args.seed)
    trees = [random_tree(rng, rng.randint(1, 12)) for _ in range(2000)]
    data = [(t, tree_sum(t)) for t in trees]

    # Small batches of small trees: 32-row loop items waste less and compile faster.
    compiler = fd.Compiler.create(build_model(), chunk_size=32)
    params = compiler.init(jax.random.key(args.seed))
    optimizer = optax.adam(3e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        def loss_fn(p):
            return compiler.apply(p, batch).metrics["loss"].mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step, window, windows, sizes = 0, [], [], set()
    start = time.perf_counter()
    while step < args.steps:
        for batch in compiler.batches(data, args.batch_size, shuffle=True, seed=args.seed + step,
                                      drop_remainder=True):
            if batch.layout not in sizes:
                sizes.add(batch.layout)
                print(f"compiling for size class {batch.layout.size_class} ...", flush=True)
            params, opt_state, loss = train_step(params, opt_state, batch)
            window.append(float(loss))
            step += 1
            if step % 50 == 0:
                windows.append(sum(window) / len(window))
                print(f"step {step:4d}  loss {windows[-1]:.4f}", flush=True)
                window = []
            if step >= args.steps:
                break
    print(f"{step} steps in {time.perf_counter() - start:.1f} s, {len(sizes)} compilation(s)")

    test = [(t, tree_sum(t)) for t in (random_tree(rng, n) for n in (1, 4, 9))]
    errors = jax.jit(compiler.apply)(params, compiler.build_batch(test)).metrics["loss"].values
    for (tree, target), error in zip(test, errors):
        print(f"sum of {tree}: {target:+.3f}, squared error {float(error):.4f}")
    nan = float("nan")
    return {"first_loss": windows[0] if windows else nan, "last_loss": windows[-1] if windows else nan,
            "test_error": float(np.mean(np.asarray(errors)))}


if __name__ == "__main__":
    main()
