"""Fused token log-probs and entropies without materializing `[N, V]` logits.

`fused_token_logprobs(hidden, lm_head, targets)` computes log softmax(h @ W / T) at each target and
the entropy of that distribution, with a `jax.custom_vjp` backward that recomputes logit tiles.
Two implementations sit behind it: `xla.py` (chunked XLA loops; the default on CPU and GPU) and
`kernel.py` (Pallas; the default on TPU, interpret mode on CPU for tests). `reference.py` is the
naive oracle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.fused_logprobs.reference import token_logprobs_reference
from kernels.fused_logprobs.xla import BlockSizes, fused_token_logprobs_xla

__all__ = ["BlockSizes", "fused_token_logprobs", "token_logprobs_reference"]

IMPLS = ("auto", "xla", "pallas")


def fused_token_logprobs(
  hidden_nd: jax.Array,
  lm_head_dv: jax.Array,
  targets_n: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
  block_size: int | None = None,
  row_block_size: int | None = None,
  impl: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """log softmax(h @ W / T)[target] and the entropy of softmax(h @ W / T), tile by tile.

  Never materializes the `[N, V]` logits: peak temporary memory is a few `[bn, bv]` tiles plus an
  f32 `[N, D]` gradient accumulator. Differentiable w.r.t. `hidden_nd` and `lm_head_dv` for both
  outputs (custom_vjp); the temperature is not differentiated.

  Args:
    hidden_nd: [N, D] (or [..., D]) hidden states, float32 or bfloat16.
    lm_head_dv: [D, V] output projection, float32 or bfloat16 (logits and softmax in float32).
    targets_n: [N] (or [...], matching hidden's leading dims) integer ids in [0, V). An id outside
      that range gives logprob = -logsumexp (no error inside jit); mask such rows yourself.
    temperature: T > 0; logits are divided by it (score with the temperature you sampled at).
    block_size: vocabulary entries per tile (None: the implementation's default; clamped to V).
      XLA path: 8192. Pallas: 512 on TPU (a multiple of 128), 8192 in interpret mode.
    row_block_size: tokens per tile (None: default; clamped to N). XLA: 1024. Pallas: 256 on TPU
      (a multiple of 8), 1024 in interpret mode.
    impl: 'xla' (chunked XLA loops), 'pallas' (Pallas kernels; interpret mode on CPU), or 'auto':
      'pallas' on TPU, 'xla' elsewhere. (The Pallas backward accumulates over a sequential grid
      axis, which is TPU semantics; Triton runs grid steps in parallel, so GPUs use 'xla'.)

  Returns:
    (logprobs_n, entropy_n): float32, shaped like `targets_n`.

  References:
    Online softmax: arXiv 1805.02867. Cut Your Losses (chunked linear cross-entropy): 2411.09009.
  """
  _check_inputs(hidden_nd, lm_head_dv, targets_n, temperature, impl)
  lead = targets_n.shape
  h = hidden_nd.reshape(-1, hidden_nd.shape[-1])
  t = targets_n.reshape(-1)
  if h.shape[0] == 0:
    empty = jnp.zeros(lead, jnp.float32)
    return empty, empty
  if impl == "auto":
    impl = "pallas" if jax.default_backend() == "tpu" else "xla"
  if impl == "xla":
    bs = _block_sizes(BlockSizes.get_default(), block_size, row_block_size)
    logp, ent = fused_token_logprobs_xla(h, lm_head_dv, t, temperature=temperature, block_sizes=bs)
  else:
    if jax.default_backend() == "gpu":
      raise ValueError(
        "impl='pallas': the fused log-prob kernels target TPU (interpret mode on "
        "CPU); their backward needs sequential grid steps. Use impl='xla' on GPU."
      )
    from kernels.fused_logprobs import kernel  # Pallas import only when asked for.

    interpret = jax.default_backend() == "cpu"
    bs = _block_sizes(kernel.default_block_sizes(interpret), block_size, row_block_size)
    logp, ent = kernel.fused_token_logprobs_pallas(
      h, lm_head_dv, t, temperature=temperature, block_sizes=bs, interpret=interpret
    )
  return logp.reshape(lead), ent.reshape(lead)


def _block_sizes(default: BlockSizes, block_v: int | None, block_n: int | None) -> BlockSizes:
  for name, x in (("block_size", block_v), ("row_block_size", block_n)):
    if x is not None and not (isinstance(x, int) and x > 0):
      raise ValueError(f"{name}: must be a positive int or None, got {x!r}")
  return BlockSizes(block_n or default.block_n, block_v or default.block_v)


def _check_inputs(hidden, lm_head, targets, temperature, impl):
  """Raises ValueError naming the bad argument."""
  if impl not in IMPLS:
    raise ValueError(f"impl: must be one of {IMPLS}, got {impl!r}")
  if hidden.ndim < 1 or lm_head.ndim != 2:
    raise ValueError(
      f"hidden_nd must be [..., D] and lm_head_dv [D, V]; got {hidden.shape} and {lm_head.shape}"
    )
  if lm_head.shape[0] != hidden.shape[-1]:
    raise ValueError(
      f"lm_head_dv: first dim {lm_head.shape[0]} must equal hidden's D = {hidden.shape[-1]}"
    )
  if tuple(targets.shape) != tuple(hidden.shape[:-1]):
    raise ValueError(
      f"targets_n: shape {targets.shape} must equal hidden's leading dims {hidden.shape[:-1]}"
    )
  if not jnp.issubdtype(targets.dtype, jnp.integer):
    raise ValueError(f"targets_n: must be integer token ids, got dtype {targets.dtype}")
  for name, x in (("hidden_nd", hidden), ("lm_head_dv", lm_head)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"{name}: must be floating point, got dtype {x.dtype}")
  if isinstance(temperature, int | float) and not temperature > 0:
    raise ValueError(f"temperature: must be > 0, got {temperature}")
