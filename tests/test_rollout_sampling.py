"""Sampling: token frequencies match the intended distribution (chi-square), cut-offs match a
sort-based numpy reference, rows are independent, and log-probs are those of the sampled law."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.rollout import sampling

V = 12
LOGITS = np.array([2.0, 1.5, 1.2, 1.0, 0.5, 0.3, 0.0, -0.2, -0.5, -1.0, -2.0, -3.0], np.float32)


def reference_probs(logits, temperature, top_p, top_k):
  """The sampling law by sorting (SGLang/vLLM order: temperature, top-k, renormalize, top-p)."""
  z = logits.astype(np.float64) / temperature
  order = np.argsort(-z, kind="stable")
  keep = np.zeros(len(z), bool)
  kept = order[:top_k] if top_k > 0 else order
  p = np.exp(z[kept] - z[kept].max())
  p /= p.sum()
  n = len(kept) if top_p >= 1 else int(np.searchsorted(np.cumsum(p), top_p) + 1)
  keep[kept[:n]] = True
  out = np.where(keep, np.exp(z - z.max()), 0.0)
  return out / out.sum()


def chi2_pvalue(counts, probs):
  """P-value of Pearson's chi-square test (bins with zero probability must have zero counts)."""
  assert np.all(counts[probs == 0] == 0), "sampled a token outside the kept set"
  m = probs > 0
  n = counts.sum()
  stat = np.sum((counts[m] - n * probs[m]) ** 2 / (n * probs[m]))
  dof = m.sum() - 1
  return float(jax.scipy.special.gammaincc(dof / 2, stat / 2))


_sample = jax.jit(sampling.sample)
f32 = np.float32
_uniforms = jax.jit(sampling.row_uniforms, static_argnums=0)


def draw(logits, n, temperature=1.0, top_p=1.0, top_k=0, seed=0):
  """n samples of one logits row, as n rows with seeds (seed, i) at step 0."""
  seeds = np.stack([np.full(n, seed), np.arange(n)], axis=1).astype(np.uint32)
  u = _uniforms(7, seeds, jnp.zeros(n, jnp.int32))
  tokens, logprobs = _sample(
    jnp.broadcast_to(jnp.asarray(logits), (n, len(logits))),
    u,
    jnp.full(n, temperature, jnp.float32),
    jnp.full(n, top_p, jnp.float32),
    jnp.full(n, top_k, jnp.int32),
  )
  return np.asarray(tokens), np.asarray(logprobs)


@pytest.mark.parametrize(
  "temperature,top_p,top_k",
  [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 0.8, 0), (1.3, 0.9, 6), (1.0, 1.0, 3)],
)
def test_frequencies_match_the_sampling_law(temperature, top_p, top_k):
  tokens, logprobs = draw(LOGITS, 20_000, temperature, top_p, top_k)
  probs = reference_probs(LOGITS, temperature, top_p, top_k)
  counts = np.bincount(tokens, minlength=V)
  assert chi2_pvalue(counts, probs) > 1e-3
  # The returned log-prob is that of the law the token was drawn from.
  np.testing.assert_allclose(logprobs, np.log(probs[tokens]), atol=2e-6)


def test_chi_square_detects_a_wrong_law():
  """The test has power: samples at temperature 1 fail against the temperature-0.7 law."""
  tokens, _ = draw(LOGITS, 20_000, 1.0)
  counts = np.bincount(tokens, minlength=V)
  assert chi2_pvalue(counts, reference_probs(LOGITS, 0.7, 1.0, 0)) < 1e-6


def test_cutoff_matches_sorted_reference_on_a_large_vocabulary():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 5000)).astype(np.float32) * 2.5
  top_p = np.array([1.0, 0.9, 0.5, 0.95, 1.0, 0.3], np.float32)
  top_k = np.array([0, 0, 0, 40, 7, 100], np.int32)
  lp = np.asarray(jax.jit(sampling.sampling_logprobs)(logits, jnp.ones(6), top_p, top_k))
  for r in range(6):
    ref = reference_probs(logits[r], 1.0, top_p[r], top_k[r])
    np.testing.assert_array_equal(np.isfinite(lp[r]), ref > 0)
    np.testing.assert_allclose(np.exp(lp[r]), ref, atol=1e-6)


def test_rows_are_independent_of_their_neighbours():
  """Row 0's token and log-prob do not change when its neighbours ask for cuts or greedy."""
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, V)), jnp.float32)
  u = f32([0.1, 0.5, 0.77, 0.93])
  plain = _sample(logits, u, f32([1] * 4), f32([1] * 4), np.zeros(4, np.int32))
  mixed = _sample(logits, u, f32([1, 0, 0.8, 1]), f32([1, 1, 0.7, 0.9]), np.int32([0, 0, 5, 0]))
  assert int(plain[0][0]) == int(mixed[0][0])
  assert float(plain[1][0]) == float(mixed[1][0])  # bit-identical, not merely close


def test_greedy_rows_take_the_argmax_with_the_untruncated_logprob():
  logits = jnp.asarray(np.random.default_rng(2).normal(size=(4, V)), jnp.float32)
  tokens, logprobs = _sample(
    logits, f32([0.99] * 4), f32([0] * 4), f32([0.5] * 4), np.int32([5] * 4)
  )
  np.testing.assert_array_equal(tokens, np.argmax(logits, -1))
  expected = jax.nn.log_softmax(logits)[jnp.arange(4), tokens]
  np.testing.assert_allclose(logprobs, expected, atol=1e-6)


def test_pick_never_lands_on_a_zero_weight():
  w = np.zeros((3, 1000), np.float32)
  w[0, [5, 500]] = [1.0, 2.0]
  w[1, 999] = 1.0
  w[2, [0, 1]] = [1e-30, 1.0]
  targets = np.array([2.9999998, 0.9999999, 0.0], np.float32)
  pick = jax.jit(sampling._pick)
  np.testing.assert_array_equal(pick(w, targets), [500, 999, 0])
  np.testing.assert_array_equal(pick(w, targets * 0), [5, 999, 0])


def test_row_uniforms_are_uniform_and_pure():
  seeds = np.stack([np.arange(50_000) % 7, np.arange(50_000) // 7], 1).astype(np.uint32)
  steps = np.arange(50_000, dtype=np.int32) % 13
  u = np.asarray(_uniforms(3, seeds, steps))
  assert u.min() >= 0 and u.max() < 1
  counts = np.histogram(u, bins=20, range=(0, 1))[0]
  assert chi2_pvalue(counts, np.full(20, 0.05)) > 1e-3
  np.testing.assert_array_equal(u, np.asarray(_uniforms(3, seeds, steps)))
  assert len(np.unique(u)) > 49_000  # distinct (seed, step) pairs give distinct draws
  other = np.asarray(_uniforms(4, seeds, steps))  # the engine seed matters
  assert np.mean(other == u) < 0.01


def test_split_seed_round_trips():
  lo, hi = sampling.split_seed(2**40 + 12345)
  assert (lo, hi) == (12345, 256)
