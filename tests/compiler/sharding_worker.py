"""Runs one data-parallel check in a process of its own (device counts are fixed when JAX starts):
``python -m tests.compiler.sharding_worker DEVICES [PROCESS_ID NUM_PROCESSES PORT [--die]]``.

It trains a recursive model for 4 SGD steps on sharded batches and on single-device batches of
the same examples and prints one JSON line: the largest differences of outputs, metrics,
gradients and parameters, the nodes per device and the compilations. With a process id, it
joins a ``jax.distributed`` run over the loopback address first (CPU collectives by gloo), and
passes only its own share of each step's examples; ``--die`` makes process 1 exit in the middle.
"""

from __future__ import annotations

import json
import os
import random
import sys


def tree_model(width: int):
    """A recursive net over trees of numbers (a number or a pair of trees), outputs of 2 entries,
    and their summed sines as the metric ``loss``."""
    import jax.numpy as jnp

    import fold as fd

    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((width,)))
    leaf = fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.FC(width)
    inner = fd.Record((node(), node())) >> fd.Concat() >> fd.FC(width)
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))
    root = fd.Composition()
    with root.scope():
        out = (node() >> fd.FC(2, activation=None)).reads(root.input)
        fd.Metric("loss").reads(fd.Function(lambda y: jnp.sum(jnp.sin(y), -1)).reads(out))
        root.output.reads(out)
    return root


def main(argv: list[str]) -> None:
    devices = int(argv[0])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    import jax

    processes, process_id = 1, 0
    if len(argv) > 1:
        process_id, processes, port = int(argv[1]), int(argv[2]), int(argv[3])
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", processes, process_id, initialization_timeout=60,
                                   heartbeat_timeout_seconds=10)
    import jax.numpy as jnp
    import numpy as np

    import fold as fd
    from benchmarks.models import random_tree

    root = tree_model(8)
    compiler = fd.Compiler.create(root)
    single = fd.Compiler.create(root)
    params = compiler.init(jax.random.key(0))
    rng = random.Random(0)
    # Step 2 holds its largest trees first: split by example count, the first devices would get
    # most of the nodes; split by node count, they even out.
    steps = [[random_tree(rng, rng.randint(1, 12)) for _ in range(16)] for _ in range(3)]
    steps[1] = sorted((random_tree(rng, rng.randint(1, 40)) for _ in range(16)), key=lambda t: -len(str(t)))
    steps.append([random_tree(rng, 5) for _ in range(processes)])  # fewer examples than devices

    def make_step(c):
        def loss(p, batch):
            result = c.apply(p, batch)
            return result.metrics["loss"].mean(), result

        @jax.jit
        def step(p, batch):
            (value, result), grads = jax.value_and_grad(loss, has_aux=True)(p, batch)
            return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), value, grads, result

        return step

    step, single_step = make_step(compiler), make_step(single)

    diffs = {"outputs": 0.0, "metrics": 0.0, "loss": 0.0, "grads": 0.0, "params": 0.0}
    balance, p_sharded, p_single = [], params, params
    for k, examples in enumerate(steps):
        per = len(examples) // processes
        mine = examples[process_id * per:(process_id + 1) * per]
        if processes > 1 and "--die" in argv and process_id == 1 and k == 1:
            os._exit(3)
        sharded = compiler.build_batch(mine, devices=devices * processes)
        balance.append([float(sharded.nodes.max() / sharded.nodes.mean()),
                        float(sharded.nodes.max() - sharded.nodes.mean())])
        p_sharded, value, grads, result = step(p_sharded, sharded)
        p_single, ref_value, ref_grads, ref = single_step(p_single, single.build_batch(examples))
        outputs = np.asarray(jax.experimental.multihost_utils.process_allgather(result.outputs, tiled=True)
                             if processes > 1 else result.outputs)
        values = result.metrics["loss"]
        if processes == 1:  # entries in the single-device order: real ones first, by example
            want = ref.metrics["loss"]
            if not np.array_equal(np.asarray(values.example)[:len(want.values)], np.asarray(want.example)[:len(
                    want.values)]) or len(values.values) != len(want.values):
                raise AssertionError("metric entries are not in the single-device order")
            diffs["metrics"] = max(diffs["metrics"], float(np.abs(np.asarray(values.values - want.values)).max()))
        diffs["outputs"] = max(diffs["outputs"], float(np.abs(outputs - np.asarray(ref.outputs)).max()))
        diffs["loss"] = max(diffs["loss"], abs(float(value) - float(ref_value)))
        diffs["grads"] = max(diffs["grads"], max(float(jnp.abs(a - b).max()) for a, b in
                                                 zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))))
    diffs["params"] = max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p_sharded),
                                                                      jax.tree.leaves(p_single)))
    print(json.dumps({"diffs": diffs, "balance": balance, "layouts": compiler.stats().layouts,
                      "devices": jax.device_count(), "process": process_id}), flush=True)
    if processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
