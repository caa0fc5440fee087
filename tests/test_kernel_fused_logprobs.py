"""Fused token log-probs (kernels/fused_logprobs): values and gradients against the naive oracle."""

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import fused_token_logprobs
from kernels.fused_logprobs import token_logprobs_reference

# Pallas runs compiled on TPU and in interpret mode on CPU; it is not built for GPU (see kernel.py).
IMPLS = [
    "xla",
    pytest.param("pallas", marks=pytest.mark.skipif(
        jax.default_backend() == "gpu", reason="Pallas fused log-probs target TPU")),
]  # fmt: skip


def _inputs(n, d, v, *, dtype=jnp.float32, seed=0, scale=1.0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.normal(size=(n, d)) * scale, dtype)
  w = jnp.asarray(rng.normal(size=(d, v)) / np.sqrt(d) * 3.0, dtype)
  t = jnp.asarray(rng.integers(0, v, size=n), jnp.int32)
  g = jnp.asarray(rng.normal(size=(2, n)), jnp.float32)  # cotangents of (logp, entropy)
  return h, w, t, g


def _objective(fn, t, g, **kw):
  def f(h, w):
    logp, ent = fn(h, w, t, **kw)
    return jnp.sum(g[0] * logp) + jnp.sum(g[1] * ent), (logp, ent)

  return f


def _run_traced(fn, h, w, t, g, **kw):
  (_, (logp, ent)), (dh, dw) = jax.value_and_grad(_objective(fn, t, g, **kw), (0, 1), has_aux=True)(
    h, w
  )
  return logp, ent, dh, dw


def _both(h, w, t, g, temperature=1.0, **kw):
  """Fused and reference results, each (logp, entropy, dh, dw), from one compile."""
  return jax.jit(
    lambda h, w, t, g: (
      _run_traced(fused_token_logprobs, h, w, t, g, temperature=temperature, **kw),
      _run_traced(token_logprobs_reference, h, w, t, g, temperature=temperature),
    )
  )(h, w, t, g)


def _assert_rel(x, y, tol):
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  err = np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30)
  assert err <= tol, f"relative error {err:.3g} > {tol}"


def test_reference_matches_numpy():
  h, w, t, _ = _inputs(5, 4, 7)
  z = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / 0.5
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  lp, ent = token_logprobs_reference(h, w, t, temperature=0.5)
  np.testing.assert_allclose(lp, logp[np.arange(5), np.asarray(t)], rtol=1e-6)
  np.testing.assert_allclose(ent, -(np.exp(logp) * logp).sum(-1), rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
  "n,d,v,bn,bv,temperature",
  [
    (37, 16, 101, 8, 16, 1.0),  # neither N nor V a multiple of its block
    (64, 32, 256, 16, 64, 0.6),  # exact multiples
    (5, 8, 50, 1024, 8192, 1.0),  # blocks larger than the arrays
    (33, 8, 130, 32, 128, 0.6),  # one-element overhang in both
  ],
)
def test_values_and_grads_f32(impl, n, d, v, bn, bv, temperature):
  h, w, t, g = _inputs(n, d, v)
  got, want = _both(h, w, t, g, temperature, block_size=bv, row_block_size=bn, impl=impl)
  assert got[0].dtype == got[1].dtype == jnp.float32
  for x, y in zip(got, want, strict=True):  # logp, entropy, dh, dw
    _assert_rel(x, y, 1e-5)


@pytest.mark.parametrize("impl", ["xla"])
def test_each_output_gradient_separately(impl):
  """d logp/dz = onehot - p and dH/dz = -p (log p + H), each on its own (the shared formula)."""
  h, w, t, _ = _inputs(19, 8, 45, seed=3)
  for g in (jnp.ones((2, 19)).at[1].set(0.0), jnp.ones((2, 19)).at[0].set(0.0)):
    got, want = _both(h, w, t, g, block_size=16, row_block_size=8, impl=impl)
    for x, y in zip(got[2:], want[2:], strict=True):
      _assert_rel(x, y, 1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_inputs(impl):
  h, w, t, g = _inputs(40, 32, 300, dtype=jnp.bfloat16, seed=1)
  got, want = _both(h, w, t, g, block_size=64, row_block_size=16, impl=impl)
  (lp, ent, dh, dw), (lr, er, dhr, dwr) = got, want  # want: exact f32 math on the bf16 values
  _assert_rel(lp, lr, 1e-5)
  _assert_rel(ent, er, 1e-5)
  assert dh.dtype == dw.dtype == jnp.bfloat16
  _assert_rel(dh, dhr, 1e-2)  # rounding of the result to bf16 (8 mantissa bits)
  _assert_rel(dw, dwr, 1e-2)


@pytest.mark.parametrize("impl", IMPLS)
def test_peaked_distribution_entropy(impl):
  """Entropy near 0 (one dominant logit) is not lost to cancellation."""
  h, w, t, _ = _inputs(8, 8, 100, seed=2, scale=30.0)
  lp, ent = fused_token_logprobs(h, w, t, block_size=32, impl=impl)
  lr, er = token_logprobs_reference(h, w, t)
  assert np.all(np.isfinite(ent)) and np.all(ent >= -1e-6)
  np.testing.assert_allclose(ent, er, atol=2e-5)
  np.testing.assert_allclose(lp, lr, rtol=1e-5, atol=1e-4)


def test_leading_dims_and_traced_temperature():
  h, w, t, _ = _inputs(12, 8, 40)
  f = jax.jit(lambda h, tmp: fused_token_logprobs(h, w, t.reshape(3, 4), temperature=tmp))
  lp, ent = f(h.reshape(3, 4, 8), jnp.float32(0.8))
  lr, er = token_logprobs_reference(h, w, t, temperature=0.8)
  assert lp.shape == ent.shape == (3, 4)
  _assert_rel(lp.reshape(-1), lr, 1e-5)
  _assert_rel(ent.reshape(-1), er, 1e-5)


def test_empty_rows():
  h, w, _, _ = _inputs(0, 8, 40)
  lp, ent = fused_token_logprobs(h, w, jnp.zeros((0,), jnp.int32))
  assert lp.shape == ent.shape == (0,)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(impl="cuda"), "impl"),
    (dict(temperature=0.0), "temperature"),
  ],
)
def test_bad_arguments(kwargs, match):
  h, w, t, _ = _inputs(4, 8, 16)
  with pytest.raises(ValueError, match=match):
    fused_token_logprobs(h, w, t, **kwargs)


def test_bad_shapes():
  h, w, t, _ = _inputs(4, 8, 16)
  with pytest.raises(ValueError, match="lm_head_dv"):
    fused_token_logprobs(h, w.T, t)
  with pytest.raises(ValueError, match="targets_n"):
    fused_token_logprobs(h, w, t[:3])
  with pytest.raises(ValueError, match="targets_n"):
    fused_token_logprobs(h, w, t.astype(jnp.float32))


@hypothesis.settings(max_examples=6, deadline=None)
@hypothesis.given(
  n=st.integers(1, 24),
  v=st.integers(2, 70),
  bn=st.integers(1, 16),
  bv=st.integers(1, 32),
  seed=st.integers(0, 1000),
)
def test_xla_any_blocking_matches_reference(n, v, bn, bv, seed):
  h, w, t, g = _inputs(n, 4, v, seed=seed)
  got, want = _both(h, w, t, g, block_size=bv, row_block_size=bn, impl="xla")
  for x, y in zip(got, want, strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_compiled_temp_memory_is_a_small_fraction_of_naive():
  """At a Qwen3-vocabulary size the fused path's compiled temporaries stay far below the naive."""
  n, d, v = 8192, 1024, 151936
  args = (
    jax.ShapeDtypeStruct((n, d), jnp.float32),
    jax.ShapeDtypeStruct((d, v), jnp.float32),
    jax.ShapeDtypeStruct((n,), jnp.int32),
    jax.ShapeDtypeStruct((2, n), jnp.float32),
  )

  def temp(fn):
    f = jax.jit(
      lambda h, w, t, g: jax.grad(lambda h, w: _objective(fn, t, g)(h, w)[0], (0, 1))(h, w)
    )
    return f.lower(*args).compile().memory_analysis().temp_size_in_bytes

  fused = temp(lambda h, w, t: fused_token_logprobs(h, w, t, impl="xla"))
  naive = temp(token_logprobs_reference)
  assert naive > 2 * n * v * 4  # at least two [N, V] float32 buffers
  assert fused < 0.02 * naive, (fused, naive)
