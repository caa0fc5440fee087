"""Pallas kernels for fused token log-probs and entropies (TPU; interpret mode on CPU).

Shapes: N = tokens, D = model width, V = vocabulary; bn, bv = row and vocabulary tiles.

Forward: grid (N/bn, V/bv). Each step computes one `[bn, bv]` logit tile `h @ W / T` and writes
that tile's per-row statistics (max m, Σ exp(z − m), Σ exp(z − m)(z − m), target logit) to its own
slot of a `[V/bv, N, 4]` output: no output block is revisited, so the steps are independent. The
V/bv partial statistics are merged outside the kernel (a log-sum-exp merge over a small array).

Backward (`jax.custom_vjp`), two kernels that recompute the logit tiles:
  dh: grid (N/bn, V/bv), vocabulary innermost; an f32 `[bn, D]` VMEM accumulator, written once.
  dW: grid (V/bv, N/bn), rows innermost; an f32 `[D, bv]` VMEM accumulator, written once.
Both rely on the TPU executing the innermost grid axis sequentially on one core (Pallas TPU
semantics, also honoured by interpret mode). Triton (GPU) runs grid steps in parallel, so these
backward kernels are not valid there; `impl="auto"` uses the XLA path on GPU.

Edges: tiles overhanging N or V are masked with iotas (logits of padding columns are −inf, padding
columns of W and rows of h are zeroed before a matmul), so any N and V work without padded copies.
bf16 inputs: logits are accumulated in f32; the gradient matmuls take dz in the input dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.fused_logprobs.xla import BlockSizes, tile_cotangent

_F32 = jnp.float32
_NSTAT = 4  # m, s, sz, target logit


@dataclasses.dataclass(frozen=True)
class _Config:
  n: int
  v: int
  bn: int
  bv: int
  interpret: bool


def default_block_sizes(interpret: bool) -> BlockSizes:
  """TPU: 256 x 512 tiles (VMEM-sized for D up to ~8k in bf16); interpret mode: large tiles."""
  return BlockSizes(1024, 8192) if interpret else BlockSizes(256, 512)


def _dot(a, b, contract):
  """f32-accumulated matmul over the given contracting dims (exact f32 when inputs are f32)."""
  prec = lax.Precision.HIGHEST if a.dtype == _F32 and b.dtype == _F32 else None
  dims = ((contract[0],), (contract[1],)), ((), ())
  return lax.dot_general(a, b, dims, preferred_element_type=_F32, precision=prec)


def _logit_tile(h_ref, w_ref, inv_t_ref, cfg: _Config, i, j):
  """(z [bn, bv] f32 with −inf on padding columns, col ids [bn, bv], row ids [bn, bv])."""
  shape = (h_ref.shape[0], w_ref.shape[1])
  rows = i * cfg.bn + lax.broadcasted_iota(jnp.int32, shape, 0)
  cols = j * cfg.bv + lax.broadcasted_iota(jnp.int32, shape, 1)
  # 1/T is a (1, 1) block broadcast over the tile (no scalar extraction from VMEM).
  z = _dot(h_ref[...], w_ref[...], (1, 0)) * inv_t_ref[...]
  return jnp.where(cols < cfg.v, z, -jnp.inf), cols, rows


def _fwd_kernel(h_ref, w_ref, t_ref, inv_t_ref, out_ref, *, cfg: _Config):
  z, cols, _ = _logit_tile(h_ref, w_ref, inv_t_ref, cfg, pl.program_id(0), pl.program_id(1))
  ok = cols < cfg.v
  m = jnp.max(z, axis=1, keepdims=True)  # finite: every tile has a real column
  zm = jnp.where(ok, z - m, 0.0)
  e = jnp.where(ok, jnp.exp(zm), 0.0)
  stats = [
    m,
    jnp.sum(e, axis=1, keepdims=True),
    jnp.sum(e * zm, axis=1, keepdims=True),
    jnp.sum(jnp.where(ok & (cols == t_ref[...]), z, 0.0), axis=1, keepdims=True),
  ]
  lane = lax.broadcasted_iota(jnp.int32, (z.shape[0], _NSTAT), 1)
  block = jnp.zeros((z.shape[0], _NSTAT), _F32)
  for k, s in enumerate(stats):
    block = jnp.where(lane == k, s, block)
  out_ref[...] = block


def _tile_dz(h_ref, w_ref, t_ref, rv_ref, inv_t_ref, cfg: _Config, i, j):
  """Cotangent of the tile's pre-temperature logits h @ W, [bn, bv] f32 (0 on padding)."""
  z, cols, rows = _logit_tile(h_ref, w_ref, inv_t_ref, cfg, i, j)
  rv = rv_ref[...]  # [bn, 4]: lse, entropy, g_logp, g_ent
  dz = tile_cotangent(z, rv[:, 0:1], rv[:, 1:2], cols == t_ref[...], rv[:, 2:3], rv[:, 3:4])
  return jnp.where((cols < cfg.v) & (rows < cfg.n), dz, 0.0) * inv_t_ref[...]


def _dh_kernel(h_ref, w_ref, t_ref, rv_ref, inv_t_ref, dh_ref, acc_ref, *, cfg: _Config):
  i, j = pl.program_id(0), pl.program_id(1)

  @pl.when(j == 0)
  def _init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  dz = _tile_dz(h_ref, w_ref, t_ref, rv_ref, inv_t_ref, cfg, i, j)
  w = w_ref[...]
  col = j * cfg.bv + lax.broadcasted_iota(jnp.int32, w.shape, 1)
  w = jnp.where(col < cfg.v, w, jnp.zeros_like(w))  # padding columns may hold NaN garbage
  acc_ref[...] += _dot(dz.astype(w.dtype), w, (1, 1))  # [bn, bv] x [D, bv] -> [bn, D]

  @pl.when(j == pl.num_programs(1) - 1)
  def _write():
    dh_ref[...] = acc_ref[...].astype(dh_ref.dtype)


def _dw_kernel(h_ref, w_ref, t_ref, rv_ref, inv_t_ref, dw_ref, acc_ref, *, cfg: _Config):
  j, i = pl.program_id(0), pl.program_id(1)

  @pl.when(i == 0)
  def _init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  dz = _tile_dz(h_ref, w_ref, t_ref, rv_ref, inv_t_ref, cfg, i, j)
  h = h_ref[...]
  row = i * cfg.bn + lax.broadcasted_iota(jnp.int32, h.shape, 0)
  h = jnp.where(row < cfg.n, h, jnp.zeros_like(h))
  acc_ref[...] += _dot(h, dz.astype(h.dtype), (0, 0))  # [bn, D] x [bn, bv] -> [D, bv]

  @pl.when(i == pl.num_programs(1) - 1)
  def _write():
    dw_ref[...] = acc_ref[...].astype(dw_ref.dtype)


def _row_specs(cfg: _Config, d: int, rows_axis: int):
  """BlockSpecs of h, W, targets, row values and 1/T, for a grid whose rows axis is `rows_axis`."""
  r = lambda g: g[rows_axis]
  c = lambda g: g[1 - rows_axis]
  return [
    pl.BlockSpec((cfg.bn, d), lambda *g: (r(g), 0)),
    pl.BlockSpec((d, cfg.bv), lambda *g: (0, c(g))),
    pl.BlockSpec((cfg.bn, 1), lambda *g: (r(g), 0)),
    pl.BlockSpec((cfg.bn, 4), lambda *g: (r(g), 0)),
    pl.BlockSpec((1, 1), lambda *g: (0, 0)),
  ]


def _forward(h, w, tgt_n1, inv_t, cfg: _Config):
  """(logp [N], entropy [N], lse [N]) float32."""
  d = h.shape[1]
  grid = (pl.cdiv(cfg.n, cfg.bn), pl.cdiv(cfg.v, cfg.bv))
  specs = _row_specs(cfg, d, 0)
  part = pl.pallas_call(
    functools.partial(_fwd_kernel, cfg=cfg),
    out_shape=jax.ShapeDtypeStruct((grid[1], cfg.n, _NSTAT), _F32),
    grid=grid,
    in_specs=specs[:3] + specs[4:],
    out_specs=pl.BlockSpec((None, cfg.bn, _NSTAT), lambda i, j: (j, i, 0)),
    interpret=cfg.interpret,
    name="fused_logprobs_fwd",
  )(h, w, tgt_n1, inv_t)  # [V/bv, N, 4]
  m_j, s_j, sz_j, tz_j = (part[..., k] for k in range(_NSTAT))
  m = jnp.max(m_j, axis=0)
  scale = jnp.exp(m_j - m)
  s = jnp.sum(s_j * scale, axis=0)
  sz = jnp.sum(scale * (sz_j + (m_j - m) * s_j), axis=0)
  lse = m + jnp.log(s)
  return jnp.sum(tz_j, axis=0) - lse, jnp.log(s) - sz / s, lse


def _backward(h, w, tgt_n1, inv_t, rowvals, cfg: _Config):
  """(dh [N, D] in h.dtype, dW [D, V] in w.dtype)."""
  d = h.shape[1]
  nn, nv = pl.cdiv(cfg.n, cfg.bn), pl.cdiv(cfg.v, cfg.bv)
  args = (h, w, tgt_n1, rowvals, inv_t)
  dh = pl.pallas_call(
    functools.partial(_dh_kernel, cfg=cfg),
    out_shape=jax.ShapeDtypeStruct(h.shape, h.dtype),
    grid=(nn, nv),
    in_specs=_row_specs(cfg, d, 0),
    out_specs=pl.BlockSpec((cfg.bn, d), lambda i, j: (i, 0)),
    scratch_shapes=[pltpu.VMEM((cfg.bn, d), _F32)],
    interpret=cfg.interpret,
    name="fused_logprobs_dh",
  )(*args)
  dw = pl.pallas_call(
    functools.partial(_dw_kernel, cfg=cfg),
    out_shape=jax.ShapeDtypeStruct(w.shape, w.dtype),
    grid=(nv, nn),
    in_specs=_row_specs(cfg, d, 1),
    out_specs=pl.BlockSpec((d, cfg.bv), lambda j, i: (0, j)),
    scratch_shapes=[pltpu.VMEM((d, cfg.bv), _F32)],
    interpret=cfg.interpret,
    name="fused_logprobs_dw",
  )(*args)
  return dh, dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(h, w, tgt_n1, inv_t, cfg):
  logp, ent, _ = _forward(h, w, tgt_n1, inv_t, cfg)
  return logp, ent


def _fused_fwd(h, w, tgt_n1, inv_t, cfg):
  logp, ent, lse = _forward(h, w, tgt_n1, inv_t, cfg)
  return (logp, ent), (h, w, tgt_n1, inv_t, lse, ent)


def _fused_bwd(cfg, res, g):
  h, w, tgt_n1, inv_t, lse, ent = res
  rowvals = jnp.stack([lse, ent, g[0].astype(_F32), g[1].astype(_F32)], axis=1)  # [N, 4]
  dh, dw = _backward(h, w, tgt_n1, inv_t, rowvals, cfg)
  return dh, dw, None, jnp.zeros_like(inv_t)


_fused.defvjp(_fused_fwd, _fused_bwd)


def fused_token_logprobs_pallas(
  hidden_nd: jax.Array,
  lm_head_dv: jax.Array,
  targets_n: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  block_sizes: BlockSizes | None = None,
  interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Target log-probs and entropies of softmax(h @ W / T) with Pallas kernels.

  Args:
    hidden_nd: [N, D] hidden states (f32 or bf16).
    lm_head_dv: [D, V] output projection (f32 or bf16).
    targets_n: [N] int token ids in [0, V).
    temperature: T > 0 (not differentiated).
    block_sizes: tiles (default `default_block_sizes(interpret)`), clamped to N and V. On TPU
      block_n must be a multiple of 8 and block_v of 128 unless they cover N / V.
    interpret: Pallas interpret mode (None: True exactly when the backend is CPU).

  Returns:
    (logprobs_n, entropy_n): [N] float32 each; differentiable w.r.t. hidden and lm_head.

  References:
    Online softmax: arXiv 1805.02867. Cut Your Losses: arXiv 2411.09009.
  """
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  n, v = hidden_nd.shape[0], lm_head_dv.shape[1]
  bs = (block_sizes or default_block_sizes(interpret)).clamp(n, v)
  cfg = _Config(n, v, bs.block_n, bs.block_v, bool(interpret))
  inv_t = jnp.reshape(1.0 / jnp.asarray(temperature, _F32), (1, 1))
  return _fused(hidden_nd, lm_head_dv, targets_n.astype(jnp.int32)[:, None], inv_t, cfg)
