"""KV-cache inference for a continuous-batching engine: pure, jit-able, static shapes.

Shapes: L = layers, S = cache slots (sequences in flight), M = max tokens per slot, K = KV heads,
H = head width, P = prompts in one prefill call, Tb = their padded (bucket) length, V = vocabulary.

The cache holds `k`, `v`: one [S, K, M, H] array per layer (a tuple of L), and `lengths` [S]
(tokens held per slot). One buffer per layer, heads before positions: a decode step updates each
layer's buffer in place and attends to it directly, with no gather, slice or transpose of the cache
(with a stacked [L, S, M, K, H] cache those copies cost more than the weights at M = 512).
Positions are cache indices, so a slot's positions start at 0. Every call writes only the rows it
is given (a scatter with out-of-range indices dropped), so other slots are untouched:

  cache = init_cache(cfg, num_slots=16, max_len=2048)
  cache, logits_pv = prefill(policy, cache, tokens_pt, lengths_p, slots_p)   # new prompts
  cache, logits_pv = extend(policy, cache, tokens_pt, lengths_p, slots_p)    # append (observation)
  cache, logits_sv = decode_step(policy, cache, tokens_s, active_s)          # one token per slot
  cache, logits_sv = decode_step(policy, cache, tokens_s, active_s, window=256)  # keys < 256 only

All return float32 next-token logits, equal (to float32 rounding) to `Policy.logits` on the same
prefix, so sampling log-probs match training log-probs. `model_or_params` is a Policy or a
`(graphdef, state)` pair from `nnx.split(policy)`; all functions work under `jax.jit` (donate the
cache). Padded prompt tokens beyond a slot's length write garbage keys past the slot's end; they
are never attended (keys must be <= the query position) and are overwritten by later tokens.

Attention reads only the first `window` positions of each slot: a prefill's own bucket length, and
for `decode_step` an optional static `window` (the engine passes the smallest of a few compiled
sizes that covers its longest active sequence), so a step costs what the sequences hold, not M.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig
from sao_jax.models.layers import F32

# Logical axes of each layer's k and v: [S, K, M, H].
_KV_AXES = (shd.BATCH, shd.KV_HEADS, None, None)


@flax.struct.dataclass
class KVCache:
  """Keys/values of every layer for `S` slots of `M` tokens, and each slot's length.

  Attributes:
    k: L arrays [S, K, M, H], keys (after RoPE and q/k norm), one per layer.
    v: L arrays [S, K, M, H], values.
    lengths: int32[S] tokens held per slot.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: jax.Array

  @property
  def num_slots(self) -> int:
    return self.k[0].shape[0]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[2]


def init_cache(cfg: ModelConfig, num_slots: int, max_len: int, dtype: Any = None) -> KVCache:
  """An empty cache: zeros, all lengths 0.

  Args:
    cfg: the model config.
    num_slots: S, sequences held at once.
    max_len: M, tokens per slot (prompt + generation).
    dtype: cache dtype (default: the config's compute dtype).

  Returns:
    A KVCache.
  """
  if num_slots < 1 or max_len < 1:
    raise ValueError(f"init_cache: num_slots and max_len must be >= 1, got {num_slots}, {max_len}")
  shape = (num_slots, cfg.num_kv_heads, max_len, cfg.head_dim)
  dtype = cfg.compute_dtype if dtype is None else jnp.dtype(dtype)
  zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
  return KVCache(zeros(), zeros(), jnp.zeros((num_slots,), jnp.int32))


def cache_shardings(cache: KVCache, mesh: jax.sharding.Mesh, rules: shd.Rules = shd.DEFAULT_RULES):
  """NamedShardings for a cache: slots over the batch axes, KV heads over the heads axis.

  Args:
    cache: a KVCache (concrete or abstract).
    mesh: the device mesh.
    rules: logical -> mesh rules.

  Returns:
    A KVCache of NamedShardings (e.g. for `jax.device_put` or jit `out_shardings`).
  """
  sizes = dict(mesh.shape)
  kv = shd.logical_to_spec(_KV_AXES, rules, shape=cache.k[0].shape, mesh_sizes=sizes)
  lengths = shd.logical_to_spec((shd.BATCH,), rules, shape=cache.lengths.shape, mesh_sizes=sizes)
  named = lambda spec: jax.sharding.NamedSharding(mesh, spec)
  layers = tuple(named(kv) for _ in cache.k)
  return KVCache(layers, layers, named(lengths))


def prefill(
  model_or_params: Any,
  cache: KVCache,
  tokens_pt: jax.Array,
  lengths_p: jax.Array,
  slots_p: jax.Array,
) -> tuple[KVCache, jax.Array]:
  """Writes P new prompts into chosen slots (replacing their content) and scores the next token.

  Args:
    model_or_params: a Policy, or `(graphdef, state)` of one.
    cache: the shared cache.
    tokens_pt: [P, Tb] int prompts, right-padded to a static bucket length Tb <= M.
    lengths_p: [P] true prompt lengths (1..Tb).
    slots_p: [P] distinct slot indices to write.

  Returns:
    (cache with `lengths[slots] = lengths_p`, f32[P, V] logits after each prompt's last token).
  """
  starts_p = jnp.zeros_like(jnp.asarray(slots_p, jnp.int32))
  window = min(jnp.shape(tokens_pt)[1], cache.max_len)  # a prompt from 0 sees only its bucket
  return _write_and_score(
    model_or_params, cache, tokens_pt, starts_p, lengths_p, slots_p, window=window
  )


def extend(
  model_or_params: Any,
  cache: KVCache,
  tokens_pt: jax.Array,
  lengths_p: jax.Array,
  slots_p: jax.Array,
) -> tuple[KVCache, jax.Array]:
  """Appends P token chunks after what their slots already hold (multi-turn observations).

  Args:
    model_or_params: a Policy, or `(graphdef, state)` of one.
    cache: the shared cache.
    tokens_pt: [P, Tb] int chunks, right-padded.
    lengths_p: [P] true chunk lengths (1..Tb).
    slots_p: [P] distinct slot indices.

  Returns:
    (cache with `lengths[slots] += lengths_p`, f32[P, V] logits after each chunk's last token).
  """
  starts_p = cache.lengths[jnp.asarray(slots_p, jnp.int32)]
  return _write_and_score(model_or_params, cache, tokens_pt, starts_p, lengths_p, slots_p)


def decode_step(
  model_or_params: Any,
  cache: KVCache,
  tokens_s: jax.Array,
  active_s: jax.Array,
  *,
  window: int | None = None,
) -> tuple[KVCache, jax.Array]:
  """Appends one token to every active slot and scores the next one.

  Args:
    model_or_params: a Policy, or `(graphdef, state)` of one.
    cache: the shared cache.
    tokens_s: [S] int, the token to append per slot (ignored where inactive).
    active_s: [S] bool; inactive slots are not written and keep their length.
    window: static; attend to cache positions < window only (default M). It must exceed every
      active slot's length (not checked: keys beyond it would silently be left out).

  Returns:
    (cache, f32[S, V] logits; rows of inactive slots are meaningless).
  """
  if window is not None and not 1 <= window <= cache.max_len:
    raise ValueError(f"decode_step: window {window} must lie in [1, max_len={cache.max_len}]")
  s = cache.num_slots
  lengths_s = jnp.asarray(active_s, jnp.int32)
  tokens_s1 = jnp.asarray(tokens_s, jnp.int32).reshape(s, 1)
  return _write_and_score(
    model_or_params, cache, tokens_s1, cache.lengths, lengths_s, None, window=window
  )


def _write_and_score(
  model_or_params, cache: KVCache, tokens_pt, starts_p, lengths_p, slots_p, *, window=None
):
  """Runs tokens at positions starts + 0..Tb-1 of their slots, writing K/V for the first lengths.

  `slots_p` None means every slot in order (P = S, decode): each layer then attends to its cache
  buffer as it is, with no gather. Attention reads cache positions < `window` (default M).
  """
  policy = _as_policy(model_or_params)
  tokens_pt = jnp.asarray(tokens_pt, jnp.int32)
  starts_p, lengths_p = jnp.asarray(starts_p, jnp.int32), jnp.asarray(lengths_p, jnp.int32)
  every_slot = slots_p is None
  slots_p = jnp.arange(cache.num_slots) if every_slot else jnp.asarray(slots_p, jnp.int32)
  p, tb = tokens_pt.shape
  m = cache.max_len
  positions_pt = starts_p[:, None] + jnp.arange(tb, dtype=jnp.int32)
  valid_pt = jnp.arange(tb)[None, :] < lengths_p[:, None]
  write_pt = jnp.where(valid_pt, positions_pt, m)  # m is out of range: the write is dropped
  slot_pt = jnp.broadcast_to(slots_p[:, None], (p, tb))
  window = m if window is None else window
  mask_ptw = jnp.arange(window)[None, None, :] <= positions_pt[:, :, None]
  kv = {"k": list(cache.k), "v": list(cache.v)}

  def hook(i, k_ptkh, v_ptkh):
    out = []
    for name, new in (("k", k_ptkh), ("v", v_ptkh)):
      # [S, K, M, H] at [slot, :, position, :] <- new [P, Tb, K, H] (advanced indices lead).
      layer = kv[name][i].at[slot_pt, :, write_pt].set(new.astype(kv[name][i].dtype), mode="drop")
      kv[name][i] = layer
      if window < m:
        layer = jax.lax.slice_in_dim(layer, 0, window, axis=2)
      out.append(layer if every_slot else layer[slots_p])
    return *out, mask_ptw

  h_ptd, _ = policy.model(tokens_pt, positions_pt, kv_hook=hook)
  last_pd = h_ptd[jnp.arange(p), jnp.maximum(lengths_p - 1, 0)]
  logits_pv = jnp.dot(last_pd, policy.lm_head_dv(), preferred_element_type=F32)
  lengths = cache.lengths.at[slots_p].set(starts_p + lengths_p)
  return KVCache(tuple(kv["k"]), tuple(kv["v"]), lengths), logits_pv


def _as_policy(model_or_params: Any):
  if isinstance(model_or_params, tuple) and len(model_or_params) == 2:
    return nnx.merge(*model_or_params)
  return model_or_params
