"""Pallas kernel for the DIS loss: all per-row statistics in one pass over `[B, T]`, custom_vjp.

Shapes: B = trajectories (rows), T = tokens, bb / bt = block sizes, S = 8 statistics (see
`reference.STATS`).

Forward: grid (B/bb, T/bt); every grid step reads four `[bb, bt]` tiles (log-probs, rollout
log-probs, advantages, mask) and writes its own `[bb, S]` partial statistics to a `[T/bt, B, S]`
output; the T-blocks are reduced outside the kernel (sum, and max for ratio_max). No output block is
revisited, so grid steps are independent (parallel on TPU and GPU). Backward: an elementwise kernel
on the same grid, d loss_sum_b / d logp_bt = −keep · r · A (literal: −keep · r · A · (1 + logp)),
times the row's cotangent. Rollout log-probs and advantages get zero cotangents (they are constants
of the DIS objective, as in `sao_jax.losses`). `jax.grad` through `pallas_call` itself is not
supported, hence the custom_vjp.

Edges: blocks that overhang B or T are masked with iotas against the true sizes (interpret mode pads
them with uninitialized values; real devices read garbage), so any B, T works.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.dis_loss.reference import MAX_LOG_RATIO, STATS

_F32 = jnp.float32
_S = len(STATS)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the DIS kernel.

  Attributes:
    block_b: rows per tile (TPU: a multiple of 8, or >= B).
    block_t: tokens per tile (TPU: a multiple of 128, or >= T).
  """

  block_b: int = 8
  block_t: int = 2048

  @classmethod
  def get_default(cls, interpret: bool = False) -> BlockSizes:
    # Interpreted Pallas pays per grid step: big tiles on CPU.
    return cls(64, 8192) if interpret else cls()

  def clamp(self, b: int, t: int) -> BlockSizes:
    return BlockSizes(min(self.block_b, b), min(self.block_t, t))


@dataclasses.dataclass(frozen=True)
class KernelConfig:
  """Static (hashable) kernel configuration.

  Attributes:
    log_lo: log(1 − eps_low); log-ratios at or below it are masked.
    log_hi: log(1 + eps_high); log-ratios at or above it are masked.
    literal: the printed objective (per-token loss times logp) instead of the detached one.
    blocks: tile sizes.
    interpret: run in Pallas interpret mode (CPU).
  """

  log_lo: float
  log_hi: float
  literal: bool
  blocks: BlockSizes
  interpret: bool


def _load_tile(logp_ref, roll_ref, adv_ref, mask_ref, b: int, t: int):
  """Masked f32 tiles: (mask, logp, log r, advantages), [bb, bt] each, 0 off the mask."""
  bb, bt = logp_ref.shape
  rows = pl.program_id(0) * bb + lax.broadcasted_iota(jnp.int32, (bb, bt), 0)
  cols = pl.program_id(1) * bt + lax.broadcasted_iota(jnp.int32, (bb, bt), 1)
  m = (rows < b) & (cols < t) & (mask_ref[...] > 0)
  logp = jnp.where(m, logp_ref[...], 0.0)
  log_r = jnp.clip(logp - jnp.where(m, roll_ref[...], 0.0), -MAX_LOG_RATIO, MAX_LOG_RATIO)
  return m, logp, log_r, jnp.where(m, adv_ref[...], 0.0)


def _fwd_kernel(
  logp_ref, roll_ref, adv_ref, mask_ref, out_ref, *, cfg: KernelConfig, b: int, t: int
):
  m, logp, log_r, adv = _load_tile(logp_ref, roll_ref, adv_ref, mask_ref, b, t)
  below = m & (log_r <= cfg.log_lo)
  above = m & (log_r >= cfg.log_hi)
  keep = m & ~below & ~above
  r = jnp.exp(log_r)
  per = -r * adv * (logp if cfg.literal else 1.0)
  f = lambda x: x.astype(_F32)
  cols = [
    jnp.where(keep, per, 0.0),
    f(m),
    f(below),
    f(above),
    jnp.where(m, jnp.abs(log_r), 0.0),
    jnp.where(m, r, 0.0),
    jnp.where(m, r - 1.0 - log_r, 0.0),  # k3; plain exp keeps to ops every backend lowers
  ]
  sums = [jnp.sum(c, axis=1, keepdims=True) for c in cols]  # [bb, 1] each
  sums.append(jnp.max(jnp.where(m, r, 0.0), axis=1, keepdims=True))
  # Assemble [bb, S] with selects (portable: no lane concatenation or strided stores).
  lane = lax.broadcasted_iota(jnp.int32, (logp.shape[0], _S), 1)
  block = jnp.zeros((logp.shape[0], _S), _F32)
  for k, s in enumerate(sums):
    block = jnp.where(lane == k, s, block)
  out_ref[...] = block


def _bwd_kernel(
  logp_ref, roll_ref, adv_ref, mask_ref, g_ref, dlogp_ref, *, cfg: KernelConfig, b, t
):
  m, logp, log_r, adv = _load_tile(logp_ref, roll_ref, adv_ref, mask_ref, b, t)
  keep = m & (log_r > cfg.log_lo) & (log_r < cfg.log_hi)
  d = -jnp.exp(log_r) * adv * ((1.0 + logp) if cfg.literal else 1.0)
  dlogp_ref[...] = jnp.where(keep, g_ref[...] * d, 0.0)  # g: [bb, 1] per-row cotangent


def _specs(b: int, t: int, blocks: BlockSizes):
  bs = blocks.clamp(b, t)
  grid = (pl.cdiv(b, bs.block_b), pl.cdiv(t, bs.block_t))
  tok = pl.BlockSpec((bs.block_b, bs.block_t), lambda i, j: (i, j))
  return bs, grid, tok


def _row_stats_fwd_call(logp, roll, adv, maskf, cfg: KernelConfig):
  """[B, S] row statistics via the forward kernel and a reduction over T-blocks."""
  b, t = logp.shape
  bs, grid, tok = _specs(b, t, cfg.blocks)
  partial = pl.pallas_call(
    functools.partial(_fwd_kernel, cfg=cfg, b=b, t=t),
    out_shape=jax.ShapeDtypeStruct((grid[1], b, _S), _F32),
    grid=grid,
    in_specs=[tok] * 4,
    out_specs=pl.BlockSpec((None, bs.block_b, _S), lambda i, j: (j, i, 0)),
    interpret=cfg.interpret,
    name="dis_loss_fwd",
  )(logp, roll, adv, maskf)  # [T/bt, B, S]
  return jnp.concatenate([partial[..., :-1].sum(0), partial[..., -1:].max(0)], axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def dis_row_stats(logp, roll, adv, maskf, cfg: KernelConfig):
  """Per-row DIS statistics [B, S] (f32 inputs, mask as f32 0/1); differentiable in logp."""
  return _row_stats_fwd_call(logp, roll, adv, maskf, cfg)


def _vjp_fwd(logp, roll, adv, maskf, cfg):
  return _row_stats_fwd_call(logp, roll, adv, maskf, cfg), (logp, roll, adv, maskf)


def _vjp_bwd(cfg, res, g_bs):
  logp, roll, adv, maskf = res
  b, t = logp.shape
  bs, grid, tok = _specs(b, t, cfg.blocks)
  dlogp = pl.pallas_call(
    functools.partial(_bwd_kernel, cfg=cfg, b=b, t=t),
    out_shape=jax.ShapeDtypeStruct((b, t), _F32),
    grid=grid,
    in_specs=[tok] * 4 + [pl.BlockSpec((bs.block_b, 1), lambda i, j: (i, 0))],
    out_specs=tok,
    interpret=cfg.interpret,
    name="dis_loss_bwd",
  )(logp, roll, adv, maskf, g_bs[:, :1])  # only loss_sum depends on logp
  zeros = jnp.zeros_like(logp)
  return dlogp, zeros, zeros, zeros


dis_row_stats.defvjp(_vjp_fwd, _vjp_bwd)
