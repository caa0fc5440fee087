"""Mixture-of-experts feed-forward (Qwen3-MoE): softmax router, top-k, grouped SwiGLU experts.

Shapes: N = tokens (B * T flattened), D = model width, E = experts, k = experts per token,
F = expert MLP width, M = N * k routed (token, expert) pairs.

Dispatch is exact (no capacity, no dropped tokens) and has no Python loop over experts: the M
(token, expert) pairs are sorted by expert, the expert matmuls run as one grouped matmul
(`jax.lax.ragged_dot` over contiguous groups), and the outputs are weighted and scatter-added back
to their tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig
from sao_jax.models.layers import F32, KeyGen, param


class MoE(nnx.Module):
  """Top-k routed SwiGLU experts with load-balancing statistics."""

  def __init__(self, cfg: ModelConfig, *, keys: KeyGen):
    d, e, f = cfg.d_model, cfg.num_experts, cfg.moe_mlp_dim
    pd, std = cfg.weight_dtype, cfg.init_std
    self.cfg = cfg
    self.router = param(keys, (d, e), (shd.EMBED, None), pd, std)
    self.gate_proj = param(keys, (e, d, f), (shd.EXPERT, shd.EMBED, shd.MLP), pd, std)
    self.up_proj = param(keys, (e, d, f), (shd.EXPERT, shd.EMBED, shd.MLP), pd, std)
    self.down_proj = param(keys, (e, f, d), (shd.EXPERT, shd.MLP, shd.EMBED), pd, std)

  def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Routes every token to its top-k experts.

    Args:
      x_btd: [B, T, D] normalized input (compute dtype).

    Returns:
      (y_btd [B, T, D], metrics) where metrics holds float32 scalars `moe/load_balance_loss`
      (E * sum_e f_e * P_e, = k for perfect balance; differentiable in the router) and
      `moe/max_load` (largest expert load over the uniform load N * k / E). Every token counts,
      padding included.

    References:
      Switch Transformer load-balancing loss, arXiv 2101.03961; Qwen3 technical report 2505.09388.
    """
    b, t, d = x_btd.shape
    dt = self.cfg.compute_dtype
    x_nd = x_btd.reshape(b * t, d)
    logits_ne = jnp.dot(x_nd, self.router[...].astype(dt), preferred_element_type=F32)
    probs_ne = jax.nn.softmax(logits_ne, axis=-1)
    weights_nk, experts_nk = jax.lax.top_k(probs_ne, self.cfg.experts_per_token)
    if self.cfg.norm_topk_prob:
      weights_nk = weights_nk / jnp.sum(weights_nk, axis=-1, keepdims=True)
    y_nd = routed_swiglu(
      x_nd,
      experts_nk,
      weights_nk.astype(dt),
      self.gate_proj[...].astype(dt),
      self.up_proj[...].astype(dt),
      self.down_proj[...].astype(dt),
    )
    return y_nd.reshape(b, t, d), load_balance_stats(probs_ne, experts_nk)


def routed_swiglu(
  x_nd: jax.Array,
  experts_nk: jax.Array,
  weights_nk: jax.Array,
  gate_edf: jax.Array,
  up_edf: jax.Array,
  down_efd: jax.Array,
) -> jax.Array:
  """sum_j weights[n, j] * SwiGLU_{experts[n, j]}(x[n]) as one sort + three grouped matmuls.

  Args:
    x_nd: [N, D] tokens.
    experts_nk: [N, k] int expert ids.
    weights_nk: [N, k] routing weights.
    gate_edf: [E, D, F] expert gate projections.
    up_edf: [E, D, F] expert up projections.
    down_efd: [E, F, D] expert down projections.

  Returns:
    [N, D] in x's dtype.
  """
  k = experts_nk.shape[1]
  num_experts = gate_edf.shape[0]
  flat_m = experts_nk.reshape(-1)  # [M]
  order_m = jnp.argsort(flat_m, stable=True)
  token_m = order_m // k  # source token of each sorted pair
  group_sizes_e = jnp.bincount(flat_m, length=num_experts).astype(jnp.int32)
  xs_md = x_nd[token_m]
  g = jax.lax.ragged_dot(xs_md, gate_edf, group_sizes_e)  # [M, F]
  u = jax.lax.ragged_dot(xs_md, up_edf, group_sizes_e)
  ys_md = jax.lax.ragged_dot(jax.nn.silu(g) * u, down_efd, group_sizes_e)  # [M, D]
  ys_md = ys_md * weights_nk.reshape(-1)[order_m][:, None]
  return jnp.zeros_like(x_nd).at[token_m].add(ys_md)


def load_balance_stats(probs_ne: jax.Array, experts_nk: jax.Array) -> dict[str, jax.Array]:
  """Router statistics: the load-balancing loss and the most loaded expert's relative load.

  Args:
    probs_ne: [N, E] float32 router probabilities (before top-k).
    experts_nk: [N, k] chosen experts.

  Returns:
    {'moe/load_balance_loss': E * sum_e f_e * P_e with f_e = (pairs routed to e) / N and P_e the
    mean router probability of e; 'moe/max_load': max_e count_e / (N * k / E)}.
  """
  n, k = experts_nk.shape
  e = probs_ne.shape[-1]
  counts_e = jnp.bincount(experts_nk.reshape(-1), length=e).astype(F32)
  lb = e * jnp.sum(counts_e / n * jnp.mean(probs_ne, axis=0))
  return {"moe/load_balance_loss": lb, "moe/max_load": jnp.max(counts_e) / (n * k / e)}
