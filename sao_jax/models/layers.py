"""Decoder building blocks: RMSNorm, RoPE, grouped-query attention and the SwiGLU MLP.

Shapes: B = batch rows, T = query positions, S = key positions, D = model width, N = query heads,
K = key/value heads (N = K * G), H = head width, F = MLP width.

Parameters are stored in "kernel" layout (`[in, out]`, heads split out: q_proj `[D, N, H]`,
o_proj `[N, H, D]`) and carry logical axis names (sao_jax.sharding) as `out_sharding` metadata;
they are never sharded eagerly, so models work with or without a mesh. Matmuls run in the config's
compute dtype; norms, the RoPE rotation and the attention softmax run in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig

F32 = jnp.float32


class KeyGen:
  """Deterministic per-parameter random init from one PRNG key.

  Parameter i is drawn from `fold_in(key, i)` with jax.random when the key is traced (inside
  `nnx.eval_shape` or `jax.jit`, e.g. `sharding.create_sharded`), and from numpy seeded by
  `(key_data(key), i)` when it is concrete. Why: on CPU, XLA takes 1-4 s to compile jax.random's
  normal for each new shape (a 2-layer model took 20 s to create), while numpy is instant. The two
  paths give different draws (same distribution) for the same key. Not drawing from `nnx.Rngs` per
  parameter also matters: each draw updates a Variable, which under `nnx.eval_shape` costs time
  quadratic in the number of parameters.
  """

  def __init__(self, key: jax.Array):
    self._key, self._count = key, 0
    self._seed = (
      None
      if isinstance(key, jax.core.Tracer)
      else [int(x) for x in np.asarray(jax.random.key_data(key)).ravel()]
    )

  def normal(self, shape: Sequence[int], dtype: jnp.dtype, std: float) -> jax.Array:
    """std * N(0, 1) of `shape`, cast to `dtype`."""
    i, self._count = self._count, self._count + 1
    if self._seed is None:
      z = jax.random.normal(jax.random.fold_in(self._key, i), shape, F32)
      return (std * z).astype(dtype)
    z = np.random.default_rng([*self._seed, i]).standard_normal(shape, np.float32)
    return jnp.asarray((std * z).astype(dtype))


def param(
  keys: KeyGen | None,
  shape: Sequence[int],
  axes: Sequence[str | None],
  dtype: jnp.dtype,
  std: float | None,
) -> nnx.Param:
  """An nnx.Param ~ N(0, std^2) (or ones when std is None) tagged with logical axis names.

  Args:
    keys: the init key stream (unused for ones).
    shape: parameter shape.
    axes: one logical axis name (or None) per dimension.
    dtype: storage dtype.
    std: normal init std, or None for a ones init (norm scales).

  Returns:
    The Param, with `out_sharding=axes` metadata and eager sharding off.
  """
  if len(axes) != len(shape):
    raise ValueError(f"param: {len(axes)} axis names {tuple(axes)} for shape {tuple(shape)}")
  value = jnp.ones(shape, dtype) if std is None else keys.normal(shape, dtype, std)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


class RMSNorm(nnx.Module):
  """y = x / sqrt(mean(x^2) + eps) * scale, normalized in float32 (Llama/Qwen3 convention)."""

  def __init__(self, dim: int, *, eps: float, param_dtype: jnp.dtype):
    self.eps = eps
    self.scale = param(None, (dim,), (None,), param_dtype, None)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes the last axis. x: [..., dim]; returns the same shape and dtype."""
    x32 = x.astype(F32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    return y.astype(x.dtype) * self.scale[...].astype(x.dtype)


def rope(x_btnh: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
  """Rotary position embedding, rotate-half convention (HF Llama/Qwen3).

  Args:
    x_btnh: [B, T, N, H] queries or keys.
    positions_bt: [B, T] integer positions.
    theta: base frequency.

  Returns:
    [B, T, N, H], same dtype as x, rotated in float32.

  References:
    RoFormer, arXiv 2104.09864.
  """
  h = x_btnh.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=F32) / h))  # [H/2]
  angle_bti = positions_bt.astype(F32)[..., None] * inv_freq  # [B, T, H/2]
  cos, sin = jnp.cos(angle_bti)[:, :, None, :], jnp.sin(angle_bti)[:, :, None, :]
  x1, x2 = jnp.split(x_btnh.astype(F32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_btnh.dtype)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE and optional per-head q/k RMSNorm (Qwen3)."""

  def __init__(self, cfg: ModelConfig, *, keys: KeyGen):
    d, n, k, h = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pd, std = cfg.weight_dtype, cfg.init_std
    self.cfg = cfg
    self.q_proj = param(keys, (d, n, h), (shd.EMBED, shd.HEADS, shd.HEAD_DIM), pd, std)
    self.k_proj = param(keys, (d, k, h), (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), pd, std)
    self.v_proj = param(keys, (d, k, h), (shd.EMBED, shd.KV_HEADS, shd.HEAD_DIM), pd, std)
    self.o_proj = param(keys, (n, h, d), (shd.HEADS, shd.HEAD_DIM, shd.EMBED), pd, std)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, eps=cfg.norm_eps, param_dtype=pd)
      self.k_norm = RMSNorm(h, eps=cfg.norm_eps, param_dtype=pd)

  def project(self, x_btd: jax.Array, positions_bt: jax.Array):
    """Queries, keys and values with q/k norm and RoPE applied.

    Args:
      x_btd: [B, T, D] normalized input.
      positions_bt: [B, T] positions.

    Returns:
      (q_btnh [B, T, N, H], k_btkh [B, T, K, H], v_btkh [B, T, K, H]) in the compute dtype.
    """
    dt = self.cfg.compute_dtype
    q = jnp.einsum("btd,dnh->btnh", x_btd, self.q_proj[...].astype(dt))
    k = jnp.einsum("btd,dkh->btkh", x_btd, self.k_proj[...].astype(dt))
    v = jnp.einsum("btd,dkh->btkh", x_btd, self.v_proj[...].astype(dt))
    if self.cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = shd.constrain(
      rope(q, positions_bt, self.cfg.rope_theta), (shd.BATCH, None, shd.HEADS, None)
    )
    k = shd.constrain(
      rope(k, positions_bt, self.cfg.rope_theta), (shd.BATCH, None, shd.KV_HEADS, None)
    )
    return q, k, v

  def attend(
    self,
    q_btnh: jax.Array,
    k_bskh: jax.Array,
    v_bskh: jax.Array,
    mask_bts: jax.Array,
    *,
    heads_major: bool = False,
  ) -> jax.Array:
    """softmax(q k^T / sqrt(H) + mask) v, then the output projection.

    Args:
      q_btnh: [B, T, N, H] queries.
      k_bskh: [B, S, K, H] keys ([B, K, S, H] with heads_major).
      v_bskh: [B, S, K, H] values ([B, K, S, H] with heads_major).
      mask_bts: [B, T, S] bool, True where query t may attend key s. A row with no True entry
        gives a uniform average (finite, never NaN).
      heads_major: keys and values come as [B, K, S, H] (the inference KV cache's layout, which
        the two matmuls read without a transpose).

    Returns:
      [B, T, D] in the compute dtype.
    """
    b, t, n, h = q_btnh.shape
    kv = k_bskh.shape[1 if heads_major else 2]
    q = q_btnh.reshape(b, t, kv, n // kv, h)  # [B, T, K, G, H]
    keys = "bksh" if heads_major else "bskh"
    scores = jnp.einsum(
      f"btkgh,{keys}->bkgts", q, k_bskh.astype(q.dtype), preferred_element_type=F32
    ) * (h**-0.5)  # [B, K, G, T, S]
    scores = jnp.where(mask_bts[:, None, None], scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    out = jnp.einsum(f"bkgts,{keys}->btkgh", probs, v_bskh.astype(q.dtype)).reshape(b, t, n, h)
    out = shd.constrain(out, (shd.BATCH, None, shd.HEADS, None))
    return jnp.einsum("btnh,nhd->btd", out, self.o_proj[...].astype(q.dtype))


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(x @ gate) * (x @ up))."""

  def __init__(self, cfg: ModelConfig, *, keys: KeyGen):
    d, f, pd, std = cfg.d_model, cfg.mlp_dim, cfg.weight_dtype, cfg.init_std
    self.cfg = cfg
    self.gate_proj = param(keys, (d, f), (shd.EMBED, shd.MLP), pd, std)
    self.up_proj = param(keys, (d, f), (shd.EMBED, shd.MLP), pd, std)
    self.down_proj = param(keys, (f, d), (shd.MLP, shd.EMBED), pd, std)

  def __call__(self, x_btd: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """x_btd: [B, T, D]. Returns ([B, T, D], {}) (no auxiliary metrics for a dense MLP)."""
    dt = self.cfg.compute_dtype
    g = jnp.einsum("btd,df->btf", x_btd, self.gate_proj[...].astype(dt))
    u = jnp.einsum("btd,df->btf", x_btd, self.up_proj[...].astype(dt))
    h = shd.constrain(jax.nn.silu(g) * u, (shd.BATCH, None, shd.MLP))
    return jnp.einsum("btf,fd->btd", h, self.down_proj[...].astype(dt)), {}
