"""Checkpoints: params and optimizer states round-trip through .npz files into a model rebuilt in
another process; mismatches are named."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fold as fd


def _model() -> fd.Block:
    return fd.Map(fd.Vector(2) >> fd.FC(4, name="dense")) >> fd.Sum() >> fd.FC(1, activation=None, name="out")


def _trained(steps: int = 3):
    compiler = fd.Compiler.create(_model())
    params = compiler.init(jax.random.key(0))
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    batch = compiler.build_batch([[[1.0, 2.0]], [[0.5, -1.0], [2.0, 0.0]]])
    for _ in range(steps):
        grads = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2)))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return compiler, optimizer, params, opt_state, batch


def test_params_and_optimizer_state_round_trip(tmp_path):
    compiler, optimizer, params, opt_state, batch = _trained()
    path = tmp_path / "ckpt.npz"
    fd.save_checkpoint(path, {"params": params, "opt_state": opt_state, "key": jax.random.key(3)})
    fresh = compiler.init(jax.random.key(1))
    like = {"params": fresh, "opt_state": optimizer.init(fresh), "key": jax.random.key(0)}
    restored = fd.load_checkpoint(path, like)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(like)
    for a, b in zip(jax.tree_util.tree_leaves(restored["opt_state"]), jax.tree_util.tree_leaves(opt_state)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(jax.random.key(3)))
    np.testing.assert_array_equal(compiler.apply(restored["params"], batch).outputs,
                                  compiler.apply(params, batch).outputs)
    # Training goes on from the restored state exactly as from the original.
    grads = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs)))(params)
    a = optimizer.update(grads, opt_state, params)[0]
    b = optimizer.update(grads, restored["opt_state"], restored["params"])[0]
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_a_model_rebuilt_in_another_process_loads_the_checkpoint(tmp_path):
    compiler, _, params, _, batch = _trained()
    path = tmp_path / "params.npz"
    fd.save_checkpoint(path, params)
    script = textwrap.dedent(f"""
        import jax, numpy as np, fold as fd
        from tests.test_checkpoint import _model
        compiler = fd.Compiler.create(_model())
        params = fd.load_checkpoint({str(path)!r}, compiler.init(jax.random.key(9)))
        out = compiler.apply(params, compiler.build_batch([[[1.0, 2.0]], [[0.5, -1.0], [2.0, 0.0]]])).outputs
        print(np.asarray(out).tolist())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(eval(done.stdout.strip()), np.asarray(compiler.apply(params, batch).outputs))


def test_mismatches_are_named(tmp_path):
    compiler, _, params, _, _ = _trained(0)
    path = tmp_path / "p.npz"
    fd.save_checkpoint(path, params)
    other = fd.Compiler.create(fd.Map(fd.Vector(2) >> fd.FC(4, name="renamed")) >> fd.Sum() >> fd.FC(1, name="out"))
    with pytest.raises(KeyError) as raised:
        fd.load_checkpoint(path, other.init(jax.random.key(0)))
    assert raised.value.args[0].endswith("does not match the template: missing ['renamed']['b'], ['renamed']['w']; "
                                         "unexpected ['dense']['b'], ['dense']['w'] (saved from a model with other "
                                         "layer names, or with another optimizer?)")
    wider = fd.Compiler.create(fd.Map(fd.Vector(3) >> fd.FC(4, name="dense")) >> fd.Sum() >> fd.FC(1, name="out"))
    with pytest.raises(ValueError, match=r"\['dense'\]\['w'\] has shape \(2, 4\).*template \(3, 4\)"):
        fd.load_checkpoint(path, wider.init(jax.random.key(0)))
    with pytest.raises(TypeError, match="leaves must be arrays or numbers"):
        fd.save_checkpoint(tmp_path / "bad.npz", {"x": object()})
    assert not list(tmp_path.glob("*.tmp"))  # a failed save leaves no temporary file


def test_jax_dtypes_round_trip(tmp_path):
    """bfloat16 and float8 leaves were saved as nameless bytes ("|V2") and the restore refused
    them ("dtype |V2, the template bfloat16"): a bfloat16 model's checkpoint could not be loaded."""
    tree = {"w": jnp.asarray([[1.5, -2.25], [3e38, 1e-3]], jnp.bfloat16),
            "q": jnp.asarray([0.5, -448.0, 2.0], jnp.float8_e4m3fn), "n": jnp.arange(3), "h": np.float16(0.1)}
    path = tmp_path / "low.npz"
    fd.save_checkpoint(path, tree)
    restored = fd.load_checkpoint(path, jax.tree_util.tree_map(jnp.zeros_like, tree))
    for name in tree:
        assert restored[name].dtype == tree[name].dtype, name
        np.testing.assert_array_equal(np.asarray(restored[name], np.float32), np.asarray(tree[name], np.float32))
    with np.load(path) as raw:  # still readable with NumPy alone: the bits, as unsigned ints
        np.testing.assert_array_equal(raw["__dtype__:bfloat16:['w']"].view(jnp.bfloat16), tree["w"])
    with pytest.raises(ValueError, match=r"\['w'\] has shape \(2, 2\) and dtype bfloat16, the template \(2, 2\) "
                                         r"and float32"):
        fd.load_checkpoint(path, dict(tree, w=jnp.zeros((2, 2), jnp.float32)))


def test_a_file_that_is_no_checkpoint_is_a_value_error_naming_it(tmp_path):
    """A truncated file raised zipfile's BadZipFile and another file NumPy's advice to unpickle
    it, neither naming the file."""
    params = {"w": jnp.ones((2, 3))}
    fd.save_checkpoint(tmp_path / "p.npz", params)
    whole = (tmp_path / "p.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "text.npz").write_bytes(b"not a checkpoint")
    for name in ("cut.npz", "text.npz"):
        with pytest.raises(ValueError, match=f"{name} is not a checkpoint that save_checkpoint wrote"):
            fd.load_checkpoint(tmp_path / name, params)
    with pytest.raises(FileNotFoundError):
        fd.load_checkpoint(tmp_path / "missing.npz", params)


def test_prng_keys_keep_their_implementation(tmp_path):
    """A saved rbg key was rewrapped as the default implementation's: its four words became an
    array of two threefry keys. A key where the template has none (or the reverse) is refused."""
    path = tmp_path / "k.npz"
    key = jax.random.key(3, impl="rbg")
    fd.save_checkpoint(path, {"k": key})
    restored = fd.load_checkpoint(path, {"k": jax.random.key(0, impl="rbg")})["k"]
    assert restored.shape == () and jax.random.key_impl(restored) == jax.random.key_impl(key)
    np.testing.assert_array_equal(jax.random.key_data(restored), jax.random.key_data(key))
    with pytest.raises(ValueError, match=r"\['k'\] is a PRNG key, the template's is not"):
        fd.load_checkpoint(path, {"k": jnp.zeros(4, jnp.uint32)})
    fd.save_checkpoint(path, {"k": jnp.zeros(2, jnp.uint32)})
    with pytest.raises(ValueError, match=r"\['k'\] is not a PRNG key, the template's is"):
        fd.load_checkpoint(path, {"k": jax.random.key(0)})


def test_checkpoint_files_get_the_usual_permissions(tmp_path):
    """Checkpoints were created mode 0600 (mkstemp's); NumPy's own files get 0666 less the umask."""
    mask = os.umask(0o022)
    try:
        fd.save_checkpoint(tmp_path / "p.npz", {"w": np.ones(2)})
        np.savez(tmp_path / "numpy.npz", w=np.ones(2))
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "p.npz").stat().st_mode) == stat.S_IMODE((tmp_path / "numpy.npz").stat().st_mode)
    assert stat.S_IMODE((tmp_path / "p.npz").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
