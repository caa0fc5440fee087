"""Fused kernels (Pallas on TPU/GPU, interpret mode or XLA on CPU), each with a pure-jnp reference.

- `fused_token_logprobs(hidden, lm_head, targets, ...)`: log-probs and entropies without `[N, V]`
  logits (`kernels/fused_logprobs/`).
"""

from kernels.fused_logprobs import fused_token_logprobs

__all__ = ["fused_token_logprobs"]
