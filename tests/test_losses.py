"""sao_jax.losses: every loss against numpy, DIS band edges, micro-batch invariance."""

import math

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import losses

F32 = np.float32


def _batch(seed=0, b=4, t=16, spread=0.6):
  rng = np.random.default_rng(seed)
  rollout = -rng.gamma(2.0, 1.0, size=(b, t)).astype(F32)
  logp = (rollout + rng.normal(scale=spread, size=(b, t))).astype(F32)
  adv = rng.normal(size=(b, t)).astype(F32)
  mask = rng.random((b, t)) < 0.7
  mask[:, 0] = False
  return logp, rollout, adv, mask


def _np_dis(logp, rollout, adv, mask, eps_low, eps_high, literal=False):
  """(loss, d loss / d logp) in numpy, band test on the float32 log-ratio."""
  log_r = np.where(mask, logp - rollout, F32(0)).astype(F32)
  lo, hi = F32(math.log1p(-eps_low)), F32(math.log1p(eps_high))
  keep = (mask & (log_r > lo) & (log_r < hi)).astype(np.float64)
  r = np.exp(log_r.astype(np.float64))
  n = max(mask.sum(), 1)
  if literal:
    loss = -(keep * r * adv * logp).sum() / n
    grad = -keep * r * adv * (1 + logp) / n
  else:
    loss, grad = -(keep * r * adv).sum() / n, -keep * r * adv / n
  return loss, grad, keep


# ---------------------------------------------------------------------------------------- DIS


@pytest.mark.parametrize("gradient", ["detached", "literal"])
def test_dis_loss_and_grad_match_numpy_with_band_edges(gradient):
  logp, rollout, adv, mask = _batch(seed=1, spread=1.0)
  eps_low, eps_high = 0.3, 0.5
  lo, hi = F32(math.log1p(-eps_low)), F32(math.log1p(eps_high))
  # Row 0: tokens exactly on each edge (masked: strict band) and one float32 step inside (kept).
  row = [lo, np.nextafter(lo, F32(1)), hi, np.nextafter(hi, F32(-1)), F32(0.0)]
  rollout[0, 1:6], logp[0, 1:6], mask[0, 1:6] = 0.0, row, True
  f = lambda lp: losses.dis_policy_loss(
    lp, rollout, adv, mask, eps_low=eps_low, eps_high=eps_high, gradient=gradient
  )
  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp))
  want_loss, want_grad, keep = _np_dis(logp, rollout, adv, mask, eps_low, eps_high,
                                       literal=gradient == "literal")  # fmt: skip
  np.testing.assert_array_equal(keep[0, 1:6], [0, 1, 0, 1, 1])
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-8)
  log_r = np.where(mask, logp - rollout, 0)
  n = mask.sum()
  np.testing.assert_allclose(metrics["dis_masked_below"], (mask & (log_r <= lo)).sum() / n)
  np.testing.assert_allclose(metrics["dis_masked_above"], (mask & (log_r >= hi)).sum() / n)
  np.testing.assert_allclose(metrics["logp_abs_diff"], np.abs(log_r)[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["ratio_mean"], np.exp(log_r)[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["ratio_max"], np.exp(log_r)[mask].max(), rtol=1e-5)
  k3 = np.exp(log_r) - 1 - log_r
  np.testing.assert_allclose(metrics["rollout_kl"], k3[mask].mean(), rtol=1e-4)


def test_dis_masked_tokens_stay_in_denominator():
  logp = jnp.array([[0.0, 0.0, 5.0, -5.0]])  # ratios 1, 1, e^5 (above), e^-5 (below)
  rollout, adv, mask = jnp.zeros((1, 4)), jnp.ones((1, 4)), jnp.array([[True] * 4])
  loss, m = losses.dis_policy_loss(logp, rollout, adv, mask, eps_low=0.3, eps_high=5.0)
  np.testing.assert_allclose(loss, -2.0 / 4)  # two kept tokens with r = A = 1, over 4 tokens
  assert float(m["dis_masked_above"]) == float(m["dis_masked_below"]) == 0.25


def test_dis_all_masked_batch_is_zero_with_finite_grads():
  logp, rollout, adv, _ = _batch(seed=2)
  mask = np.zeros_like(logp, bool)
  logp[0, 0] = -np.inf  # garbage off the mask must not leak into the loss or the gradient
  f = lambda lp: losses.dis_policy_loss(lp, rollout, adv, mask, eps_low=0.3, eps_high=5.0)
  (loss, metrics), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(logp))
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)
  assert all(np.isfinite(float(v)) for v in metrics.values())


def test_dis_extreme_ratios_stay_finite():
  logp = jnp.array([[0.0, 80.0, -80.0, 0.1]])
  f = lambda lp: losses.dis_policy_loss(
    lp, jnp.zeros((1, 4)), jnp.ones((1, 4)), jnp.ones((1, 4), bool), eps_low=0.3, eps_high=5.0
  )[0]
  loss, grad = jax.value_and_grad(f)(logp)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(np.asarray(grad)))
  np.testing.assert_allclose(grad, [[-0.25, 0.0, 0.0, -np.exp(0.1) / 4]], rtol=1e-6)


@jax.jit
def _split_vs_full(logp, rollout, adv, mask, first):
  """Full-batch (loss, metrics, grad) and the same from two micro-batches (rows first / rest).

  Micro-batches are expressed by masking rows out, so every hypothesis example shares one compile.
  """
  kw = dict(eps_low=0.2, eps_high=0.5)
  full = jax.value_and_grad(lambda lp: losses.dis_policy_loss(lp, rollout, adv, mask, **kw),
                            has_aux=True)(logp)  # fmt: skip
  n = jnp.sum(mask)
  parts, grad = [], jnp.zeros_like(logp)
  for rows in (first, ~first):
    mb_mask = mask & rows[:, None]
    terms_fn = lambda lp, mb_mask=mb_mask: losses.dis_policy_loss_terms(lp, rollout, adv, mb_mask,
                                                                       **kw)  # fmt: skip
    parts.append(terms_fn(logp))
    grad = grad + jax.grad(lambda lp, f=terms_fn: f(lp).loss_sum / n)(logp)
  return full, (losses.finalize(losses.accumulate(*parts)), grad)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(split=st.integers(1, 5), seed=st.integers(0, 1000))
def test_micro_batch_accumulation_equals_full_batch(split, seed):
  logp, rollout, adv, mask = _batch(seed=seed, b=6, t=8)
  ((loss, m), g), ((loss_mb, m_mb), g_mb) = _split_vs_full(
    logp, rollout, adv, mask, jnp.arange(6) < split
  )
  np.testing.assert_allclose(loss_mb, loss, rtol=1e-5, atol=1e-7)
  for k, v in m.items():
    np.testing.assert_allclose(m_mb[k], v, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(g_mb, g, rtol=1e-5, atol=1e-8)


def test_dis_rejects_bad_arguments():
  logp, rollout, adv, mask = _batch()
  with pytest.raises(ValueError, match="gradient"):
    losses.dis_policy_loss(logp, rollout, adv, mask, eps_low=0.3, eps_high=5, gradient="x")
  with pytest.raises(ValueError, match="eps_low"):
    losses.dis_policy_loss(logp, rollout, adv, mask, eps_low=1.5, eps_high=5)
  with pytest.raises(ValueError, match="shape"):
    losses.dis_policy_loss(logp, rollout[:, :3], adv, mask, eps_low=0.3, eps_high=5)


# ---------------------------------------------------------------------------------------- PPO


def _np_ppo(logp, old, adv, mask, lo, hi, dual=None, w=None):
  u = np.exp(np.where(mask, logp - old, 0).astype(np.float64))
  pg1, pg2 = -adv * u, -adv * np.clip(u, 1 - lo, 1 + hi)
  per = np.maximum(pg1, pg2)
  if dual:
    per = np.where(adv < 0, np.minimum(per, -dual * adv), per)
  if w is not None:
    per = per * w
  return (per * mask).sum() / mask.sum(), ((pg2 > pg1) & mask).sum() / mask.sum()


@pytest.mark.parametrize("dual", [None, 3.0])
@pytest.mark.parametrize("weights", [False, True])
def test_ppo_clip_matches_numpy(dual, weights):
  logp, old, adv, mask = _batch(seed=3, spread=0.5)
  adv[0, :6] = -2.0
  logp[0, :6] = old[0, :6] + 2.0  # ratio e^2 > 3 with A < 0: dual clip active
  w = losses.tis_weights(logp - 0.1, old, mask, cap=2.0) if weights else None
  loss, m = losses.ppo_clip_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28,
                                 dual_clip=dual, is_weights=w)  # fmt: skip
  want, clipfrac = _np_ppo(
    logp, old, adv, mask, 0.2, 0.28, dual, None if w is None else np.asarray(w)
  )
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(m["clipfrac"], clipfrac, rtol=1e-6)
  if dual:
    assert float(m["dual_clipfrac"]) > 0
  if weights:
    np.testing.assert_allclose(m["is_weight_mean"], np.asarray(w)[mask].mean(), rtol=1e-5)


def test_ppo_gradient_zero_where_clipped():
  # A > 0 and u above 1 + eps_high: clipped, no gradient; A > 0 and u inside: gradient -A u / n.
  logp, old = jnp.array([[1.0, 0.1]]), jnp.zeros((1, 2))
  f = lambda lp: losses.ppo_clip_loss(lp, old, jnp.ones((1, 2)), jnp.ones((1, 2), bool),
                                      eps_low=0.2, eps_high=0.2)[0]  # fmt: skip
  np.testing.assert_allclose(jax.grad(f)(logp), [[0.0, -np.exp(0.1) / 2]], rtol=1e-6)


def test_is_weights_hand_values():
  train = jnp.log(jnp.array([[0.5, 1.0, 3.0, 0.2, 1.0]]))
  roll = jnp.zeros((1, 5))
  mask = jnp.array([[True, True, True, True, False]])
  np.testing.assert_allclose(losses.tis_weights(train, roll, mask, cap=2.0),
                             [[0.5, 1.0, 2.0, 0.2, 0.0]], rtol=1e-6)  # fmt: skip
  np.testing.assert_allclose(losses.masked_is_weights(train, roll, mask, low=0.5, high=2.0),
                             [[0.5, 1.0, 0.0, 0.0, 0.0]], rtol=1e-6)  # fmt: skip


def test_decoupled_ppo_matches_numpy():
  logp, prox, adv, mask = _batch(seed=4, spread=0.3)
  rollout = (prox - np.random.default_rng(4).normal(scale=1.0, size=prox.shape)).astype(F32)
  loss, m = losses.decoupled_ppo_loss(logp, prox, rollout, adv, mask, eps=0.2, behav_cap=2.0)
  u = np.exp(np.where(mask, logp - prox, 0).astype(np.float64))
  w = np.exp(np.where(mask, prox - rollout, 0).astype(np.float64))
  keep = mask & (w <= 2.0)
  per = w * np.maximum(-adv * u, -adv * np.clip(u, 0.8, 1.2))
  np.testing.assert_allclose(loss, (per * keep).sum() / mask.sum(), rtol=1e-5)
  np.testing.assert_allclose(m["behav_masked"], (mask & ~keep).sum() / mask.sum(), rtol=1e-6)
  assert 0 < float(m["behav_masked"]) < 1


# -------------------------------------------------------------------------------------- value


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_numpy(clip):
  rng = np.random.default_rng(5)
  v, ret, old = (rng.normal(size=(3, 10)).astype(F32) for _ in range(3))
  mask = rng.random((3, 10)) < 0.6
  f = lambda v: losses.value_loss(v, ret, mask, old_values=old, clip=clip)
  (loss, m), grad = jax.value_and_grad(f, has_aux=True)(jnp.asarray(v))
  sq = (v - ret) ** 2
  d = v - ret
  if clip:
    vc = old + np.clip(v - old, -clip, clip)
    use_c = (vc - ret) ** 2 > sq
    sq = np.maximum(sq, (vc - ret) ** 2)
    d = np.where(use_c, (vc - ret) * (np.abs(v - old) < clip), d)
  n = mask.sum()
  np.testing.assert_allclose(loss, 0.5 * sq[mask].sum() / n, rtol=1e-5)
  np.testing.assert_allclose(grad, np.where(mask, d, 0) / n, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m["value_abs_err"], np.abs(v - ret)[mask].mean(), rtol=1e-5)


def test_value_clip_needs_old_values():
  with pytest.raises(ValueError, match="old_values"):
    losses.value_loss(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2), bool), clip=0.2)


def test_explained_variance():
  rng = np.random.default_rng(6)
  ret = rng.normal(size=(4, 12)).astype(F32)
  mask = rng.random((4, 12)) < 0.8
  v = (ret + rng.normal(scale=0.5, size=ret.shape)).astype(F32)
  want = 1 - np.var((ret - v)[mask], ddof=1) / (np.var(ret[mask], ddof=1) + 1e-5)
  np.testing.assert_allclose(losses.explained_variance(v, ret, mask), want, rtol=1e-5)
  np.testing.assert_allclose(losses.explained_variance(ret, ret, mask), 1.0, rtol=1e-6)


# ------------------------------------------------------------------ entropy, NLL, KL penalties


def test_entropy_and_positive_nll():
  ent = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  mask = jnp.array([[True, True, False], [False, True, True]])
  loss, m = losses.entropy_loss(ent, mask)
  np.testing.assert_allclose([loss, m["entropy"]], [-3.5, 3.5])  # (1 + 2 + 5 + 6) / 4
  loss, m = losses.positive_nll_loss(-ent, mask, jnp.array([False, True]))
  np.testing.assert_allclose([loss, m["nll_pos"]], [5.5, 5.5])
  loss, _ = losses.positive_nll_loss(-ent, mask, jnp.array([False, False]))
  assert float(loss) == 0.0
  with pytest.raises(ValueError, match="positive"):
    losses.positive_nll_loss(-ent, mask, jnp.array([True]))


def test_kl_estimators_hand_values():
  lp, ref = jnp.array([-1.0]), jnp.array([-2.0])  # log pi - log ref = 1
  np.testing.assert_allclose(losses.kl_estimate(lp, ref, kind="k1"), [1.0])
  np.testing.assert_allclose(losses.kl_estimate(lp, ref, kind="k2"), [0.5])
  np.testing.assert_allclose(
    losses.kl_estimate(lp, ref, kind="k3"), [np.exp(-1) - 1 + 1], rtol=1e-6
  )
  with pytest.raises(ValueError, match="kind"):
    losses.kl_estimate(lp, ref, kind="k4")


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_estimators_are_unbiased(kind):
  """Means over samples from pi approach the exact KL(pi || ref) of two categoricals."""
  rng = np.random.default_rng(7)
  p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
  x = rng.choice(6, size=200_000, p=p)
  est = losses.kl_estimate(jnp.log(p[x]), jnp.log(q[x]), kind=kind)
  np.testing.assert_allclose(float(est.mean()), float(np.sum(p * np.log(p / q))), rtol=0.02)
  loss, m = losses.kl_loss(jnp.log(p[x])[None], jnp.log(q[x])[None], jnp.ones((1, x.size), bool),
                           kind=kind)  # fmt: skip
  np.testing.assert_allclose([loss, m[f"kl_{kind}"]], [est.mean()] * 2, rtol=1e-5)
