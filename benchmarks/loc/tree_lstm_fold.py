"""A binary constituency Tree-LSTM and one epoch of training for fine-grained SST (Tai et al. 2015,
sec. 5.1), in fold.

A tree is ``(label, word)`` at a leaf and ``(label, left, right)`` inside; ``embeddings`` is the
(fixed) word-vector table. Every node's state goes through a softmax classifier; a minibatch's loss
is the mean cross-entropy over its nodes. Training: Adagrad (learning rate 0.05, accumulators from
0.1) with L2 1e-4 on the weights, minibatches of 25 trees in the given order.
"""

import jax
import jax.numpy as jnp
import optax

import fold as fd


def model(embeddings, state=150, classes=5):
    cell, readout = fd.BinaryTreeLSTMCell(state, name="cell"), fd.FC(classes, activation=None, name="readout")
    h = fd.TensorType((state,))
    embed = fd.Scalar("int32") >> fd.Function(lambda i: jnp.asarray(embeddings)[i])

    def with_loss(compute_state):
        c = fd.Composition()
        with c.scope():
            s = compute_state.reads(c.input)
            logits = (fd.GetItem(1) >> fd.Function(readout)).reads(s)
            label = (fd.GetItem(0) >> fd.Scalar("int32")).reads(c.input)
            fd.Metric("loss").reads(fd.Function(optax.softmax_cross_entropy_with_integer_labels).reads(logits, label))
            c.output.reads(s)
        return c

    tree = fd.ForwardDeclaration(fd.PyObjectType(), fd.TupleType(h, h))
    leaf = fd.AllOf(fd.GetItem(1) >> embed, fd.Zeros(fd.TupleType(fd.TupleType(h, h), fd.TupleType(h, h))))
    pair = fd.AllOf(fd.Zeros(fd.TensorType((embeddings.shape[1],))), fd.Record([(1, tree()), (2, tree())]))
    tree.resolve_to(fd.OneOf(len, {2: with_loss(leaf >> fd.Function(cell) >> fd.GetItem(1)),
                                   3: with_loss(pair >> fd.Function(cell) >> fd.GetItem(1))}))
    return fd.Compiler.create(tree())


optimizer = optax.chain(optax.add_decayed_weights(1e-4), optax.adagrad(0.05))


def train_epoch(compiler, params, trees, batch_size=25):
    @jax.jit
    def step(params, opt_state, batch):
        grads = jax.grad(lambda p: compiler.apply(p, batch).metrics["loss"].mean())(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    opt_state = optimizer.init(params)
    for batch in compiler.batches(trees, batch_size):
        params, opt_state = step(params, opt_state, batch)
    return params
