"""Pure-jnp oracle for the DIS loss kernel: the per-row statistics it computes in one pass.

Shapes: B = trajectories (rows), T = tokens per row, S = len(STATS) = 8 statistics per row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Column order of the kernel's [B, S] output. All are sums over a row's action tokens, except
# ratio_max (a max; 0 for a row without action tokens).
STATS = (
  "loss_sum",  # −Σ keep · r · A   (literal: −Σ keep · r · A · logp)
  "count",  # Σ action_mask
  "dis_masked_below",  # Σ [log r ≤ log(1 − eps_low)]
  "dis_masked_above",  # Σ [log r ≥ log(1 + eps_high)]
  "logp_abs_diff",  # Σ |log r|
  "ratio_mean",  # Σ r
  "rollout_kl",  # Σ (r − 1 − log r)
  "ratio_max",  # max r
)
MAX_LOG_RATIO = 20.0


def dis_row_stats_reference(
  logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  action_mask: jax.Array,
  *,
  log_lo: float,
  log_hi: float,
  literal: bool = False,
) -> jax.Array:
  """Per-row DIS statistics, [B, S] float32, columns in `STATS` order.

  Args:
    logprobs: [B, T] log π_θ.
    rollout_logprobs: [B, T] log π_rollout.
    advantages: [B, T] advantages.
    action_mask: [B, T] bool.
    log_lo: log(1 − eps_low); log-ratios at or below it are masked.
    log_hi: log(1 + eps_high); log-ratios at or above it are masked.
    literal: multiply the per-token loss by logp (the printed objective).

  Returns:
    [B, S] float32.

  References:
    GLM-5 arXiv 2602.15763 §4.1 (DIS); SAO arXiv 2607.07508.
  """
  m = action_mask.astype(bool)
  logp = logprobs.astype(jnp.float32)
  d = jnp.where(m, logp - rollout_logprobs.astype(jnp.float32), 0.0)
  log_r = jnp.clip(d, -MAX_LOG_RATIO, MAX_LOG_RATIO)
  below, above = m & (log_r <= log_lo), m & (log_r >= log_hi)
  keep = m & ~below & ~above
  r = jnp.exp(log_r)
  per = -r * advantages.astype(jnp.float32) * (logp if literal else 1.0)

  def rsum(x, where):
    return jnp.sum(jnp.where(where, x, 0.0), axis=1)

  cols = [
    rsum(per, keep),
    rsum(1.0, m),
    rsum(1.0, below),
    rsum(1.0, above),
    rsum(jnp.abs(log_r), m),
    rsum(r, m),
    rsum(jnp.expm1(log_r) - log_r, m),
    jnp.max(jnp.where(m, r, 0.0), axis=1),
  ]
  return jnp.stack(cols, axis=1)
