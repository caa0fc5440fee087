"""Fused DIS loss: `dis_loss(...)` = `sao_jax.losses.dis_policy_loss(...)` in one Pallas pass.

`kernel.py` holds the Pallas forward/backward kernels (custom_vjp), `reference.py` the pure-jnp
per-row statistics they are tested against. Interpret mode is chosen automatically on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.dis_loss.kernel import BlockSizes, KernelConfig, dis_row_stats
from kernels.dis_loss.reference import STATS, dis_row_stats_reference
from sao_jax import losses

__all__ = ["STATS", "BlockSizes", "dis_loss", "dis_loss_terms", "dis_row_stats_reference"]


def dis_loss_terms(
  logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  action_mask: jax.Array,
  *,
  eps_low: float,
  eps_high: float,
  gradient: str = "detached",
  block_sizes: BlockSizes | None = None,
  interpret: bool | None = None,
) -> losses.LossTerms:
  """Unnormalized DIS loss from the kernel; same as `sao_jax.losses.dis_policy_loss_terms`.

  Args:
    logprobs, rollout_logprobs, advantages, action_mask: [B, T] as in `dis_policy_loss`.
    eps_low, eps_high: the band (Python numbers: they are compiled into the kernel).
    gradient: 'detached' or 'literal'.
    block_sizes: kernel tiles (default `BlockSizes.get_default(interpret)`).
    interpret: run the kernel in interpret mode (None: True exactly when the backend is CPU).

  Returns:
    LossTerms (accumulate over micro-batches, then `losses.finalize`).
  """
  shapes = {k: tuple(x.shape) for k, x in zip(
      ("logprobs", "rollout_logprobs", "advantages", "action_mask"),
      (logprobs, rollout_logprobs, advantages, action_mask), strict=True)}  # fmt: skip
  if len(set(shapes.values())) > 1 or logprobs.ndim != 2:
    raise ValueError(f"the DIS kernel takes four [B, T] arrays of one shape, got {shapes}")
  if gradient not in ("detached", "literal"):
    raise ValueError(f"gradient: must be 'detached' or 'literal', got {gradient!r}")
  if not all(isinstance(e, int | float) for e in (eps_low, eps_high)):
    raise ValueError("eps_low, eps_high: the kernel needs Python numbers (they are compiled in)")
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  lo, hi = losses.dis_log_band(eps_low, eps_high)
  blocks = block_sizes or BlockSizes.get_default(interpret)
  cfg = KernelConfig(float(lo), float(hi), gradient == "literal", blocks, bool(interpret))
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  stats = dis_row_stats(
    f32(logprobs),
    f32(jax.lax.stop_gradient(rollout_logprobs)),
    f32(jax.lax.stop_gradient(advantages)),
    f32(action_mask.astype(bool)),
    cfg,
  )  # [B, S]
  col = {name: stats[:, k] for k, name in enumerate(STATS)}
  metric_sums = {k: jax.lax.stop_gradient(jnp.sum(v)) for k, v in col.items() if k in STATS[2:-1]}
  return losses.LossTerms(
    jnp.sum(col["loss_sum"]),
    jnp.sum(col["count"]),
    metric_sums,
    {"ratio_max": jax.lax.stop_gradient(jnp.max(col["ratio_max"], initial=0.0))},
  )


def dis_loss(
  logprobs: jax.Array,
  rollout_logprobs: jax.Array,
  advantages: jax.Array,
  action_mask: jax.Array,
  *,
  eps_low: float,
  eps_high: float,
  gradient: str = "detached",
  block_sizes: BlockSizes | None = None,
  interpret: bool | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """DIS policy loss and metrics via the fused Pallas kernel (semantics of `dis_policy_loss`).

    loss = −Σ keep · r · A / max(Σ action_mask, 1),  keep = mask & (1 − eps_low < r < 1 + eps_high)

  Args:
    logprobs: [B, T] log π_θ (differentiated; the gradient comes from the backward kernel).
    rollout_logprobs: [B, T] log π_rollout.
    advantages: [B, T] advantages.
    action_mask: [B, T] bool.
    eps_low, eps_high: the band (Python numbers).
    gradient: 'detached' (default) or 'literal'.
    block_sizes: kernel tiles.
    interpret: None = automatic (interpret mode on CPU).

  Returns:
    (loss [], metrics): the same keys and values as `sao_jax.losses.dis_policy_loss`.

  References:
    GLM-5 arXiv 2602.15763 §4.1 (DIS); SAO arXiv 2607.07508.
  """
  return losses.finalize(
      dis_loss_terms(
          logprobs, rollout_logprobs, advantages, action_mask,
          eps_low=eps_low, eps_high=eps_high, gradient=gradient,
          block_sizes=block_sizes, interpret=interpret,
      )
  )  # fmt: skip
