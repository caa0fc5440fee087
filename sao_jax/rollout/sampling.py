"""Token sampling for the engine: temperature, top-k, top-p, greedy; pure and jit-able.

Shapes: S = rows (engine slots or prompts in a prefill), V = vocabulary.

Every row is sampled on its own: its token and log-prob depend only on its logits, its sampling
parameters, its seed and the index of the token in its output, never on the other rows (no
cross-row reduction, no batch-dependent branch). That is what makes the engine's outputs
independent of which requests happen to share a step.

Two choices keep it fast on CPU, where sorting a [32, 49152] array takes half a second:
  * Top-k / top-p cut-offs are found by bisection on the float bit patterns (32 halvings of a
    masked sum each), and only when some row asks for them (`lax.cond`); the result is the exact
    sorted-order cut-off, ties kept.
  * One uniform number per row picks the token by inverse CDF over the vocabulary in id order, in
    two levels (blocks of ~sqrt(V) ids, then ids in the block), so there is no [S, V] noise
    tensor.

The log-prob returned for a sampled token is under the distribution it was drawn from:
log softmax(logits / T) restricted to the kept set and renormalized. For greedy rows
(temperature 0) it is log softmax(logits)[argmax], the untruncated temperature-1 value.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

F32 = jnp.float32


def row_uniforms(engine_seed: int, seeds_s2: jax.Array, steps_s: jax.Array) -> jax.Array:
  """One uniform in [0, 1) per row: the draw for output token `steps_s` of request seed `seeds_s2`.

  A counter-based hash (a chain of murmur3 32-bit finalizers over engine seed, seed words and token
  index), so the draw is a pure function of those numbers. It compiles in a fraction of the time of
  threefry key folding, which matters because every prefill bucket inlines it.

  Args:
    engine_seed: the engine's seed (a Python int, static).
    seeds_s2: uint32[S, 2] request seeds as (low, high) 32-bit words (`split_seed`).
    steps_s: int32[S] index of the token in its request's output.

  Returns:
    float32[S], multiples of 2**-24.
  """
  h = _fmix32(jnp.full(steps_s.shape, engine_seed & 0xFFFFFFFF, jnp.uint32) + _GOLDEN)
  seeds_s2 = seeds_s2.astype(jnp.uint32)
  for word in (seeds_s2[:, 0], seeds_s2[:, 1], steps_s.astype(jnp.uint32)):
    h = _fmix32(h ^ (word * _GOLDEN + jnp.uint32(0x7F4A7C15)))
  return (h >> 8).astype(F32) * (1.0 / (1 << 24))


_GOLDEN = jnp.uint32(0x9E3779B9)


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer: a bijection on uint32 with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def split_seed(seed: int) -> tuple[int, int]:
  """A seed in [0, 2**63) as its (low, high) 32-bit words, the layout `row_uniforms` takes."""
  return seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF


def _sortable(x: jax.Array) -> jax.Array:
  """uint32 keys with the order of the float32 values of `x` (-inf smallest, +inf largest)."""
  b = jax.lax.bitcast_convert_type(x.astype(F32), jnp.uint32)
  negative = (b >> 31) == 1
  return jnp.where(negative, ~b, b | jnp.uint32(0x80000000))


def _largest_key(keys_sv: jax.Array, ok) -> jax.Array:
  """Per row, the largest uint32 t with ok(keys >= t) True (ok must be monotone, True at t = 0)."""
  s = keys_sv.shape[0]

  def body(_, lo_hi):
    lo, hi = lo_hi
    gap = hi - lo
    mid = lo + (gap >> 1) + (gap & 1)  # ceil((lo + hi) / 2) without overflow
    good = ok(keys_sv >= mid[:, None])
    return jnp.where(good, mid, lo), jnp.where(good, hi, mid - 1)

  lo = jnp.zeros((s,), jnp.uint32)
  hi = jnp.full((s,), 0xFFFFFFFF, jnp.uint32)
  lo, _ = jax.lax.fori_loop(0, 32, body, (lo, hi))
  return lo


def truncation_cutoff(scaled_sv: jax.Array, top_p_s: jax.Array, top_k_s: jax.Array) -> jax.Array:
  """Sortable key of the smallest kept logit per row: top-k first, then top-p on what is left.

  Args:
    scaled_sv: f32[S, V] temperature-scaled logits.
    top_p_s: f32[S] nucleus mass (>= 1: off).
    top_k_s: int32[S] tokens kept (<= 0: off).

  Returns:
    uint32[S]; a token is kept iff `_sortable(scaled) >= cutoff`. Rows with neither cut get 0.

  References:
    Holtzman et al., The Curious Case of Neural Text Degeneration (top-p), arXiv 1904.09751.
  """
  s, v = scaled_sv.shape
  keys_sv = _sortable(scaled_sv)
  none_s = jnp.zeros((s,), jnp.uint32)
  k_s = jnp.where(top_k_s > 0, jnp.minimum(top_k_s, v), v)
  cut_k = jax.lax.cond(
    jnp.any(top_k_s > 0),
    lambda: _largest_key(keys_sv, lambda keep: keep.sum(-1) >= k_s),
    lambda: none_s,
  )
  probs_sv = jax.nn.softmax(scaled_sv, axis=-1)

  def nucleus():
    mass_k = jnp.where(keys_sv >= cut_k[:, None], probs_sv, 0.0).sum(-1)
    need_s = jnp.minimum(top_p_s, 1.0) * mass_k
    return _largest_key(keys_sv, lambda keep: jnp.where(keep, probs_sv, 0.0).sum(-1) >= need_s)

  cut_p = jax.lax.cond(jnp.any(top_p_s < 1.0), nucleus, lambda: none_s)
  cut = jnp.maximum(cut_k, jnp.where(top_p_s < 1.0, cut_p, 0))
  return jnp.where((top_p_s < 1.0) | (top_k_s > 0), cut, 0).astype(jnp.uint32)


def _pick(weights_sv: jax.Array, target_s: jax.Array) -> jax.Array:
  """Per row, the first index whose running sum of `weights` exceeds `target` (two-level scan).

  Weights are >= 0 with a positive sum; `target` is in [0, sum). Rounding never lands on a
  zero-weight index: it falls back to the last positive one. Running sums are matmuls with a
  triangular matrix (XLA's CPU cumsum is slow to compile and to run); blocks are ~sqrt(V) long.
  """
  s, v = weights_sv.shape
  block = max(8, 1 << math.isqrt(v - 1).bit_length())  # a power of two >= sqrt(V)
  nb = -(-v // block)
  w_snb = jnp.pad(weights_sv, ((0, 0), (0, nb * block - v))).reshape(s, nb, block)
  block_sums = w_snb.sum(-1)  # [S, nb]
  cum_block = _cumsum(block_sums)
  b_s = _first_above(cum_block, target_s, block_sums > 0)
  before_s = jnp.take_along_axis(cum_block - block_sums, b_s[:, None], 1)[:, 0]
  w_sb = jnp.take_along_axis(w_snb, b_s[:, None, None], 1)[:, 0]  # [S, block]
  inner_s = _first_above(_cumsum(w_sb), target_s - before_s, w_sb > 0)
  return (b_s * block + inner_s).astype(jnp.int32)


def _cumsum(x_sn: jax.Array) -> jax.Array:
  n = x_sn.shape[-1]
  upper_nn = jnp.triu(jnp.ones((n, n), F32))
  return jnp.dot(x_sn, upper_nn, precision=jax.lax.Precision.HIGHEST)


def _first_above(cum_sn: jax.Array, target_s: jax.Array, positive_sn: jax.Array) -> jax.Array:
  n = cum_sn.shape[-1]
  first = jnp.sum(cum_sn <= target_s[:, None], axis=-1)
  last_positive = jnp.max(jnp.where(positive_sn, jnp.arange(n), 0), axis=-1)
  return jnp.minimum(first, last_positive)


def sample(
  logits_sv: jax.Array,
  uniforms_s: jax.Array,
  temperature_s: jax.Array,
  top_p_s: jax.Array,
  top_k_s: jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """Samples one token per row and returns it with its log-prob under the sampling distribution.

  Args:
    logits_sv: [S, V] next-token logits (any float dtype; computed in float32).
    uniforms_s: f32[S] in [0, 1), one draw per row (`row_uniforms`).
    temperature_s: f32[S]; 0 = greedy.
    top_p_s: f32[S] nucleus mass; >= 1 = off.
    top_k_s: int32[S]; 0 = off.

  Returns:
    (tokens_s int32[S], logprobs_s f32[S]).
  """
  scaled_sv, greedy_s, top_p_s, top_k_s = _prepare(logits_sv, temperature_s, top_p_s, top_k_s)
  max_s = jnp.max(scaled_sv, axis=-1)
  weights_sv = jnp.exp(scaled_sv - max_s[:, None])

  def truncated():
    cutoff_s = truncation_cutoff(scaled_sv, top_p_s, top_k_s)
    return jnp.where(_sortable(scaled_sv) >= cutoff_s[:, None], weights_sv, 0.0)

  # Rows without a cut get the same numbers on both branches (where(True, w, 0) == w).
  truncate = jnp.any((top_p_s < 1.0) | (top_k_s > 0))
  weights_sv = jax.lax.cond(truncate, truncated, lambda: weights_sv)
  total_s = weights_sv.sum(-1)
  tokens_s = _pick(weights_sv, uniforms_s * total_s)
  tokens_s = jax.lax.cond(
    jnp.any(greedy_s),
    lambda: jnp.where(greedy_s, jnp.argmax(scaled_sv, axis=-1).astype(jnp.int32), tokens_s),
    lambda: tokens_s,
  )
  chosen_s = jnp.take_along_axis(scaled_sv, tokens_s[:, None], 1)[:, 0]
  logprobs_s = chosen_s - max_s - jnp.log(total_s)
  return tokens_s, logprobs_s


def sampling_logprobs(
  logits_sv: jax.Array, temperature_s: jax.Array, top_p_s: jax.Array, top_k_s: jax.Array
) -> jax.Array:
  """f32[S, V] log-probs of the distribution `sample` draws from (-inf outside the kept set).

  Greedy rows get log softmax(logits). Args as in `sample`.
  """
  scaled_sv, _, top_p_s, top_k_s = _prepare(logits_sv, temperature_s, top_p_s, top_k_s)
  keep_sv = _sortable(scaled_sv) >= truncation_cutoff(scaled_sv, top_p_s, top_k_s)[:, None]
  masked_sv = jnp.where(keep_sv, scaled_sv, -jnp.inf)
  return masked_sv - jax.nn.logsumexp(masked_sv, axis=-1, keepdims=True)


def _prepare(logits_sv, temperature_s, top_p_s, top_k_s):
  """Scaled logits (greedy rows at temperature 1, without cuts) and the per-row parameters."""
  greedy_s = jnp.asarray(temperature_s) <= 0
  temperature_s = jnp.where(greedy_s, 1.0, temperature_s).astype(F32)
  scaled_sv = logits_sv.astype(F32) / temperature_s[:, None]
  top_p_s = jnp.where(greedy_s, 1.0, top_p_s).astype(F32)
  top_k_s = jnp.where(greedy_s, 0, top_k_s).astype(jnp.int32)
  return scaled_sv, greedy_s, top_p_s, top_k_s
