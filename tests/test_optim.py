"""Schedules hit their numbers; frozen leaves get no update and no optimizer state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sao_jax import config as config_lib
from sao_jax import optim


def _section(**kw):
  o = config_lib.base_config().optim.critic
  for k, v in kw.items():
    o[k] = v
  return o


def test_warmup_then_constant():
  sched = optim.make_schedule(_section(lr=1.0, warmup_steps=4), total_steps=100)
  np.testing.assert_allclose([float(sched(i)) for i in range(6)], [0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_cosine_ends_at_tenth():
  sched = optim.make_schedule(_section(lr=2.0, warmup_steps=0, schedule="cosine"), total_steps=50)
  assert float(sched(0)) == 2.0
  np.testing.assert_allclose(float(sched(50)), 0.2, rtol=1e-6)


def test_frozen_leaves_get_no_update_and_no_state():
  params = {"attn": {"q": jnp.ones((3, 3))}, "mlp": {"w": jnp.ones((3, 3))}}
  labels = {"attn": {"q": optim.FROZEN}, "mlp": {"w": optim.TRAINABLE}}
  tx = optim.make_optimizer(_section(lr=0.1, warmup_steps=0), total_steps=10, labels=labels)
  state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_array_equal(params["attn"]["q"], np.ones((3, 3)))
  assert not np.allclose(params["mlp"]["w"], 1.0)
  # Adam moments exist for the trainable leaf only: mu and nu of one 3x3 matrix.
  assert optim.num_state_leaves(state) == 2
  assert int(optim.step_count(state)) == 3


def test_clip_uses_trainable_norm_only():
  params = {"a": jnp.zeros(4), "b": jnp.zeros(4)}
  labels = {"a": optim.FROZEN, "b": optim.TRAINABLE}
  tx = optim.make_optimizer(
    _section(lr=1.0, warmup_steps=0, clip_norm=1.0, b1=0.0, b2=0.0, eps=0.0),
    total_steps=10,
    labels=labels,
  )
  # With b1 = b2 = 0 Adam's update is sign(g): the clip cannot be seen, but the norm helper can.
  g = {"a": jnp.full(4, 100.0), "b": jnp.full(4, 3.0)}
  assert float(optim.global_norm(g, optim.trainable_mask(labels))) == 6.0
  updates, _ = tx.update(g, tx.init(params), params)
  np.testing.assert_allclose(updates["b"], -np.ones(4), rtol=1e-6)
  np.testing.assert_array_equal(updates["a"], np.zeros(4))
