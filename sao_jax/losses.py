"""Policy and value losses (DIS, PPO clip, decoupled PPO, value MSE, NLL, KL, entropy) and metrics.

Pure, jit-able functions. Token-level inputs share one shape, usually [B, T] (B = trajectories,
T = tokens); masks are bool. Losses are minimized. Only `logprobs` (and `values` in `value_loss`) is
differentiated: advantages, returns and every reference log-prob are wrapped in stop_gradient.

Reduction (design.md §3.3): a token mean divides by the number of counted tokens in the WHOLE batch
(for policy losses: every action token, including tokens the DIS band masks out).

Micro-batch accumulation. Every loss `X(...) -> (loss, metrics)` has a twin `X_terms(...) ->
LossTerms` holding the unnormalized pieces: `loss_sum` (sum of per-token losses), `count` (tokens in
the denominator), `sums` (metric numerators) and `maxes` (max-reduced metrics). Then

  terms = accumulate(terms_mb1, terms_mb2, ...)      # sums add, maxes take the max
  loss, metrics = finalize(terms)                    # loss_sum / max(count, 1), etc.

gives exactly the full-batch values, however the batch is split. For gradients, differentiate
`terms_mb.loss_sum / n` per micro-batch with n = the whole batch's count (for policy losses
`jnp.sum(action_mask)` over the full batch, known before splitting) and sum the gradients. When
several losses are combined, each uses its own count (e.g. positive_nll counts only tokens of
positive rows).

Metrics (flat names, token means over the loss's counted tokens unless noted):
  dis_policy_loss     dis_masked_below, dis_masked_above (fraction of action tokens outside the
                      band on each side), logp_abs_diff (|logp − rollout logp|), ratio_mean,
                      ratio_max (max), rollout_kl (k3 estimate of KL(π_rollout ‖ π_θ))
  ppo_clip_loss       clipfrac, dual_clipfrac, ratio_mean, ratio_max (max), ppo_kl (old − logp),
                      is_weight_mean and is_zero_frac (only with is_weights)
  decoupled_ppo_loss  behav_masked, behav_weight_mean, clipfrac, ratio_mean, ratio_max (max)
  value_loss          value_clipfrac, value_abs_err
  entropy_loss        entropy
  positive_nll_loss   nll_pos
  kl_loss             kl_<kind>
Ratios are formed from log-ratios clipped to ±20 (so they stay finite); that clip never changes a
DIS or PPO loss, whose bands/clips lie far inside it.

References:
  DIS: GLM-5 report arXiv 2602.15763 §4.1 and SAO arXiv 2607.07508. PPO: Schulman et al. 2017,
  arXiv 1707.06347; dual clip: Ye et al. 2020, arXiv 1912.09729; clip-higher and token-mean:
  DAPO arXiv 2503.14476. Decoupled PPO: AReaL arXiv 2505.24298. TIS: Yao et al. 2025 ("off-policy
  RL in disguise"). IcePop: Ring-1T arXiv 2510.18855. VAPO: arXiv 2504.05118. KL estimators
  k1/k2/k3: J. Schulman, "Approximating KL divergence" (2020).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

_F32 = jnp.float32
_MAX_LOG_RATIO = 20.0
_sg = jax.lax.stop_gradient

Metrics = dict[str, jax.Array]


class LossTerms(NamedTuple):
  """Unnormalized pieces of a token-mean loss; sum them over micro-batches with `accumulate`.

  Attributes:
    loss_sum: [] sum of per-token losses.
    count: [] float32 number of tokens in the denominator.
    sums: metric numerators; `finalize` divides each by `count`.
    maxes: metrics reduced by max.
  """

  loss_sum: jax.Array
  count: jax.Array
  sums: Metrics
  maxes: Metrics


def accumulate(*terms: LossTerms) -> LossTerms:
  """Combines the terms of several micro-batches (sums add, maxes take the max)."""
  out = terms[0]
  for t in terms[1:]:
    out = LossTerms(
      out.loss_sum + t.loss_sum,
      out.count + t.count,
      {k: out.sums[k] + t.sums[k] for k in out.sums},
      {k: jnp.maximum(out.maxes[k], t.maxes[k]) for k in out.maxes},
    )
  return out


def finalize(terms: LossTerms) -> tuple[jax.Array, Metrics]:
  """(loss_sum / max(count, 1), metrics): the full-batch token means."""
  n = jnp.maximum(terms.count, 1.0)
  metrics = {k: v / n for k, v in terms.sums.items()}
  metrics.update(terms.maxes)
  return terms.loss_sum / n, metrics


# ------------------------------------------------------------------------------------- helpers


def _check_same(**arrays):
  shapes = {k: tuple(jnp.shape(v)) for k, v in arrays.items() if v is not None}
  if len(set(shapes.values())) > 1:
    raise ValueError(f"token arrays must share one shape, got {shapes}")


def _log_ratio(a, b, mask):
  """a − b on the mask (0 elsewhere), clipped to ±20, float32."""
  d = jnp.where(mask, a.astype(_F32) - b.astype(_F32), 0.0)
  return jnp.clip(d, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def _msum(x, mask):
  return jnp.sum(jnp.where(mask, x, 0.0).astype(_F32))


def _mmax(x, mask):
  """Max over the mask (0 if the mask is empty)."""
  return jnp.where(jnp.any(mask), jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0).astype(_F32)


def _k3(log_r):
  """k3 estimate of KL(q ‖ p) from samples of q, given log r = log p − log q: r − 1 − log r."""
  return jnp.expm1(log_r) - log_r


def dis_log_band(eps_low, eps_high):
  """(log(1 − eps_low), log(1 + eps_high)): the DIS band on the log-ratio (Python floats if given).

  Comparing log r with these (instead of r with 1 ± eps) avoids exp's rounding, so a token exactly
  on an edge is classified the same way by every implementation.
  """
  if isinstance(eps_low, int | float) and isinstance(eps_high, int | float):
    if not (0.0 <= eps_low <= 1.0 and eps_high >= 0.0):
      raise ValueError(f"eps_low must be in [0, 1] and eps_high >= 0, got {eps_low}, {eps_high}")
    return (-math.inf if eps_low == 1.0 else math.log1p(-eps_low)), math.log1p(eps_high)
  return jnp.log1p(-jnp.asarray(eps_low, _F32)), jnp.log1p(jnp.asarray(eps_high, _F32))


# ---------------------------------------------------------------------------------------- DIS


def dis_policy_loss_terms(
  logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  action_mask: jax.Array,
  *,
  eps_low: float,
  eps_high: float,
  gradient: str = "detached",
) -> LossTerms:
  """Unnormalized DIS loss (see `dis_policy_loss`)."""
  _check_same(logprobs=logprobs, rollout=rollout_logprobs, adv=advantages, mask=action_mask)
  if gradient not in ("detached", "literal"):
    raise ValueError(f"gradient: must be 'detached' or 'literal', got {gradient!r}")
  m = action_mask.astype(bool)
  log_r = _log_ratio(logprobs, _sg(rollout_logprobs), m)
  lo, hi = dis_log_band(eps_low, eps_high)
  below, above = m & (_sg(log_r) <= lo), m & (_sg(log_r) >= hi)
  keep = m & ~below & ~above  # strict band: 1 − eps_low < r < 1 + eps_high
  r = jnp.exp(log_r)
  adv = _sg(advantages).astype(_F32)
  per_token = -r * adv
  if gradient == "literal":  # the printed objective f(r)·A·log π, f(r) differentiated too
    per_token = per_token * logprobs.astype(_F32)
  sums = {
    "dis_masked_below": _msum(1.0, below),
    "dis_masked_above": _msum(1.0, above),
    "logp_abs_diff": _msum(jnp.abs(_sg(log_r)), m),
    "ratio_mean": _msum(_sg(r), m),
    "rollout_kl": _msum(_k3(_sg(log_r)), m),
  }
  return LossTerms(_msum(per_token, keep), _msum(1.0, m), sums, {"ratio_max": _mmax(_sg(r), m)})


def dis_policy_loss(
  logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  action_mask: jax.Array,
  *,
  eps_low: float,
  eps_high: float,
  gradient: str = "detached",
) -> tuple[jax.Array, Metrics]:
  """DIS: importance ratio against the rollout policy, tokens outside the band masked (not clipped).

    r = exp(logp − rollout_logp),  keep = action_mask & (1 − eps_low < r < 1 + eps_high)
    loss = −Σ keep · r · A / max(Σ action_mask, 1)

  `gradient="detached"` (default): keep is a constant, so ∇loss = −keep·r·A·∇logp / n, the IS
  policy gradient. `gradient="literal"`: the printed objective f(r)·A·log π with f(r) = keep·r
  differentiated as well (∇ = −keep·r·A·(1 + log π)·∇log π / n; its value includes log π).

  Args:
    logprobs: [B, T] log π_θ of the taken tokens (differentiated).
    rollout_logprobs: [B, T] log π_rollout recorded by the engine.
    advantages: [B, T] advantages.
    action_mask: [B, T] bool.
    eps_low: band below 1 (reasoning 0.3, coding 0.8), in [0, 1].
    eps_high: band above 1 (reasoning 5.0, coding 3.0).
    gradient: 'detached' or 'literal'.

  Returns:
    (loss [], metrics) with the dis_policy_loss metrics of the module docstring.

  References:
    GLM-5 arXiv 2602.15763 §4.1 (DIS); SAO arXiv 2607.07508; algorithm.md §2 and §11.1.
  """
  return finalize(
      dis_policy_loss_terms(
          logprobs, rollout_logprobs, advantages, action_mask,
          eps_low=eps_low, eps_high=eps_high, gradient=gradient,
      )
  )  # fmt: skip


# ---------------------------------------------------------------------------------------- PPO


def _ppo_surrogate(log_u, adv, eps_low, eps_high):
  """Per-token clipped surrogate loss max(−A u, −A clip(u)) and whether the clip was active."""
  u = jnp.exp(log_u)
  pg1 = -adv * u
  pg2 = -adv * jnp.clip(u, 1.0 - eps_low, 1.0 + eps_high)
  return jnp.maximum(pg1, pg2), pg2 > pg1


def ppo_clip_loss_terms(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  eps_low: float,
  eps_high: float,
  dual_clip: float | None = None,
  is_weights: jax.Array | None = None,
) -> LossTerms:
  """Unnormalized PPO clip loss (see `ppo_clip_loss`)."""
  _check_same(logprobs=logprobs, old=old_logprobs, adv=advantages, mask=mask, w=is_weights)
  if dual_clip and not dual_clip > 1.0:
    raise ValueError(f"dual_clip: must be > 1 (or None/0 for off), got {dual_clip}")
  m = mask.astype(bool)
  log_u = _log_ratio(logprobs, _sg(old_logprobs), m)
  adv = _sg(advantages).astype(_F32)
  per_token, clipped = _ppo_surrogate(log_u, adv, eps_low, eps_high)
  dual = jnp.zeros_like(m)
  if dual_clip:
    dual = (adv < 0) & (per_token > -dual_clip * adv)
    per_token = jnp.where(dual, -dual_clip * adv, per_token)
  sums = {
    "clipfrac": _msum(1.0, m & clipped),
    "dual_clipfrac": _msum(1.0, m & dual),
    "ratio_mean": _msum(jnp.exp(_sg(log_u)), m),
    "ppo_kl": _msum(-_sg(log_u), m),
  }
  if is_weights is not None:
    w = _sg(is_weights).astype(_F32)
    per_token = per_token * w
    sums["is_weight_mean"] = _msum(w, m)
    sums["is_zero_frac"] = _msum(1.0, m & (w == 0))
  maxes = {"ratio_max": _mmax(jnp.exp(_sg(log_u)), m)}
  return LossTerms(_msum(per_token, m), _msum(1.0, m), sums, maxes)


def ppo_clip_loss(
  logprobs: jax.Array,
  old_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  eps_low: float,
  eps_high: float,
  dual_clip: float | None = None,
  is_weights: jax.Array | None = None,
) -> tuple[jax.Array, Metrics]:
  """PPO clipped surrogate with asymmetric clip (clip-higher), optional dual clip and IS weights.

    u = exp(logp − old_logp),  l = max(−A u, −A clip(u, 1 − eps_low, 1 + eps_high))
    dual clip (A < 0): l = min(l, −c A);   loss = Σ w · l / max(Σ mask, 1)

  Args:
    logprobs: [B, T] log π_θ (differentiated).
    old_logprobs: [B, T] log π_old (recomputed by the trainer, or the rollout log-probs).
    advantages: [B, T] advantages.
    mask: [B, T] bool, the tokens in the loss.
    eps_low, eps_high: clip range (verl 0.2 / 0.2; DAPO clip-higher 0.2 / 0.28).
    dual_clip: c > 1 for negative advantages (verl 3.0); None or 0 = off.
    is_weights: optional [B, T] per-token weights (TIS `tis_weights`, or IcePop / masked IS
      `masked_is_weights`); treated as constants.

  Returns:
    (loss [], metrics) with the ppo_clip_loss metrics of the module docstring.

  References:
    PPO arXiv 1707.06347; dual clip arXiv 1912.09729; DAPO arXiv 2503.14476.
  """
  return finalize(
      ppo_clip_loss_terms(
          logprobs, old_logprobs, advantages, mask,
          eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, is_weights=is_weights,
      )
  )  # fmt: skip


def tis_weights(
  train_logprobs: jax.Array, rollout_logprobs: jax.Array, mask: jax.Array, *, cap: float
) -> jax.Array:
  """Truncated IS weights min(π_train / π_rollout, cap), constant, 0 off the mask. [B, T] float32.

  References:
    Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"
    (TIS, cap C = 2).
  """
  log_k = _log_ratio(_sg(train_logprobs), _sg(rollout_logprobs), mask)
  return jnp.where(mask, jnp.minimum(jnp.exp(log_k), cap), 0.0)


def masked_is_weights(
  train_logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  mask: jax.Array,
  *,
  low: float,
  high: float,
) -> jax.Array:
  """Token-masked IS (IcePop): k = π_train / π_rollout kept where low ≤ k ≤ high, else 0. [B, T].

  IcePop uses the band [1/β, β] (GLM-5: β = 2); slime's icepop_function is inclusive likewise.

  References:
    Ring-1T arXiv 2510.18855 (IcePop); GLM-5 arXiv 2602.15763.
  """
  log_k = _log_ratio(_sg(train_logprobs), _sg(rollout_logprobs), mask)
  k = jnp.exp(log_k)
  return jnp.where(mask & (k >= low) & (k <= high), k, 0.0)


# ------------------------------------------------------------------------------ decoupled PPO


def decoupled_ppo_loss_terms(
  logprobs: jax.Array,
  prox_logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  eps: float,
  behav_cap: float,
  eps_high: float | None = None,
) -> LossTerms:
  """Unnormalized decoupled PPO loss (see `decoupled_ppo_loss`)."""
  _check_same(logprobs=logprobs, prox=prox_logprobs, rollout=rollout_logprobs, adv=advantages)
  _check_same(logprobs=logprobs, mask=mask)
  m = mask.astype(bool)
  log_u = _log_ratio(logprobs, _sg(prox_logprobs), m)
  behav = jnp.exp(_log_ratio(_sg(prox_logprobs), _sg(rollout_logprobs), m))
  keep = m & (behav <= behav_cap)
  adv = _sg(advantages).astype(_F32)
  surrogate, clipped = _ppo_surrogate(log_u, adv, eps, eps if eps_high is None else eps_high)
  sums = {
    "behav_masked": _msum(1.0, m & ~keep),
    "behav_weight_mean": _msum(behav, keep),
    "clipfrac": _msum(1.0, keep & clipped),
    "ratio_mean": _msum(jnp.exp(_sg(log_u)), m),
  }
  maxes = {"ratio_max": _mmax(jnp.exp(_sg(log_u)), m)}
  return LossTerms(_msum(behav * surrogate, keep), _msum(1.0, m), sums, maxes)


def decoupled_ppo_loss(
  logprobs: jax.Array,
  prox_logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  eps: float,
  behav_cap: float,
  eps_high: float | None = None,
) -> tuple[jax.Array, Metrics]:
  """AReaL decoupled PPO: clip against the proximal policy, weight by a detached behaviour ratio.

    u = π_θ / π_prox,  w = π_prox / π_rollout (constant),  keep = mask & (w ≤ behav_cap)
    loss = Σ_keep w · max(−A u, −A clip(u, 1 − eps, 1 + eps_high)) / max(Σ mask, 1)

  Tokens whose behaviour weight exceeds the cap are masked out (dropped), not clipped; they stay
  in the denominator.

  Args:
    logprobs: [B, T] log π_θ (differentiated).
    prox_logprobs: [B, T] log π_prox (the trainer's policy before this update).
    rollout_logprobs: [B, T] log π_behaviour recorded by the engine.
    advantages: [B, T] advantages.
    mask: [B, T] bool.
    eps: clip range (low, and high unless eps_high is given).
    behav_cap: behaviour weights above it are masked out.
    eps_high: optional separate upper clip.

  Returns:
    (loss [], metrics) with the decoupled_ppo_loss metrics of the module docstring.

  References:
    AReaL, arXiv 2505.24298 (decoupled PPO, behav_imp_weight_cap).
  """
  return finalize(
      decoupled_ppo_loss_terms(
          logprobs, prox_logprobs, rollout_logprobs, advantages, mask,
          eps=eps, behav_cap=behav_cap, eps_high=eps_high,
      )
  )  # fmt: skip


# -------------------------------------------------------------------------------------- value


def value_loss_terms(
  values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  *,
  old_values: jax.Array | None = None,
  clip: float | None = None,
) -> LossTerms:
  """Unnormalized value loss (see `value_loss`)."""
  _check_same(values=values, returns=returns, mask=mask, old_values=old_values)
  if clip and old_values is None:
    raise ValueError("value_loss: clip needs old_values")
  m = mask.astype(bool)
  v, ret = values.astype(_F32), _sg(returns).astype(_F32)
  sq = jnp.square(v - ret)
  clipped = jnp.zeros_like(m)
  if clip:
    old = _sg(old_values).astype(_F32)
    sq_c = jnp.square(old + jnp.clip(v - old, -clip, clip) - ret)
    clipped = sq_c > sq
    sq = jnp.maximum(sq, sq_c)
  sums = {"value_clipfrac": _msum(1.0, m & clipped), "value_abs_err": _msum(jnp.abs(v - ret), m)}
  return LossTerms(_msum(0.5 * sq, m), _msum(1.0, m), sums, {})


def value_loss(
  values: jax.Array,
  returns: jax.Array,
  mask: jax.Array,
  *,
  old_values: jax.Array | None = None,
  clip: float | None = None,
) -> tuple[jax.Array, Metrics]:
  """Token-mean 0.5 (V − R)², optionally PPO-clipped around the old values.

    clipped: 0.5 max((V − R)², (V_old + clip(V − V_old, −c, c) − R)²)

  Args:
    values: [B, T] V_φ (differentiated).
    returns: [B, T] targets R̂.
    mask: [B, T] bool (action tokens).
    old_values: [B, T] values before this update (needed for clipping).
    clip: clip range c; None or 0 = unclipped (the sao_jax default).

  Returns:
    (loss [], {"value_clipfrac", "value_abs_err"}).

  References:
    algorithm.md §3 and §11.2; PPO value clipping as in verl's compute_value_loss.
  """
  return finalize(value_loss_terms(values, returns, mask, old_values=old_values, clip=clip))


def explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
  """1 − Var(R − V) / Var(R) over the masked tokens (unbiased variances, +1e-5 as verl). Scalar.

  Args:
    values: [B, T] critic values.
    returns: [B, T] targets.
    mask: [B, T] bool.

  Returns:
    [] float32; 1 is a perfect critic, 0 no better than the mean, < 0 worse.
  """
  _check_same(values=values, returns=returns, mask=mask)
  m = mask.astype(bool)
  v, r = values.astype(_F32), returns.astype(_F32)

  def var(x):
    n = _msum(1.0, m)
    mean = _msum(x, m) / jnp.maximum(n, 1.0)
    return _msum(jnp.square(x - mean), m) / jnp.maximum(n - 1.0, 1.0)

  return 1.0 - var(r - v) / (var(r) + 1e-5)


# ------------------------------------------------------------------ entropy, NLL, KL penalties


def entropy_loss_terms(entropy: jax.Array, mask: jax.Array) -> LossTerms:
  """Unnormalized entropy bonus (see `entropy_loss`)."""
  _check_same(entropy=entropy, mask=mask)
  m = mask.astype(bool)
  total = _msum(entropy, m)
  return LossTerms(-total, _msum(1.0, m), {"entropy": _sg(total)}, {})


def entropy_loss(entropy: jax.Array, mask: jax.Array) -> tuple[jax.Array, Metrics]:
  """−(token-mean entropy): add `coef * loss` to maximize entropy. ({"entropy": mean}).

  Args:
    entropy: [B, T] per-token entropies (e.g. from kernels.fused_token_logprobs).
    mask: [B, T] bool.
  """
  return finalize(entropy_loss_terms(entropy, mask))


def positive_nll_loss_terms(
  logprobs: jax.Array, action_mask: jax.Array, positive: jax.Array
) -> LossTerms:
  """Unnormalized positive-example NLL (see `positive_nll_loss`)."""
  _check_same(logprobs=logprobs, mask=action_mask)
  if positive.shape != logprobs.shape[:1]:
    raise ValueError(f"positive: must be [B] = {logprobs.shape[:1]}, got {positive.shape}")
  m = action_mask.astype(bool) & positive.astype(bool)[:, None]
  nll = _msum(-logprobs.astype(_F32), m)
  return LossTerms(nll, _msum(1.0, m), {"nll_pos": _sg(nll)}, {})


def positive_nll_loss(
  logprobs: jax.Array, action_mask: jax.Array, positive: jax.Array
) -> tuple[jax.Array, Metrics]:
  """VAPO positive-example LM loss: token-mean NLL over the action tokens of positive rows.

  Args:
    logprobs: [B, T] log π_θ (differentiated).
    action_mask: [B, T] bool.
    positive: [B] bool, rows to imitate (e.g. reward ≥ 1: correct samples).

  Returns:
    (loss [], {"nll_pos": loss}); 0 if no row is positive. VAPO adds 0.1 × this.

  References:
    VAPO, arXiv 2504.05118 (positive-example LM loss, μ = 0.1).
  """
  return finalize(positive_nll_loss_terms(logprobs, action_mask, positive))


def kl_estimate(logprobs: jax.Array, ref_logprobs: jax.Array, *, kind: str = "k3") -> jax.Array:
  """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ.

    k1 = log π_θ − log π_ref,   k2 = ½ (log π_θ − log π_ref)²,   k3 = ρ − 1 − log ρ, ρ = π_ref/π_θ

  k1 is unbiased but high-variance (can be negative), k2 low-variance and biased, k3 unbiased,
  non-negative and low-variance. Log-ratios are clipped to ±20.

  Args:
    logprobs: [...] log π_θ of the sampled tokens.
    ref_logprobs: [...] log π_ref of the same tokens.
    kind: 'k1', 'k2' or 'k3'.

  Returns:
    [...] float32 per-token estimates.

  References:
    J. Schulman, "Approximating KL divergence", 2020.
  """
  d = jnp.clip(logprobs.astype(_F32) - ref_logprobs.astype(_F32), -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * jnp.square(d)
  if kind == "k3":
    return _k3(-d)
  raise ValueError(f"kind: must be 'k1', 'k2' or 'k3', got {kind!r}")


def kl_loss_terms(logprobs, ref_logprobs, mask, *, kind: str = "k3") -> LossTerms:
  """Unnormalized KL penalty (see `kl_loss`)."""
  _check_same(logprobs=logprobs, ref=ref_logprobs, mask=mask)
  m = mask.astype(bool)
  total = _msum(kl_estimate(logprobs, _sg(ref_logprobs), kind=kind), m)
  return LossTerms(total, _msum(1.0, m), {f"kl_{kind}": _sg(total)}, {})


def kl_loss(
  logprobs: jax.Array, ref_logprobs: jax.Array, mask: jax.Array, *, kind: str = "k3"
) -> tuple[jax.Array, Metrics]:
  """Token-mean KL(π_θ ‖ π_ref) penalty with estimator `kind` ({"kl_<kind>": mean}).

  Args:
    logprobs: [B, T] log π_θ (differentiated).
    ref_logprobs: [B, T] reference (or rollout) log-probs.
    mask: [B, T] bool.
    kind: 'k1', 'k2' or 'k3'.
  """
  return finalize(kl_loss_terms(logprobs, ref_logprobs, mask, kind=kind))
