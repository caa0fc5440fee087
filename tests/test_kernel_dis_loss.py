"""Fused DIS loss kernel (kernels/dis_loss): values and gradients vs the reference and losses."""

import math

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import dis_loss
from kernels.dis_loss import BlockSizes, dis_loss_terms, dis_row_stats_reference
from kernels.dis_loss.kernel import KernelConfig, dis_row_stats
from sao_jax import losses

F32 = np.float32
EPS_LOW, EPS_HIGH = 0.3, 0.5
LO, HI = F32(math.log1p(-EPS_LOW)), F32(math.log1p(EPS_HIGH))


def _batch(b, t, seed=0):
  rng = np.random.default_rng(seed)
  roll = -rng.gamma(2.0, 1.0, size=(b, t)).astype(F32)
  logp = (roll + rng.normal(scale=0.8, size=(b, t))).astype(F32)
  adv = rng.normal(size=(b, t)).astype(F32)
  mask = rng.random((b, t)) < 0.7
  # Tokens exactly on each band edge (masked) and one float32 step inside (kept).
  k = min(t, 4)
  roll[0, :k] = 0.0
  logp[0, :k] = [LO, np.nextafter(LO, F32(1)), HI, np.nextafter(HI, F32(-1))][:k]
  mask[0, :k] = True
  return logp, roll, adv, mask


class TestDisKernel:
  INTERPRET = True

  def _loss_and_grad(self, fn, logp, roll, adv, mask, **kw):
    f = lambda lp: fn(lp, roll, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH, **kw)
    return jax.jit(jax.value_and_grad(f, has_aux=True))(logp)

  @pytest.mark.parametrize("b,t,bb,bt", [(5, 37, 2, 8), (8, 256, 8, 128), (3, 1000, 64, 8192)])
  @pytest.mark.parametrize("literal", [False, True])
  def test_row_stats_match_reference(self, b, t, bb, bt, literal):
    logp, roll, adv, mask = _batch(b, t)
    cfg = KernelConfig(float(LO), float(HI), literal, BlockSizes(bb, bt), self.INTERPRET)
    got = dis_row_stats(logp, roll, adv, mask.astype(F32), cfg)
    want = dis_row_stats_reference(logp, roll, adv, mask, log_lo=LO, log_hi=HI, literal=literal)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  @pytest.mark.parametrize("gradient", ["detached", "literal"])
  def test_loss_metrics_and_grad_match_losses(self, gradient):
    logp, roll, adv, mask = _batch(6, 45, seed=1)
    kw = dict(gradient=gradient)
    (loss, m), g = self._loss_and_grad(
      dis_loss, logp, roll, adv, mask, block_sizes=BlockSizes(4, 16), interpret=self.INTERPRET, **kw
    )
    (loss_r, m_r), g_r = self._loss_and_grad(losses.dis_policy_loss, logp, roll, adv, mask, **kw)
    np.testing.assert_allclose(loss, loss_r, rtol=1e-5)
    assert m.keys() == m_r.keys()
    for k in m:
      np.testing.assert_allclose(m[k], m_r[k], rtol=1e-5, err_msg=k)
    np.testing.assert_allclose(g, g_r, rtol=1e-5, atol=1e-9)
    # Edge tokens: on the edge no gradient, one step inside full gradient (row 0, tokens 0..3).
    assert np.all(np.asarray(g)[0, [0, 2]] == 0) and np.all(np.asarray(g)[0, [1, 3]] != 0)

  def test_grad_matches_numpy(self):
    logp, roll, adv, mask = _batch(4, 20, seed=2)
    _, g = self._loss_and_grad(dis_loss, logp, roll, adv, mask, interpret=self.INTERPRET)
    log_r = np.where(mask, logp - roll, F32(0))
    keep = mask & (log_r > LO) & (log_r < HI)
    want = np.where(keep, -np.exp(log_r.astype(np.float64)) * adv, 0.0) / mask.sum()
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-9)

  def test_all_masked_batch(self):
    logp, roll, adv, _ = _batch(3, 50, seed=3)
    mask = np.zeros((3, 50), bool)
    (loss, m), g = self._loss_and_grad(dis_loss, logp, roll, adv, mask, interpret=self.INTERPRET)
    assert float(loss) == 0.0 and np.all(np.asarray(g) == 0)
    assert all(np.isfinite(float(v)) for v in m.values())

  def test_bf16_logprobs(self):
    logp, roll, adv, mask = _batch(4, 40, seed=4)
    lp16 = jnp.asarray(logp, jnp.bfloat16)
    (loss, _), g = self._loss_and_grad(dis_loss, lp16, roll, adv, mask, interpret=self.INTERPRET)
    (loss_r, _), g_r = self._loss_and_grad(losses.dis_policy_loss, lp16, roll, adv, mask)
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(loss, loss_r, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g, F32), np.asarray(g_r, F32), rtol=1e-2, atol=1e-6)

  def test_micro_batches_accumulate(self):
    logp, roll, adv, mask = _batch(6, 30, seed=5)
    kw = dict(eps_low=EPS_LOW, eps_high=EPS_HIGH, interpret=self.INTERPRET)
    parts = [
      dis_loss_terms(logp[s], roll[s], adv[s], mask[s], **kw) for s in (slice(0, 2), slice(2, 6))
    ]
    loss, m = losses.finalize(losses.accumulate(*parts))
    loss_r, m_r = losses.dis_policy_loss(logp, roll, adv, mask, eps_low=EPS_LOW, eps_high=EPS_HIGH)
    np.testing.assert_allclose(loss, loss_r, rtol=1e-5)
    np.testing.assert_allclose(m["ratio_max"], m_r["ratio_max"], rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.tpu
@pytest.mark.skipif(jax.default_backend() == "cpu", reason="compiled Pallas needs a TPU or GPU")
class TestDisKernelCompiled(TestDisKernel):
  INTERPRET = False


@hypothesis.settings(max_examples=5, deadline=None)
@hypothesis.given(
    b=st.integers(1, 9), t=st.integers(1, 70), bb=st.integers(1, 8), bt=st.integers(1, 64),
    seed=st.integers(0, 100),
)  # fmt: skip
def test_any_shape_and_blocking(b, t, bb, bt, seed):
  logp, roll, adv, mask = _batch(b, t, seed)
  kw = dict(eps_low=EPS_LOW, eps_high=EPS_HIGH)
  got = dis_loss_terms(logp, roll, adv, mask, block_sizes=BlockSizes(bb, bt), **kw)
  want = losses.dis_policy_loss_terms(logp, roll, adv, mask, **kw)
  np.testing.assert_allclose(got.loss_sum, want.loss_sum, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got.count, want.count)
  for k in want.sums:
    np.testing.assert_allclose(got.sums[k], want.sums[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_bad_arguments():
  logp, roll, adv, mask = _batch(2, 8)
  with pytest.raises(ValueError, match="one shape"):
    dis_loss(logp, roll[:, :4], adv, mask, eps_low=0.3, eps_high=5.0)
  with pytest.raises(ValueError, match="gradient"):
    dis_loss(logp, roll, adv, mask, eps_low=0.3, eps_high=5.0, gradient="sg")
  with pytest.raises(ValueError, match="Python numbers"):
    dis_loss(logp, roll, adv, mask, eps_low=jnp.float32(0.3), eps_high=5.0)
