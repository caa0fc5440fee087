"""Fused kernels (Pallas on TPU/GPU, interpret mode or XLA on CPU), each with a pure-jnp reference.

- `dis_loss(logprobs, rollout_logprobs, advantages, action_mask, *, eps_low, eps_high)`: the DIS
  policy loss and its metrics in one Pallas pass (`kernels/dis_loss/`); same semantics as
  `sao_jax.losses.dis_policy_loss`. `dis_loss_terms` is its micro-batch form.
- `fused_token_logprobs(hidden, lm_head, targets, ...)`: log-probs and entropies without `[N, V]`
  logits (`kernels/fused_logprobs/`).
"""

from kernels.dis_loss import dis_loss, dis_loss_terms
from kernels.fused_logprobs import fused_token_logprobs

__all__ = ["dis_loss", "dis_loss_terms", "fused_token_logprobs"]
