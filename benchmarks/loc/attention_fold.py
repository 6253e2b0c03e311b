"""Feed-forward attention (Raffel & Ellis 2016, sec. 2.3) with its loss and accuracy, in fold.

An example is ``(steps, target)``: a sequence of ``[value, marker]`` pairs and the sum of the two
marked values. Each step goes through a dense ReLU layer to ``h_t``; ``e_t = tanh(w . h_t + b)``;
``alpha = softmax(e)``; the context ``sum_t alpha_t h_t`` goes through a dense ReLU layer and a
linear output. Loss: squared error; accuracy: absolute error below 0.04.
"""

import jax.numpy as jnp

import fold as fd


def model(hidden=100):
    steps = fd.GetItem(0) >> fd.Map(fd.Vector(2) >> fd.FC(hidden, name="encode"))
    alpha = fd.Map(fd.FC(1, activation=jnp.tanh, name="score")) >> fd.Softmax()
    context = fd.AllOf(alpha, fd.Identity()) >> fd.ZipWith(fd.Function(jnp.multiply)) >> fd.Sum()
    return fd.Compiler.create(steps >> context >> fd.FC(hidden, name="hidden") >> fd.FC(1, activation=None, name="out"))


def loss_and_accuracy(compiler, params, examples):
    error = compiler.apply(params, compiler.build_batch(examples)).outputs[:, 0] - jnp.array([t for _, t in examples])
    return jnp.mean(error**2), jnp.mean(jnp.abs(error) < 0.04)
