"""Pure-jnp oracle for fused token log-probs: materializes the full `[N, V]` logits.

Shapes: N = tokens (rows), D = model width, V = vocabulary size.

This is the naive path the fused implementations are tested and benchmarked against. It needs
O(N * V) memory (about 20 GB of float32 logits at N = 32768, V = 151,936), so it is only for tests
and small models.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs_reference(
  hidden_nd: jax.Array,
  lm_head_dv: jax.Array,
  targets_n: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """log softmax(h @ W / T) at the target, and the entropy of that distribution.

  Inputs are upcast to float32 before the matmul, so bf16 inputs give the exact float32 result of
  their bf16 values.

  Args:
    hidden_nd: [N, D] final hidden states.
    lm_head_dv: [D, V] output projection.
    targets_n: [N] int token ids in [0, V).
    temperature: sampling temperature T > 0; the logits are divided by it.

  Returns:
    (logprobs_n, entropy_n): [N] float32 each.

  References:
    The softmax/entropy identities used by the fused paths: d log p_y / dz = onehot(y) - p and
    dH / dz = -p * (log p + H).
  """
  h = hidden_nd.astype(jnp.float32)
  w = lm_head_dv.astype(jnp.float32)
  logits_nv = jnp.dot(h, w, precision=jax.lax.Precision.HIGHEST) / temperature  # [N, V]
  logp_nv = jax.nn.log_softmax(logits_nv, axis=-1)  # [N, V]
  logprobs_n = jnp.take_along_axis(logp_nv, targets_n[:, None].astype(jnp.int32), axis=-1)[:, 0]
  entropy_n = -jnp.sum(jnp.exp(logp_nv) * logp_nv, axis=-1)
  return logprobs_n, entropy_n
