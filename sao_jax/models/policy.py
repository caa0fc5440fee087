"""Policy (trunk + LM head) and critic (trunk + value head), and the critic's frozen-attention labels.

Shapes: B = rows, T = tokens per row, D = model width, V = vocabulary.

Alignment (sao_jax/types.py): the output at position t - 1 scores token t. So
`token_logprobs(tokens)[:, t] = log p(tokens[t] | tokens[:t])` and `values(tokens)[:, t]` =
V(state before token t) = head(hidden[t - 1]); both are 0 at t = 0 and at the first token of every
packed segment, where there is no earlier output to read.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sao_jax import sharding as shd
from sao_jax.models.config import ModelConfig
from sao_jax.models.decoder import Decoder, segment_starts
from sao_jax.models.layers import F32, KeyGen, param

FROZEN, TRAINABLE = "frozen", "trainable"


class Policy(nnx.Module):
  """The language model: `logits` for inference, `token_logprobs` (fused, no [B, T, V]) for training.

  Args:
    cfg: the model config.
    rngs: nnx.Rngs for parameter init.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.model = Decoder(cfg, rngs=rngs)
    if not cfg.tie_embeddings:
      self.lm_head = param(
        KeyGen(rngs.params()),
        (cfg.d_model, cfg.vocab_size),
        (shd.EMBED, shd.VOCAB),
        cfg.weight_dtype,
        cfg.init_std,
      )

  def lm_head_dv(self) -> jax.Array:
    """[D, V] output projection in the compute dtype (the embedding transposed when tied)."""
    w = self.model.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
    return w.astype(self.cfg.compute_dtype)

  def hidden(
    self,
    tokens_bt: jax.Array,
    positions_bt: jax.Array | None = None,
    segment_ids_bt: jax.Array | None = None,
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """([B, T, D] final hidden states, metrics) (see Decoder.__call__)."""
    return self.model(tokens_bt, positions_bt, segment_ids_bt)

  def logits(
    self,
    tokens_bt: jax.Array,
    positions_bt: jax.Array | None = None,
    segment_ids_bt: jax.Array | None = None,
  ) -> jax.Array:
    """f32[B, T, V] next-token logits; logits[:, t] scores token t + 1 (inference and tests)."""
    h_btd, _ = self.hidden(tokens_bt, positions_bt, segment_ids_bt)
    return jnp.einsum("btd,dv->btv", h_btd, self.lm_head_dv(), preferred_element_type=F32)

  def token_logprobs(
    self,
    tokens_bt: jax.Array,
    positions_bt: jax.Array | None = None,
    segment_ids_bt: jax.Array | None = None,
    *,
    temperature: float | jax.Array = 1.0,
  ) -> tuple[jax.Array, jax.Array]:
    """Per-token log-probs and entropies of the tokens themselves, through the fused kernel.

    Args:
      tokens_bt: [B, T] int token ids.
      positions_bt: [B, T] positions (default: restart per segment).
      segment_ids_bt: [B, T] segment ids of packed rows (default: one segment per row).
      temperature: logits are divided by it (score with the sampling temperature).

    Returns:
      (logprobs_bt, entropy_bt), float32 [B, T]: log p(tokens[t] | tokens[:t]) and the entropy of
      that next-token distribution; 0 at t = 0 and at segment starts.
    """
    logprobs_bt, entropy_bt, _ = self.token_logprobs_with_metrics(
      tokens_bt, positions_bt, segment_ids_bt, temperature=temperature
    )
    return logprobs_bt, entropy_bt

  def token_logprobs_with_metrics(
    self, tokens_bt, positions_bt=None, segment_ids_bt=None, *, temperature=1.0
  ):
    """`token_logprobs` plus the trunk's metrics dict (MoE router statistics)."""
    from kernels import fused_token_logprobs  # Imported here: kernels depends on nothing of ours.

    tokens_bt = jnp.asarray(tokens_bt, jnp.int32)
    b, t = tokens_bt.shape
    h_btd, metrics = self.hidden(tokens_bt, positions_bt, segment_ids_bt)
    # Position t scores token t + 1; the last column's target wraps around and is discarded.
    targets_bt = jnp.roll(tokens_bt, -1, axis=1)
    lp_n, ent_n = fused_token_logprobs(
      h_btd.reshape(b * t, -1),
      self.lm_head_dv(),
      targets_bt.reshape(-1),
      temperature=temperature,
      block_size=self.cfg.logprob_block_size or None,
    )
    logprobs_bt = _shift_right(lp_n.reshape(b, t), segment_ids_bt)
    entropy_bt = _shift_right(ent_n.reshape(b, t), segment_ids_bt)
    return logprobs_bt, entropy_bt, metrics


class Critic(nnx.Module):
  """The value model: the same trunk with a linear value head (algorithm.md §11.8).

  Args:
    cfg: the model config.
    rngs: nnx.Rngs for parameter init.
    head_init_std: the head weight is N(0, (head_init_std / sqrt(D))^2); the bias starts at 0.
    trunk: an existing Decoder to use instead of a fresh random one (see critic_from_policy).
  """

  def __init__(
    self,
    cfg: ModelConfig,
    *,
    rngs: nnx.Rngs,
    head_init_std: float = 0.02,
    trunk: Decoder | None = None,
  ):
    self.cfg = cfg
    self.model = trunk if trunk is not None else Decoder(cfg, rngs=rngs)
    d = cfg.d_model
    self.value_head = param(
      KeyGen(rngs.params()), (d,), (shd.EMBED,), jnp.float32, head_init_std / d**0.5
    )
    self.value_bias = nnx.Param(jnp.zeros((), jnp.float32), out_sharding=(), eager_sharding=False)

  def values(
    self,
    tokens_bt: jax.Array,
    positions_bt: jax.Array | None = None,
    segment_ids_bt: jax.Array | None = None,
  ) -> jax.Array:
    """f32[B, T]: values[:, t] = V(state before token t) = head(hidden[t - 1]); 0 at segment starts."""
    return self.values_with_metrics(tokens_bt, positions_bt, segment_ids_bt)[0]

  def values_with_metrics(self, tokens_bt, positions_bt=None, segment_ids_bt=None):
    """(`values`, the trunk's metrics dict)."""
    h_btd, metrics = self.model(tokens_bt, positions_bt, segment_ids_bt)
    v_bt = (
      jnp.einsum(
        "btd,d->bt", h_btd.astype(F32), self.value_head[...], precision=jax.lax.Precision.HIGHEST
      )
      + self.value_bias[...]
    )
    return _shift_right(v_bt, segment_ids_bt), metrics


def critic_from_policy(policy: Policy, *, rngs: nnx.Rngs, head_init_std: float = 0.02) -> Critic:
  """A critic whose trunk is a copy of the policy's (own buffers, same shardings) and a fresh head."""
  graphdef, state = nnx.split(policy.model)
  trunk = nnx.merge(graphdef, _copy(state))
  return Critic(policy.cfg, rngs=rngs, head_init_std=head_init_std, trunk=trunk)


@jax.jit
def _copy(tree):
  """Fresh buffers (one compiled copy, not one op per array), shardings kept."""
  return jax.tree.map(jnp.copy, tree)


def critic_param_labels(critic_state: Any) -> Any:
  """FROZEN for the attention parameters (q/k/v/o projections, q/k norms), TRAINABLE elsewhere.

  Embeddings, block norms, MLP/experts, router, final norm and the value head stay trainable
  (algorithm.md §11.7).

  Args:
    critic_state: `nnx.state(critic, nnx.Param)` (a Critic module is also accepted), or any pytree
      whose paths name modules the same way (e.g. `nnx.to_pure_dict` of it).

  Returns:
    The same tree structure with each array leaf replaced by 'frozen' or 'trainable' (for
    `optax.multi_transform`).
  """
  if isinstance(critic_state, nnx.Module):
    critic_state = nnx.state(critic_state, nnx.Param)

  def label(path, _):
    keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    return FROZEN if "attn" in keys else TRAINABLE

  return jax.tree_util.tree_map_with_path(label, critic_state)


def _shift_right(x_bt: jax.Array, segment_ids_bt: jax.Array | None) -> jax.Array:
  """out[:, t] = x[:, t - 1], and 0 at t = 0 and at segment starts."""
  out_bt = jnp.concatenate([jnp.zeros_like(x_bt[:, :1]), x_bt[:, :-1]], axis=1)
  if segment_ids_bt is not None:
    out_bt = jnp.where(segment_starts(segment_ids_bt), 0.0, out_bt)
  return out_bt
