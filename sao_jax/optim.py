"""Optimizers: AdamW with global-norm clipping and warm-up schedules, and frozen parameters.

`make_optimizer(config.optim.critic, total_steps=..., labels=critic_param_labels(critic))` gives
the critic's optimizer with its attention frozen: `optax.multi_transform` routes the "frozen" leaves
to `optax.set_to_zero()`, so they get no update and carry no optimizer state (no Adam moments), and
they do not count towards the clipped global norm.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

FROZEN, TRAINABLE = "frozen", "trainable"


def make_schedule(o: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warm-up 0 -> lr over `o.warmup_steps`, then constant or cosine down to 0.1 * lr.

  Args:
    o: an optimizer section of the config (`config.optim.policy` or `.critic`).
    total_steps: optimizer steps of the whole run (the cosine horizon).

  Returns:
    step -> learning rate.
  """
  warmup = int(o.warmup_steps)
  if o.schedule == "constant":
    after = optax.constant_schedule(o.lr)
  else:
    after = optax.cosine_decay_schedule(o.lr, max(total_steps - warmup, 1), alpha=0.1)
  if warmup == 0:
    return after
  # Step 0 already gets lr / warmup: a zero first step would waste a batch.
  ramp = optax.linear_schedule(o.lr / warmup, o.lr, warmup - 1) if warmup > 1 else after
  return optax.join_schedules([ramp, after], [warmup])


def make_optimizer(
  o: ml_collections.ConfigDict, *, total_steps: int, labels: Any | None = None
) -> optax.GradientTransformation:
  """AdamW (+ global-norm clip) for the trainable leaves; nothing at all for frozen ones.

  Args:
    o: an optimizer section of the config.
    total_steps: optimizer steps of the whole run.
    labels: optional pytree (same structure as the params) of FROZEN / TRAINABLE.

  Returns:
    An optax GradientTransformation.
  """
  parts = []
  if o.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(o.clip_norm))
  parts.append(
    optax.adamw(
      make_schedule(o, total_steps), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay
    )
  )
  tx = optax.chain(*parts)
  if labels is None:
    return tx
  return optax.multi_transform({TRAINABLE: tx, FROZEN: optax.set_to_zero()}, labels)


def trainable_mask(labels: Any) -> Any:
  """Bool pytree: True where a leaf is trained."""
  return jax.tree.map(lambda label: label == TRAINABLE, labels)


def global_norm(tree: Any, mask: Any | None = None) -> jax.Array:
  """L2 norm over all leaves (or only those where `mask` is True)."""
  leaves = jax.tree.leaves(tree)
  if mask is not None:
    leaves = [x for x, m in zip(leaves, jax.tree.leaves(mask), strict=True) if m]
  if not leaves:
    return jnp.zeros((), jnp.float32)
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def step_count(opt_state: Any) -> jax.Array:
  """The optimizer's update count (the first `count` field found in its state)."""
  has_count = lambda x: "count" in getattr(x, "_fields", ())
  for s in jax.tree.leaves(opt_state, is_leaf=has_count):
    if has_count(s):
      return s.count
  raise ValueError("optimizer state has no step count")


def num_state_leaves(opt_state: Any) -> int:
  """Number of array leaves (with at least one element) in an optimizer state."""
  return sum(1 for x in jax.tree.leaves(opt_state) if getattr(x, "size", 0) > 1)
