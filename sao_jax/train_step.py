"""One learner step, `(state, batch) -> (state, metrics)`, for every algorithm in `sao_jax.algos`.

SAO (algorithm.md §4, §11):

  values_pre = V(batch)                                   # no gradient
  for k in 1..K:                                          # critic first, attention frozen
    V = critic(batch); R = skip_obs_gae(r, sg(V), λ_critic).returns
    critic step on 0.5·(V − R)² over action tokens
  if step >= critic_only_steps:
    Â = skip_obs_gae(r, values_pre, λ = 1 − 1/(α·l)).advantages
    policy step on the DIS loss, log-probs through the fused kernel

Baselines swap the advantage (GRPO, RLOO, running mean, token GAE) and the policy loss (PPO clip,
decoupled PPO); see `sao_jax.algos`. With one policy step per batch, PPO's "old" and decoupled PPO's
"proximal" log-probs equal the current parameters' log-probs at the start of the step, so they are
`stop_gradient` of the same forward pass (bit-identical to a separate recompute, one forward cheaper).

Micro-batches: every loss is a token sum divided by a denominator counted over the WHOLE batch before
the micro-batch loop, so gradients accumulate by plain summation and the result does not depend on
the micro-batch size. A batch with a non-finite reward or rollout log-prob, or a non-finite loss or
gradient, leaves the parameters and optimizer states untouched (`skipped` = 1 in the metrics).

Shapes: B = rows (trajectories), T = tokens per row, M = micro-batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from sao_jax import advantages as adv_lib
from sao_jax import algos, losses, optim

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  """Everything the learner updates, as one pytree (style.md rule 3).

  Attributes:
    step: [] int32, learner steps taken (batches consumed).
    version: [] int32, policy updates taken (the policy version rollouts are tagged with).
    policy: the policy's nnx.Param state.
    critic: the critic's nnx.Param state (an empty dict for critic-free algorithms).
    policy_opt: optax state of the policy optimizer.
    critic_opt: optax state of the critic optimizer (frozen leaves carry none).
    baseline: running-mean baseline (`advantages.RunningMeanState`).
    rng: PRNG key data, advanced every step.
  """

  step: jax.Array
  version: jax.Array
  policy: Any
  critic: Any
  policy_opt: Any
  critic_opt: Any
  baseline: adv_lib.RunningMeanState
  rng: jax.Array


@flax.struct.dataclass
class Learner:
  """The static half of the learner: graph definitions and optimizers (not part of the state).

  Attributes:
    policy_def: nnx GraphDef of the policy.
    critic_def: nnx GraphDef of the critic (None without a critic).
    policy_tx: the policy's optax transformation.
    critic_tx: the critic's optax transformation (None without a critic).
    critic_trainable: bool pytree over the critic params (False = frozen), for grad norms.
  """

  policy_def: Any = flax.struct.field(pytree_node=False)
  critic_def: Any = flax.struct.field(pytree_node=False)
  policy_tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)
  critic_tx: Any = flax.struct.field(pytree_node=False)
  critic_trainable: Any = flax.struct.field(pytree_node=False)


def init_state(
  config: ml_collections.ConfigDict, policy: nnx.Module, critic: nnx.Module | None
) -> tuple[Learner, TrainState]:
  """Splits the models into (graphdef, params) and builds both optimizers and the state.

  Args:
    config: the run config (`optim`, `critic`, `loss`, `total_steps`, `seed`).
    policy: a `models.Policy` (already sharded if running on a mesh).
    critic: a `models.Critic`, or None for critic-free algorithms.

  Returns:
    (learner, state).
  """
  policy_def, policy_params = nnx.split(policy, nnx.Param)
  policy_tx = optim.make_optimizer(config.optim.policy, total_steps=config.total_steps)
  critic_def = critic_tx = critic_trainable = None
  critic_params, critic_opt = {}, {}
  if critic is not None:
    critic_def, critic_params = nnx.split(critic, nnx.Param)
    labels = None
    if config.critic.frozen_attention:
      from sao_jax import models

      labels = models.critic_param_labels(critic_params)
    k = max(int(config.loss.critic_steps), 1)
    critic_tx = optim.make_optimizer(
      config.optim.critic, total_steps=k * config.total_steps, labels=labels
    )
    critic_opt = critic_tx.init(critic_params)
    critic_trainable = (
      optim.trainable_mask(labels)
      if labels is not None
      else jax.tree.map(lambda _: True, critic_params)
    )
  # The state owns its buffers: the step donates them, and the modules may still be in use.
  policy_params, critic_params = jax.tree.map(jnp.copy, (policy_params, critic_params))
  state = TrainState(
    step=jnp.zeros((), jnp.int32),
    version=jnp.zeros((), jnp.int32),
    policy=policy_params,
    critic=critic_params,
    policy_opt=policy_tx.init(policy_params),
    critic_opt=critic_opt,
    baseline=adv_lib.init_running_mean(int(config.loss.baseline_window)),
    rng=jax.random.key_data(jax.random.key(config.seed)),
  )
  return Learner(policy_def, critic_def, policy_tx, critic_tx, critic_trainable), state


# ---------------------------------------------------------------------------- micro-batching


def split_micro(batch: Batch, num_micro: int) -> Batch:
  """[B, ...] -> [M, B / M, ...], interleaved (row i goes to micro-batch i % M).

  Interleaving keeps every micro-batch spread over all data-parallel devices when B is sharded in
  contiguous blocks.
  """
  return jax.tree.map(
    lambda x: x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:]).swapaxes(0, 1), batch
  )


def accumulate(
  loss_fn: Callable[[Any, Batch], tuple[jax.Array, Metrics]], params: Any, batch_m: Batch
) -> tuple[jax.Array, Any, Metrics]:
  """Sums loss, gradient and metrics of `loss_fn` over micro-batches.

  `loss_fn(params, micro_batch) -> (loss, metrics)` must already divide by whole-batch
  denominators, so the sums are exactly the whole-batch values. Metrics whose name ends in `_max`
  are maxed instead of summed.

  Args:
    loss_fn: the micro-batch loss.
    params: differentiated argument.
    batch_m: micro-batches stacked on a leading [M] axis (see `split_micro`).

  Returns:
    (loss, grads, metrics) over the whole batch.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def body(carry, mb):
    (loss, metrics), grads = grad_fn(params, mb)
    if carry is None:
      return (loss, grads, metrics), None
    acc_loss, acc_grads, acc_metrics = carry
    merged = {
      k: jnp.maximum(acc_metrics[k], v) if k.endswith("_max") else acc_metrics[k] + v
      for k, v in metrics.items()
    }
    return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads), merged), None

  first = jax.tree.map(lambda x: x[0], batch_m)
  carry, _ = body(None, first)
  num_micro = jax.tree.leaves(batch_m)[0].shape[0]
  if num_micro > 1:
    rest = jax.tree.map(lambda x: x[1:], batch_m)
    carry, _ = jax.lax.scan(body, carry, rest)
  return carry


def _apply(
  tx: optax.GradientTransformation, params: Any, opt_state: Any, grads: Any, ok: jax.Array
) -> tuple[Any, Any]:
  """One optimizer update, or no change at all where `ok` is False."""
  updates, new_opt = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
  return keep(new_params, params), keep(new_opt, opt_state)


# ---------------------------------------------------------------------------- the step


def make_train_step(
  config: ml_collections.ConfigDict,
  learner: Learner,
  *,
  state_sharding: Any = None,
  batch_sharding: Any = None,
  donate: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
  """Builds the jitted learner step for `config.algo`.

  Args:
    config: the run config.
    learner: from `init_state`.
    state_sharding: shardings of the TrainState (None: let jit infer).
    batch_sharding: shardings of the batch dict (None: let jit infer).
    donate: donate the input state's buffers.

  Returns:
    `step(state, batch) -> (state, metrics)`; `batch` is `TrainBatch.as_dict()` ([B, T] and [B]
    arrays); metrics is a flat dict of float32 scalars.
  """
  step_fn = functools.partial(_train_step, config, learner)
  return jax.jit(
    step_fn,
    in_shardings=(state_sharding, batch_sharding),
    out_shardings=(state_sharding, None),
    donate_argnums=(0,) if donate else (),
  )


def _train_step(config, learner: Learner, state: TrainState, batch: Batch):
  algo = algos.ALGOS[config.algo]
  b = batch["tokens"].shape[0]
  num_micro = b // config.micro_batch_size if config.micro_batch_size else 1
  batch_m = split_micro(batch, num_micro)
  mask = batch["action_mask"]
  n_tokens = jnp.maximum(jnp.sum(mask), 1).astype(jnp.float32)
  finite_batch = jnp.all(jnp.isfinite(batch["rewards"])) & jnp.all(
    jnp.isfinite(jnp.where(mask, batch["rollout_logprobs"], 0.0))
  )
  metrics: Metrics = {}

  # ---- critic: K steps, each recomputing values (frozen attention via the optimizer labels).
  values_pre = None
  critic_params, critic_opt = state.critic, state.critic_opt
  if algo.critic:
    values_pre = _critic_values(learner, critic_params, batch_m, b)
    if config.loss.value_clip:
      batch_m = dict(batch_m, values_pre=split_micro({"v": values_pre}, num_micro)["v"])
    loss_fn = functools.partial(_critic_loss, config, algo, learner, n_tokens=n_tokens)

    def critic_update(carry, _):
      params, opt_state = carry
      loss, grads, m = accumulate(loss_fn, params, batch_m)
      gnorm = optim.global_norm(grads, learner.critic_trainable)
      ok = finite_batch & jnp.isfinite(loss) & jnp.isfinite(gnorm)
      params, opt_state = _apply(learner.critic_tx, params, opt_state, grads, ok)
      return (params, opt_state), dict(m, value_loss=loss, grad_norm=gnorm)

    # K critic updates on the same batch, each recomputing values; one compiled body for all K.
    (critic_params, critic_opt), m = jax.lax.scan(
      critic_update, (critic_params, critic_opt), None, length=int(config.loss.critic_steps)
    )
    metrics.update({f"critic/{n}": v[0] for n, v in m.items()})  # the first of the K updates
    returns = _returns(config, algo, batch, jax.lax.stop_gradient(values_pre))
    metrics["critic/explained_variance"] = losses.explained_variance(values_pre, returns, mask)
    metrics["critic/value_mean"] = jnp.sum(jnp.where(mask, values_pre, 0.0)) / n_tokens

  # ---- advantages.
  values = values_pre
  if algo.critic and config.loss.advantage_values == "post":
    values = _critic_values(learner, critic_params, batch_m, b)
  adv_bt, baseline = _advantages(config, algo, batch, values, state.baseline)
  metrics["adv/mean"] = jnp.sum(jnp.where(mask, adv_bt, 0.0)) / n_tokens
  metrics["adv/abs_mean"] = jnp.sum(jnp.where(mask, jnp.abs(adv_bt), 0.0)) / n_tokens

  # ---- policy: one step, skipped during the critic-only warm-up.
  batch_m = dict(batch_m, advantages=split_micro({"a": adv_bt}, num_micro)["a"])
  n_pos = jnp.maximum(jnp.sum(mask & (batch["seq_rewards"] > 0)[:, None]), 1).astype(jnp.float32)
  loss_fn = functools.partial(_policy_loss, config, algo, learner, n_tokens=n_tokens, n_pos=n_pos)
  loss, grads, m = accumulate(loss_fn, state.policy, batch_m)
  gnorm = optim.global_norm(grads)
  warm = algo.critic and config.loss.critic_only_steps > 0
  policy_turn = (state.step >= config.loss.critic_only_steps) if warm else jnp.bool_(True)
  ok = finite_batch & jnp.isfinite(loss) & jnp.isfinite(gnorm)
  policy_params, policy_opt = _apply(
    learner.policy_tx, state.policy, state.policy_opt, grads, ok & policy_turn
  )
  metrics.update({f"policy/{n}": v for n, v in m.items()})
  metrics.update(
    {
      "policy/loss": loss,
      "policy/grad_norm": gnorm,
      "policy/updated": (ok & policy_turn).astype(jnp.float32),
      "skipped": (~(ok & finite_batch)).astype(jnp.float32),
    }
  )

  new_state = state.replace(
    step=state.step + 1,
    version=state.version + (ok & policy_turn).astype(jnp.int32),
    policy=policy_params,
    critic=critic_params,
    policy_opt=policy_opt,
    critic_opt=critic_opt,
    baseline=jax.tree.map(lambda a, b: jnp.where(finite_batch, a, b), baseline, state.baseline),
    rng=jax.random.key_data(jax.random.split(jax.random.wrap_key_data(state.rng))[0]),
  )
  return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


# ---------------------------------------------------------------------------- pieces


def _critic_values(learner: Learner, params: Any, batch_m: Batch, b: int) -> jax.Array:
  """[B, T] critic values without gradient, computed micro-batch by micro-batch."""
  critic = nnx.merge(learner.critic_def, params)

  def one(_, mb):
    v = critic.values(mb["tokens"], mb["positions"], mb["segment_ids"])
    return None, jax.lax.stop_gradient(v)

  _, v_m = jax.lax.scan(one, None, batch_m)  # [M, B / M, T]
  return v_m.swapaxes(0, 1).reshape(b, -1)


def _returns(config, algo: algos.Algo, batch: Batch, values: jax.Array) -> jax.Array:
  """Critic targets: skip-observation (or token) GAE returns with λ_critic."""
  est = adv_lib.gae if algo.advantage == "gae" else adv_lib.skip_observation_gae
  _, returns = est(
    batch["rewards"],
    values,
    batch["action_mask"],
    gamma=config.loss.gamma,
    lam=config.loss.lam_critic,
  )
  return returns


def _critic_loss(config, algo, learner: Learner, params, mb, *, n_tokens):
  critic = nnx.merge(learner.critic_def, params)
  values = critic.values(mb["tokens"], mb["positions"], mb["segment_ids"])
  returns = _returns(config, algo, mb, jax.lax.stop_gradient(values))
  clip = config.loss.value_clip or None
  terms = losses.value_loss_terms(
    values, returns, mb["action_mask"], old_values=mb.get("values_pre"), clip=clip
  )
  return _share(terms, n_tokens)


def _share(terms: losses.LossTerms, total: jax.Array) -> tuple[jax.Array, Metrics]:
  """A micro-batch's share of the whole-batch token mean: sums over the WHOLE batch's count."""
  metrics = {k: v / total for k, v in terms.sums.items()}
  metrics.update(terms.maxes)
  return terms.loss_sum / total, metrics


def _advantages(config, algo: algos.Algo, batch: Batch, values, baseline):
  """[B, T] advantages on action tokens (0 elsewhere) and the new running-mean state."""
  mask = batch["action_mask"]
  lo = config.loss
  if algo.advantage in ("skip_gae", "gae"):
    lam = (
      adv_lib.length_adaptive_lambda(mask, alpha=lo.lam_alpha)
      if lo.length_adaptive
      else lo.lam_policy
    )
    est = adv_lib.gae if algo.advantage == "gae" else adv_lib.skip_observation_gae
    adv_bt, _ = est(batch["rewards"], values, mask, gamma=lo.gamma, lam=lam)
  else:
    r, g = batch["seq_rewards"], batch["group_ids"]
    if algo.advantage == "grpo":
      adv_b = adv_lib.grpo_advantages(r, g, scale_by_std=lo.scale_by_std)
    elif algo.advantage == "rloo":
      adv_b = adv_lib.rloo_advantages(r, g)
    else:
      adv_b, baseline = adv_lib.running_mean_advantages(baseline, r, batch["valid"])
    adv_bt = jnp.where(mask, adv_b[:, None], 0.0)
  if lo.whiten_advantages:
    adv_bt = adv_lib.masked_whiten(adv_bt, mask)
  return jax.lax.stop_gradient(adv_bt), baseline


def _policy_loss(config, algo, learner: Learner, params, mb, *, n_tokens, n_pos):
  policy = nnx.merge(learner.policy_def, params)
  lo = config.loss
  logp, entropy = policy.token_logprobs(
    mb["tokens"], mb["positions"], mb["segment_ids"], temperature=config.rollout.temperature
  )
  mask, adv, roll = mb["action_mask"], mb["advantages"], mb["rollout_logprobs"]
  old = jax.lax.stop_gradient(logp)  # one policy step per batch: old = prox = current params
  if algo.policy_loss == "dis":
    terms = losses.dis_policy_loss_terms(
      logp, roll, adv, mask, eps_low=lo.eps_low, eps_high=lo.eps_high, gradient=lo.dis_gradient
    )
  elif algo.policy_loss == "ppo":
    terms = losses.ppo_clip_loss_terms(
      logp,
      old,
      adv,
      mask,
      eps_low=lo.clip_low,
      eps_high=lo.clip_high,
      dual_clip=lo.dual_clip or None,
    )
  else:
    terms = losses.decoupled_ppo_loss_terms(
      logp, old, roll, adv, mask, eps=lo.clip_low, eps_high=lo.clip_high, behav_cap=lo.behav_cap
    )
  loss, m = _share(terms, n_tokens)
  ent_loss, ent_m = _share(losses.entropy_loss_terms(entropy, mask), n_tokens)
  m.update(ent_m)
  if lo.entropy_coef:
    loss = loss + lo.entropy_coef * ent_loss
  if lo.kl_coef:
    kl_loss, kl_m = _share(losses.kl_loss_terms(logp, roll, mask, kind="k3"), n_tokens)
    loss = loss + lo.kl_coef * kl_loss
    m.update(kl_m)
  if lo.nll_coef:
    nll, nll_m = _share(losses.positive_nll_loss_terms(logp, mask, mb["seq_rewards"] > 0), n_pos)
    loss = loss + lo.nll_coef * nll
    m.update(nll_m)
  return loss, m
