"""Lines-of-code comparison: the Fold paper's Table 3, measured on this library.

Each functional unit of the paper has three files here that compute the same function (the tests
in ``tests/benchmarks/test_loc.py`` tie their parameters and compare): ``*_fold.py`` with fold,
``*_jax.py`` in plain JAX + optax with explicit batching, ``*_torch.py`` in PyTorch, one example
at a time. ``count.py`` applies the paper's counting protocol; ``python -m benchmarks.loc`` prints
and saves the table.
"""
