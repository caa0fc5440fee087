"""Chunked XLA path for fused token log-probs: never materializes the `[N, V]` logits.

Shapes: N = tokens (rows), D = model width, V = vocabulary size; bn, bv = row and vocabulary block
sizes. Only `[bn, bv]` logit tiles ever exist.

Forward: an outer loop over vocabulary blocks and an inner loop over row blocks keep per-row online
statistics (running max m, sum of exp s, sum of exp * (z - m), target logit), so W is read once
and h once per vocabulary block. Backward (`jax.custom_vjp`): the same loops recompute each tile
and form its logit cotangent

  dz = g_logp * (onehot - p) - g_ent * p * (log p + H)

then accumulate dh (an f32 `[N, D]` accumulator) and dW (one f32 `[D, bv]` block at a time).

Shapes that are not multiples of the blocks: the last block's start is clamped to `size - block`, so
it overlaps its predecessor; overlapping rows/columns are masked out of every sum, and overlapping
outputs are recomputed identically. No padded copy of h or W is ever made.

All math is float32 (bf16 inputs are multiplied with float32 accumulation); gradients come back in
the inputs' dtypes. The temperature is not differentiated (its cotangent is returned as zero).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32
_NEG = -1e30  # running-max start: finite, so (m_old - m_new) * 0 stays 0 (no inf * 0).
_HI = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the fused log-prob paths.

  Attributes:
    block_n: rows (tokens) per tile.
    block_v: vocabulary entries per tile.
  """

  block_n: int = 1024
  block_v: int = 8192

  @classmethod
  def get_default(cls) -> BlockSizes:
    return cls()

  def clamp(self, n: int, v: int) -> BlockSizes:
    """Block sizes no larger than the arrays (a block may not exceed its dimension)."""
    return BlockSizes(min(self.block_n, n), min(self.block_v, v))


def tile_cotangent(z, lse, ent, onehot, g_logp, g_ent):
  """Cotangent of the logits of one tile (shared with the Pallas backward).

  Args:
    z: [bn, bv] float32 logits (already divided by the temperature).
    lse: [bn, 1] log-sum-exp of each row over the whole vocabulary.
    ent: [bn, 1] entropy of each row.
    onehot: [bn, bv] bool, True at each row's target.
    g_logp: [bn, 1] cotangent of the target log-prob.
    g_ent: [bn, 1] cotangent of the entropy.

  Returns:
    [bn, bv] float32 d(loss)/dz.
  """
  logp = z - lse
  p = jnp.exp(logp)
  return g_logp * (onehot.astype(_F32) - p) - g_ent * p * (logp + ent)


def online_update(m, s, sz, z, col_ok):
  """Folds one logit tile into the running (max, sum exp, sum exp * (z - max)) of each row.

  Args:
    m, s, sz: [bn] running max, sum of exp(z - m), sum of exp(z - m) * (z - m).
    z: [bn, bv] float32 logits.
    col_ok: [bn, bv] or [bv] bool, columns that count (not padding or a clamped duplicate).

  Returns:
    The updated (m, s, sz), [bn] each.
  """
  m_new = jnp.maximum(m, jnp.max(jnp.where(col_ok, z, -jnp.inf), axis=-1))
  alpha = jnp.exp(m - m_new)
  zm = jnp.where(col_ok, z - m_new[:, None], 0.0)
  e = jnp.where(col_ok, jnp.exp(zm), 0.0)
  s_new = alpha * s + jnp.sum(e, axis=-1)
  sz_new = alpha * (sz + (m - m_new) * s) + jnp.sum(e * zm, axis=-1)
  return m_new, s_new, sz_new


def _start(i, block, size):
  """Start of block i, clamped so the block fits; entries before i * block are duplicates."""
  return jnp.minimum(i * block, size - block)


def _logits(h_blk, w_blk, inv_temp):
  """[bn, D] x [D, bv] -> [bn, bv] float32 logits divided by the temperature."""
  return jnp.dot(h_blk, w_blk, preferred_element_type=_F32, precision=_HI) * inv_temp


def _forward(h, w, tgt, inv_temp, bs: BlockSizes):
  """Returns (logprobs [N], entropy [N], lse [N]) in float32."""
  (n, _), v = h.shape, w.shape[1]
  bn, bv = bs.block_n, bs.block_v

  def v_step(j, carry):
    v0 = _start(j, bv, v)
    w_blk = lax.dynamic_slice_in_dim(w, v0, bv, axis=1)  # [D, bv]
    col = v0 + jnp.arange(bv)
    col_ok = col >= j * bv

    def n_step(i, carry):
      r0 = _start(i, bn, n)
      row_ok = (r0 + jnp.arange(bn)) >= i * bn
      old = [lax.dynamic_slice_in_dim(c, r0, bn) for c in carry]
      m, s, sz, tz = old
      z = _logits(lax.dynamic_slice_in_dim(h, r0, bn), w_blk, inv_temp)  # [bn, bv]
      t_blk = lax.dynamic_slice_in_dim(tgt, r0, bn)
      hit = col_ok & (col[None, :] == t_blk[:, None])
      new = (*online_update(m, s, sz, z, col_ok), tz + jnp.sum(jnp.where(hit, z, 0.0), -1))
      new = [jnp.where(row_ok, a, b) for a, b in zip(new, old, strict=True)]
      return tuple(
        lax.dynamic_update_slice_in_dim(c, x, r0, 0) for c, x in zip(carry, new, strict=True)
      )

    return lax.fori_loop(0, cdiv(n, bn), n_step, carry)

  zeros = jnp.zeros((n,), _F32)
  m, s, sz, tz = lax.fori_loop(0, cdiv(v, bv), v_step, (zeros + _NEG, zeros, zeros, zeros))
  lse = m + jnp.log(s)
  return tz - lse, jnp.log(s) - sz / s, lse


def _backward(h, w, tgt, inv_temp, lse, ent, g_logp, g_ent, bs: BlockSizes):
  """Returns (dh [N, D] in h.dtype, dW [D, V] in w.dtype)."""
  (n, d), v = h.shape, w.shape[1]
  bn, bv = bs.block_n, bs.block_v

  def v_step(j, carry):
    dh_acc, dw = carry
    v0 = _start(j, bv, v)
    w_blk = lax.dynamic_slice_in_dim(w, v0, bv, axis=1)  # [D, bv]
    col = v0 + jnp.arange(bv)
    col_ok = col >= j * bv

    def n_step(i, carry):
      dh_acc, dw_blk = carry
      r0 = _start(i, bn, n)
      row_ok = (r0 + jnp.arange(bn)) >= i * bn
      rows = lambda x: lax.dynamic_slice_in_dim(x, r0, bn)[:, None]
      h_blk = lax.dynamic_slice_in_dim(h, r0, bn)  # [bn, D]
      z = _logits(h_blk, w_blk, inv_temp)  # [bn, bv]
      onehot = col[None, :] == rows(tgt)
      dz = tile_cotangent(z, rows(lse), rows(ent), onehot, rows(g_logp), rows(g_ent))
      dz = jnp.where(row_ok[:, None], dz, 0.0) * inv_temp  # d/d(h @ W): rows counted once
      dh_blk = _dot_t(jnp.where(col_ok, dz, 0.0), w_blk)  # [bn, D]: columns counted once
      dh_old = lax.dynamic_slice_in_dim(dh_acc, r0, bn)
      dh_acc = lax.dynamic_update_slice_in_dim(dh_acc, dh_old + dh_blk, r0, 0)
      dw_blk = dw_blk + jnp.dot(h_blk.T, dz, preferred_element_type=_F32, precision=_HI)
      return dh_acc, dw_blk

    dh_acc, dw_blk = lax.fori_loop(0, cdiv(n, bn), n_step, (dh_acc, jnp.zeros((d, bv), _F32)))
    # Clamped duplicate columns get their full (identical) value again: a plain overwrite.
    return dh_acc, lax.dynamic_update_slice_in_dim(dw, dw_blk.astype(w.dtype), v0, 1)

  init = (jnp.zeros((n, d), _F32), jnp.zeros_like(w))
  dh_acc, dw = lax.fori_loop(0, cdiv(v, bv), v_step, init)
  return dh_acc.astype(h.dtype), dw


def _dot_t(a, b):
  """a @ b.T in float32: [bn, bv] x [D, bv] -> [bn, D]."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=_F32, precision=_HI)


def cdiv(a: int, b: int) -> int:
  """Ceiling division of Python ints."""
  return -(-a // b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(h, w, tgt, inv_temp, bs):
  logp, ent, _ = _forward(h, w, tgt, inv_temp, bs)
  return logp, ent


def _fused_fwd(h, w, tgt, inv_temp, bs):
  logp, ent, lse = _forward(h, w, tgt, inv_temp, bs)
  return (logp, ent), (h, w, tgt, inv_temp, lse, ent)


def _fused_bwd(bs, res, g):
  h, w, tgt, inv_temp, lse, ent = res
  g_logp, g_ent = (x.astype(_F32) for x in g)
  dh, dw = _backward(h, w, tgt, inv_temp, lse, ent, g_logp, g_ent, bs)
  return dh, dw, None, jnp.zeros_like(inv_temp)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_token_logprobs_xla(
  hidden_nd: jax.Array,
  lm_head_dv: jax.Array,
  targets_n: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  block_sizes: BlockSizes | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Target log-probs and entropies of softmax(h @ W / T), in vocabulary/row tiles (XLA loops).

  Args:
    hidden_nd: [N, D] hidden states (f32 or bf16).
    lm_head_dv: [D, V] output projection (f32 or bf16).
    targets_n: [N] int token ids in [0, V).
    temperature: T > 0 (Python float or traced scalar; not differentiated).
    block_sizes: tile sizes (default `BlockSizes.get_default()`), clamped to the array sizes.

  Returns:
    (logprobs_n, entropy_n): [N] float32 each; differentiable w.r.t. hidden and lm_head.

  References:
    Online softmax: Milakov & Gimelshein 2018, arXiv 1805.02867. Chunked linear cross-entropy:
    Wijmans et al. 2024 (Cut Your Losses), arXiv 2411.09009.
  """
  bs = (block_sizes or BlockSizes.get_default()).clamp(hidden_nd.shape[0], lm_head_dv.shape[1])
  inv_temp = 1.0 / jnp.asarray(temperature, _F32)
  return _fused(hidden_nd, lm_head_dv, targets_n.astype(jnp.int32), inv_temp, bs)
