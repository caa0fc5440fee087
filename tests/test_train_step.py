"""The learner step: numbers against direct computations, frozen attention, K, skips, micro-batches."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sao_jax import advantages as adv_lib
from sao_jax import algos, losses, models, optim, testing, train_step
from sao_jax import config as config_lib

B, T = 4, 24


@pytest.fixture(autouse=True, scope="module")
def _fast_compile():
  """XLA's optimizations cost most of the compile time of these tiny steps and change no result."""
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", False)


def _config(algo="sao", **loss):
  c = config_lib.apply_algo(config_lib.base_config(), algo)
  c.batch_size = B if c.group_size == 1 else 2 * c.group_size
  c.total_steps = 10
  c.loss.critic_only_steps = 0
  c.optim.policy.lr = 1e-2
  c.optim.critic.lr = 1e-2
  c.optim.critic.warmup_steps = 0
  for k, v in loss.items():
    c.loss[k] = v
  return c


def _models(config):
  cfg = models.get_preset("tiny")
  policy = models.Policy(cfg, rngs=nnx.Rngs(0))
  critic = None
  if algos.ALGOS[config.algo].critic:
    critic = models.critic_from_policy(policy, rngs=nnx.Rngs(1), head_init_std=1.0)
  return policy, critic


def _batch(policy, b=B, seed=0, group_size=1):
  return testing.synthetic_batch(policy, batch_size=b, seq_len=T, seed=seed, group_size=group_size)


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_policy_loss_and_grad_match_a_direct_computation_under_micro_batches():
  config = _config()
  policy, critic = _models(config)
  learner, state = train_step.init_state(config, policy, critic)
  batch = {k: jnp.asarray(v) for k, v in _batch(policy).items()}
  values = critic.values(batch["tokens"], batch["positions"], batch["segment_ids"])
  lam = adv_lib.length_adaptive_lambda(batch["action_mask"], alpha=1.5)
  adv, _ = adv_lib.skip_observation_gae(
    batch["rewards"], values, batch["action_mask"], gamma=1.0, lam=lam
  )

  def direct(params):
    logp, _ = nnx.merge(learner.policy_def, params).token_logprobs(
      batch["tokens"], batch["positions"], batch["segment_ids"]
    )
    return losses.dis_policy_loss(
      logp, batch["rollout_logprobs"], adv, batch["action_mask"], eps_low=0.3, eps_high=5.0
    )

  (want_loss, want_m), want_g = jax.jit(jax.value_and_grad(direct, has_aux=True))(state.policy)
  n = jnp.sum(batch["action_mask"]).astype(jnp.float32)
  n_pos = jnp.maximum(jnp.sum(batch["action_mask"] & (batch["seq_rewards"] > 0)[:, None]), 1.0)
  fn = functools.partial(
    train_step._policy_loss, config, algos.ALGOS["sao"], learner, n_tokens=n, n_pos=n_pos
  )
  for m in (1, 2):
    mb = train_step.split_micro(dict(batch, advantages=adv), m)
    loss, grads, metrics = jax.jit(functools.partial(train_step.accumulate, fn))(state.policy, mb)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-7)
    for a, b in zip(_leaves(grads), _leaves(want_g), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    for k in ("dis_masked_below", "dis_masked_above", "ratio_mean", "ratio_max"):
      np.testing.assert_allclose(metrics[k], want_m[k], rtol=1e-5)
  assert float(want_m["dis_masked_below"]) > 0  # the perturbation puts some tokens outside


def test_critic_attention_frozen_and_k_steps():
  config = _config()
  policy, critic = _models(config)
  learner, state = train_step.init_state(config, policy, critic)
  labels = models.critic_param_labels(state.critic)
  before = jax.tree.map(np.asarray, state.critic)
  step = train_step.make_train_step(config, learner, donate=False)
  for s in range(2):
    state, metrics = step(state, _batch(policy, seed=s))
  frozen = [x == optim.FROZEN for x in jax.tree.leaves(labels)]
  assert any(frozen) and not all(frozen)
  for f, a, b in zip(frozen, _leaves(state.critic), jax.tree.leaves(before), strict=True):
    assert np.array_equal(a, b) == f  # frozen leaves bit-identical, trainable ones moved
  assert int(optim.step_count(state.critic_opt)) == 2 * int(optim.step_count(state.policy_opt)) == 4
  # Frozen leaves carry no Adam moments.
  n_trainable = sum(
    1 for f, x in zip(frozen, jax.tree.leaves(before), strict=True) if not f and x.size > 1
  )
  assert optim.num_state_leaves(state.critic_opt) == 2 * n_trainable
  assert int(state.version) == 2 and int(state.step) == 2
  assert np.isfinite(float(metrics["critic/explained_variance"]))


def test_critic_only_warmup_keeps_policy_fixed():
  config = _config(critic_only_steps=2)
  policy, critic = _models(config)
  learner, state = train_step.init_state(config, policy, critic)
  p0 = _leaves(state.policy)
  step = train_step.make_train_step(config, learner, donate=False)
  for s in range(2):
    state, m = step(state, _batch(policy, seed=s))
    assert float(m["policy/updated"]) == 0
  assert all(np.array_equal(a, b) for a, b in zip(_leaves(state.policy), p0, strict=True))
  assert int(state.version) == 0 and int(optim.step_count(state.critic_opt)) == 4
  state, m = step(state, _batch(policy, seed=3))
  assert float(m["policy/updated"]) == 1 and int(state.version) == 1


@pytest.mark.parametrize("field,value", [("rewards", np.nan), ("rollout_logprobs", -np.inf)])
def test_nonfinite_batch_skips_the_update(field, value):
  config = _config()
  policy, critic = _models(config)
  learner, state = train_step.init_state(config, policy, critic)
  before = _leaves(state)
  batch = _batch(policy)
  i, j = np.argwhere(batch["action_mask"])[3]
  batch[field][i, j] = value
  new, m = train_step.make_train_step(config, learner, donate=False)(state, batch)
  assert float(m["skipped"]) == 1
  after = _leaves(new.replace(step=state.step, rng=state.rng))
  assert all(np.array_equal(a, b) for a, b in zip(after, before, strict=True))


def test_micro_batch_size_does_not_change_the_step():
  outs = []
  for mb in (0, 2):
    config = _config()
    config.micro_batch_size = mb
    # Adam's first update is ~lr * sign(g); a large eps makes it linear in g, so the comparison
    # sees gradient differences at their true (tiny) size.
    config.optim.policy.eps = config.optim.critic.eps = 1.0
    policy, critic = _models(config)
    learner, state = train_step.init_state(config, policy, critic)
    state, m = train_step.make_train_step(config, learner)(state, _batch(policy))
    outs.append((_leaves(state.policy) + _leaves(state.critic), m))
  for a, b in zip(outs[0][0], outs[1][0], strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for k in outs[0][1]:
    np.testing.assert_allclose(outs[0][1][k], outs[1][1][k], rtol=1e-4, atol=1e-6, err_msg=k)


# Together these cover every advantage estimator and policy loss; the rest run in `make test-all`.
_FAST_ALGOS = ("sao", "grpo", "ppo", "running_mean", "decoupled_ppo", "vapo")


@pytest.mark.parametrize(
  "algo",
  [a if a in _FAST_ALGOS else pytest.param(a, marks=pytest.mark.slow) for a in sorted(algos.ALGOS)],
)
def test_every_algo_takes_two_finite_steps(algo):
  config = _config(algo)
  config.loss.nll_coef = config.loss.nll_coef or 0.0
  policy, critic = _models(config)
  learner, state = train_step.init_state(config, policy, critic)
  step = train_step.make_train_step(config, learner)
  for s in range(2):
    state, m = step(
      state, _batch(policy, b=config.batch_size, seed=s, group_size=config.group_size)
    )
    assert float(m["skipped"]) == 0
    assert all(np.isfinite(float(v)) for v in m.values()), m
  assert int(state.version) == 2
