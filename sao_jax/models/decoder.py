"""The decoder trunk shared by the policy and the critic: embedding, L pre-norm blocks, final norm.

Shapes: B = rows, T = tokens per row, D = model width, S = key positions (T in training; the KV
cache length in inference).

Packed sequences: `segment_ids_bt` marks which trajectory each token belongs to; attention never
crosses segments, and when `positions_bt` is not given the positions restart at 0 in every
segment. The causal mask is by index within the row, so packed segments must be contiguous.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig
from sao_jax.models.layers import MLP, Attention, KeyGen, RMSNorm, param
from sao_jax.models.moe import MoE

# kv_hook(layer_index, k_btkh, v_btkh) -> (k_bksh, v_bksh, mask_bts): lets inference substitute
# cached keys/values (sao_jax.models.inference) for the block's own, heads before positions.
KVHook = Callable[[int, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


class Block(nnx.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(x)) (dense SwiGLU or MoE)."""

  def __init__(self, cfg: ModelConfig, *, keys: KeyGen):
    self.attn_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=cfg.weight_dtype)
    self.attn = Attention(cfg, keys=keys)
    self.mlp_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=cfg.weight_dtype)
    self.mlp = MoE(cfg, keys=keys) if cfg.is_moe else MLP(cfg, keys=keys)

  def __call__(
    self,
    x_btd: jax.Array,
    positions_bt: jax.Array,
    mask_bts: jax.Array | None,
    kv_hook: Callable | None = None,
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """One block. With `kv_hook`, keys/values/mask come from it (mask_bts is ignored).

    Returns:
      ([B, T, D] output, metrics dict of float32 scalars (MoE router stats, else empty)).
    """
    q, k, v = self.attn.project(self.attn_norm(x_btd), positions_bt)
    heads_major = kv_hook is not None
    if heads_major:
      k, v, mask_bts = kv_hook(k, v)
    x_btd = x_btd + self.attn.attend(q, k, v, mask_bts, heads_major=heads_major)
    x_btd = shd.constrain(x_btd, (shd.BATCH, None, None))
    y_btd, metrics = self.mlp(self.mlp_norm(x_btd))
    return shd.constrain(x_btd + y_btd, (shd.BATCH, None, None)), metrics


def _run_block(block: Block, x_btd, positions_bt, mask_bts):
  return block(x_btd, positions_bt, mask_bts)


class Decoder(nnx.Module):
  """Token embedding, `num_layers` blocks and the final RMSNorm."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    keys = KeyGen(rngs.params())
    self.embed = param(
      keys, (cfg.vocab_size, cfg.d_model), (shd.VOCAB, shd.EMBED), cfg.weight_dtype, cfg.init_std
    )
    self.layers = nnx.List([Block(cfg, keys=keys) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.d_model, eps=cfg.norm_eps, param_dtype=cfg.weight_dtype)

  def __call__(
    self,
    tokens_bt: jax.Array,
    positions_bt: jax.Array | None = None,
    segment_ids_bt: jax.Array | None = None,
    *,
    kv_hook: KVHook | None = None,
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Final hidden states.

    Args:
      tokens_bt: [B, T] int token ids.
      positions_bt: [B, T] positions (default: 0.. per row, restarting per segment).
      segment_ids_bt: [B, T] int segment ids for packed rows (default: one segment per row).
      kv_hook: inference only (see KVHook); replaces the causal/segment mask.

    Returns:
      (hidden_btd [B, T, D] in the compute dtype, metrics: float32 scalars averaged over layers).
    """
    tokens_bt = jnp.asarray(tokens_bt, jnp.int32)
    if positions_bt is None:
      positions_bt = default_positions(tokens_bt, segment_ids_bt)
    mask_bts = None if kv_hook is not None else causal_segment_mask(tokens_bt, segment_ids_bt)
    x = jnp.take(self.embed[...], tokens_bt, axis=0).astype(self.cfg.compute_dtype)
    x = shd.constrain(x, (shd.BATCH, None, None))
    run = nnx.remat(_run_block) if self.cfg.remat and kv_hook is None else _run_block
    totals: dict[str, jax.Array] = {}
    for i, block in enumerate(self.layers):
      if kv_hook is None:
        x, metrics = run(block, x, positions_bt, mask_bts)
      else:
        x, metrics = block(x, positions_bt, None, lambda k, v, i=i: kv_hook(i, k, v))
      for name, value in metrics.items():
        totals[name] = totals.get(name, 0.0) + value / len(self.layers)
    return self.final_norm(x), totals


def default_positions(tokens_bt: jax.Array, segment_ids_bt: jax.Array | None) -> jax.Array:
  """[B, T] int32 positions: 0..T-1 per row, or restarting at 0 at every segment start."""
  b, t = tokens_bt.shape
  idx_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  if segment_ids_bt is None:
    return idx_bt
  start_idx_bt = jax.lax.cummax(jnp.where(segment_starts(segment_ids_bt), idx_bt, 0), axis=1)
  return idx_bt - start_idx_bt


def segment_starts(segment_ids_bt: jax.Array) -> jax.Array:
  """[B, T] bool: True at t = 0 and wherever the segment id changes."""
  seg = jnp.asarray(segment_ids_bt)
  change = seg[:, 1:] != seg[:, :-1]
  return jnp.concatenate([jnp.ones_like(seg[:, :1], bool), change], axis=1)


def causal_segment_mask(tokens_bt: jax.Array, segment_ids_bt: jax.Array | None) -> jax.Array:
  """[B, T, T] bool: key s <= query t, and in the same segment when segment ids are given."""
  b, t = tokens_bt.shape
  causal_tt = jnp.tril(jnp.ones((t, t), bool))
  if segment_ids_bt is None:
    return jnp.broadcast_to(causal_tt, (b, t, t))
  same_bts = segment_ids_bt[:, :, None] == segment_ids_bt[:, None, :]
  return causal_tt[None] & same_bts
