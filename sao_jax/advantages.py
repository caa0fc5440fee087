"""Advantage estimators: skip-observation GAE, plain GAE, GRPO/RLOO, running mean, V-trace.

Pure, jit-able functions of arrays. Shapes: B = trajectories (rows), T = tokens per row. Token-level
inputs are `[B, T]`; masks are bool. Every token-level output is 0 where its mask is False.

Skip-observation GAE runs the TD(λ) recursion over action tokens only: an action token bootstraps
from the NEXT ACTION token, so observation, prompt and padding tokens (which the policy did not
choose) never enter the chain. Every recursion here is a first-order linear recurrence
x_t = a_t * x_{t+1} + b_t, evaluated with `jax.lax.associative_scan` (O(log T) depth), so a
128k-token trajectory is not a 128k-step serial loop on an accelerator.

`method` ('auto' | 'associative' | 'serial'): 'auto' is 'associative' on TPU/GPU and 'serial' (one
`lax.scan` over T) on CPU, where a serial loop is cheap per step, measured faster, and compiles
~10x faster (benchmarks/README.md, bench_loss). Both give the same numbers (tests/test_advantages.py).

References:
  GAE: Schulman et al. 2016, arXiv 1506.02438. Skip-observation GAE / decoupled length-adaptive λ:
  SAO, arXiv 2607.07508; VAPO, arXiv 2504.05118. GRPO: arXiv 2402.03300. Dr.GRPO: arXiv 2503.20783.
  RLOO: Ahmadian et al. 2024, arXiv 2402.14740. V-trace: IMPALA, Espeholt et al. 2018,
  arXiv 1802.01561.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

_F32 = jnp.float32


# ---------------------------------------------------------------------------------------- scans


METHODS = ("auto", "associative", "serial")


def resolve_method(method: str) -> str:
  """'auto' -> 'serial' on CPU, 'associative' elsewhere; validates the name."""
  if method not in METHODS:
    raise ValueError(f"method: must be one of {METHODS}, got {method!r}")
  if method == "auto":
    return "serial" if jax.default_backend() == "cpu" else "associative"
  return method


def reverse_linear_scan(a_bt: jax.Array, b_bt: jax.Array, *, method: str = "auto") -> jax.Array:
  """Solves x_t = a_t * x_{t+1} + b_t backwards along axis 1, with x_T = 0.

  Args:
    a_bt: [B, T] coefficients.
    b_bt: [B, T] offsets.
    method: 'associative' (`jax.lax.associative_scan`, O(log T) depth), 'serial' (`lax.scan`,
      T steps) or 'auto'.

  Returns:
    [B, T] x.
  """
  if resolve_method(method) == "serial":

    def step(x, ab):
      x = ab[0] * x + ab[1]
      return x, x

    _, x_tb = jax.lax.scan(step, jnp.zeros_like(a_bt[:, 0]), (a_bt.T, b_bt.T), reverse=True)
    return x_tb.T

  def compose(later, earlier):
    # With reverse=True the scan folds from t = T - 1 down; `later` holds the already-composed
    # tail (larger t), `earlier` the element at smaller t: earlier ∘ later.
    a_l, b_l = later
    a_e, b_e = earlier
    return a_e * a_l, a_e * b_l + b_e

  _, x = jax.lax.associative_scan(compose, (a_bt, b_bt), reverse=True, axis=1)
  return x


class _Compaction(NamedTuple):
  """Where each action token goes when a row's action tokens are moved to its front, in order."""

  rank: jax.Array  # [B, T] int32: index of token t among its row's action tokens (t is an action)
  slot: jax.Array  # [B, T] int32: rank on action tokens, T (out of range: dropped) elsewhere
  valid: jax.Array  # [B, T] bool: compacted position k holds an action token (k < row's count)


def _compaction(m_bt: jax.Array) -> _Compaction:
  t = m_bt.shape[1]
  rank = jnp.cumsum(m_bt.astype(jnp.int32), axis=1) - 1
  count = rank[:, -1:] + 1  # [B, 1]
  return _Compaction(rank, jnp.where(m_bt, rank, t), jnp.arange(t)[None, :] < count)


def _compact(x_bt: jax.Array, c: _Compaction, *, add: bool = False) -> jax.Array:
  """Moves the action tokens' x to the front of each row ([B, T]; 0 after them).

  With add=True every token's x is summed into `c.slot` instead (used with a shifted slot to
  credit observation rewards to the preceding action token).
  """
  put = lambda x, slot: (
    jnp.zeros_like(x).at[slot].add(x, mode="drop")
    if add
    else jnp.zeros_like(x).at[slot].set(x, mode="drop")
  )
  return jax.vmap(put)(x_bt, c.slot)


def _expand(x_c: jax.Array, c: _Compaction, m_bt: jax.Array) -> jax.Array:
  """Inverse of `_compact`: compacted [B, T] values back to their action tokens, 0 elsewhere."""
  return jnp.where(m_bt, jnp.take_along_axis(x_c, jnp.maximum(c.rank, 0), axis=1), 0.0)


def _shift_left(x_bt: jax.Array) -> jax.Array:
  """x[:, t + 1], with 0 at the end."""
  return jnp.pad(x_bt[:, 1:], ((0, 0), (0, 1)))


def _per_row(x, batch: int) -> jax.Array:
  """A scalar or a [B] array as a [B, 1] float32 column."""
  return jnp.broadcast_to(jnp.asarray(x, _F32), (batch,))[:, None]


def _check_bt(**arrays):
  shapes = {k: tuple(v.shape) for k, v in arrays.items()}
  first = next(iter(shapes.values()))
  if len(first) != 2 or any(s != first for s in shapes.values()):
    raise ValueError(f"expected [B, T] arrays of one shape, got {shapes}")


def _action_chain(rewards, values, action_mask):
  """Compacted (rewards incl. moved observation rewards, values) of the action tokens, [B, T]."""
  m = action_mask.astype(bool)
  c = _compaction(m)
  r = rewards.astype(_F32)
  r_c = _compact(r, c)
  # A reward on a non-action position goes to the preceding action token (rank of t's last
  # action); before the first action there is none (slot -1 -> dropped).
  obs_slot = jnp.where(m | (c.rank < 0), m.shape[1], c.rank)
  r_c = r_c + _compact(jnp.where(m, 0.0, r), c._replace(slot=obs_slot), add=True)
  return c, m, r_c, _compact(values.astype(_F32), c)


# ---------------------------------------------------------------------------------------- GAE


def skip_observation_gae(
  rewards: jax.Array,
  values: jax.Array,
  action_mask: jax.Array,
  *,
  gamma: float,
  lam: float | jax.Array,
  method: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """GAE over action tokens only: each action token bootstraps from the next action token.

    δ_t = r_t + γ V(next(t)) − V(t)    (V(next) = 0 after the last action token)
    A_t = δ_t + γ λ A_next(t),         R_t = A_t + V(t)

  A reward on a non-action position is moved onto the preceding action token (undiscounted), not
  dropped; a reward before the first action token has no action to credit and is ignored.
  Associative method: each row's action tokens are compacted to its front (a cumsum and a
  scatter), where the recursion is ordinary GAE, solved by one associative scan; results are
  gathered back. Serial method: `skip_observation_gae_serial`.

  Args:
    rewards: [B, T] float rewards (the outcome reward sits on the last action token).
    values: [B, T] critic values V(s_t).
    action_mask: [B, T] bool, True on tokens sampled by the policy.
    gamma: discount.
    lam: GAE λ, a scalar or a [B] array (per trajectory, e.g. `length_adaptive_lambda`).
    method: 'auto', 'associative' or 'serial' (module docstring).

  Returns:
    (advantages, returns): [B, T] float32 each, 0 where action_mask is False.

  References:
    SAO (arXiv 2607.07508) §Skip-Observation GAE; verl PR #2337 (the same recursion, serially).
  """
  _check_bt(rewards=rewards, values=values, action_mask=action_mask)
  if resolve_method(method) == "serial":
    return skip_observation_gae_serial(rewards, values, action_mask, gamma=gamma, lam=lam)
  c, m, r_c, v_c = _action_chain(rewards, values, action_mask)
  adv_c, _ = gae(r_c, v_c, c.valid, gamma=gamma, lam=lam, method="associative")
  adv = _expand(adv_c, c, m)
  return adv, jnp.where(m, adv + values.astype(_F32), 0.0)


def skip_observation_gae_serial(
  rewards: jax.Array,
  values: jax.Array,
  action_mask: jax.Array,
  *,
  gamma: float,
  lam: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
  """The same recursion as `skip_observation_gae`, as a serial reverse `lax.scan` over T.

  The 'serial' method of `skip_observation_gae` (the default on CPU), the reference for its
  associative form in tests, and the baseline in benchmarks/bench_loss.py. Arguments and returns
  as in `skip_observation_gae`.
  """
  m = action_mask.astype(bool).T  # [T, B]: scan over time
  r, v = rewards.astype(_F32).T, values.astype(_F32).T
  gl = gamma * _per_row(lam, m.shape[1])[:, 0]  # [B]

  def step(carry, x):
    next_v, next_adv, pending = carry
    r_t, v_t, m_t = x
    adv = r_t + pending + gamma * next_v - v_t + gl * next_adv
    new = (jnp.where(m_t, v_t, next_v), jnp.where(m_t, adv, next_adv),
           jnp.where(m_t, 0.0, pending + r_t))  # fmt: skip
    return new, jnp.where(m_t, adv, 0.0)

  zeros = jnp.zeros(m.shape[1], _F32)
  _, adv = jax.lax.scan(step, (zeros, zeros, zeros), (r, v, m), reverse=True)
  return adv.T, jnp.where(m, adv + v, 0.0).T


def gae(
  rewards: jax.Array,
  values: jax.Array,
  mask: jax.Array,
  *,
  gamma: float,
  lam: float | jax.Array,
  method: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """Plain token GAE over the positions where `mask` is True; each bootstraps from position t + 1.

    δ_t = r_t + γ m_{t+1} V_{t+1} − V_t,   A_t = δ_t + γ λ m_{t+1} A_{t+1}

  A False position ends the chain (the token before it bootstraps 0); rewards there are ignored.
  For slime-style plain GAE over a multi-turn trajectory (observations inside the chain), pass
  `response_mask(action_mask)` and mask the policy loss with `action_mask`. With a contiguous mask
  (and rewards only on it) this equals skip_observation_gae.

  Args:
    rewards: [B, T] float rewards.
    values: [B, T] critic values.
    mask: [B, T] bool, the tokens of the chain.
    gamma: discount.
    lam: GAE λ, a scalar or a [B] array.
    method: 'auto', 'associative' or 'serial' (module docstring).

  Returns:
    (advantages, returns): [B, T] float32 each, 0 where mask is False.

  References:
    Schulman et al. 2016, arXiv 1506.02438, eq. 16.
  """
  _check_bt(rewards=rewards, values=values, mask=mask)
  m = mask.astype(bool)
  v = jnp.where(m, values.astype(_F32), 0.0)
  m_next = _shift_left(m)
  delta = jnp.where(m, rewards.astype(_F32) + gamma * _shift_left(v) - v, 0.0)
  gl = gamma * _per_row(lam, m.shape[0])
  adv = reverse_linear_scan(jnp.where(m & m_next, gl, 0.0), delta, method=method)
  return adv, jnp.where(m, adv + v, 0.0)


def response_mask(action_mask: jax.Array) -> jax.Array:
  """[B, T] bool: from the first to the last action token of each row, observations included."""
  m = action_mask.astype(bool)
  seen_before = jnp.cumsum(m, axis=1) > 0
  seen_after = jnp.flip(jnp.cumsum(jnp.flip(m, 1), axis=1), 1) > 0
  return seen_before & seen_after


def length_adaptive_lambda(action_mask: jax.Array, *, alpha: float) -> jax.Array:
  """Per-trajectory policy λ = 1 − 1/(α·l), l = number of action tokens, clipped to [0, 1].

  Args:
    action_mask: [B, T] bool.
    alpha: α (SAO 1.5, VAPO 0.05).

  Returns:
    [B] float32 λ (0 for a row without action tokens).

  References:
    VAPO, arXiv 2504.05118 §length-adaptive GAE; SAO, arXiv 2607.07508 (α = 1.5).
  """
  length = jnp.sum(action_mask.astype(_F32), axis=-1)  # [B]
  lam = 1.0 - 1.0 / jnp.maximum(alpha * length, 1e-30)
  return jnp.clip(jnp.where(length > 0, lam, 0.0), 0.0, 1.0)


def masked_whiten(x: jax.Array, mask: jax.Array, *, eps: float = 1e-8) -> jax.Array:
  """(x − mean) / sqrt(var + eps) over the masked entries (unbiased var, as verl); 0 elsewhere.

  Args:
    x: [...] values (e.g. [B, T] advantages).
    mask: [...] bool, same shape.
    eps: added to the variance.

  Returns:
    float32 array shaped like x.
  """
  m = mask.astype(_F32)
  n = jnp.sum(m)
  mean = jnp.sum(m * x) / jnp.maximum(n, 1.0)
  var = jnp.sum(m * jnp.square(x - mean)) / jnp.maximum(n - 1.0, 1.0)
  return jnp.where(mask, (x - mean) * jax.lax.rsqrt(var + eps), 0.0).astype(_F32)


# ------------------------------------------------------------------------------- V-trace


def vtrace_targets(
  rewards: jax.Array,
  values: jax.Array,
  log_rhos: jax.Array,
  action_mask: jax.Array,
  *,
  gamma: float,
  lam: float | jax.Array = 1.0,
  rho_clip: float = 1.0,
  c_clip: float = 1.0,
  method: str = "auto",
) -> tuple[jax.Array, jax.Array]:
  """V-trace value targets and policy-gradient advantages, over action tokens (skip-observation).

    ρ_t = min(ρ̄, e^{log ρ_t}),  c_t = λ min(c̄, e^{log ρ_t}),  δ_t = ρ_t (r_t + γ V(next) − V(t))
    v_t − V(t) = δ_t + γ c_t (v_next − V(next)),     A^pg_t = ρ_t (r_t + γ v_next − V(t))

  "next" is the next action token (as in skip_observation_gae; v_next = V(next) = 0 at the end).
  On-policy (log ρ = 0, ρ̄ = c̄ = 1) v_t equals the skip-observation GAE return with the same λ.

  Args:
    rewards: [B, T] float rewards.
    values: [B, T] critic values.
    log_rhos: [B, T] log π_target(a_t) − log π_behaviour(a_t).
    action_mask: [B, T] bool.
    gamma: discount.
    lam: trace λ, scalar or [B].
    rho_clip: ρ̄.
    c_clip: c̄.
    method: 'auto', 'associative' or 'serial' (module docstring).

  Returns:
    (vs, pg_advantages): [B, T] float32 each, 0 off the action mask.

  References:
    IMPALA, Espeholt et al. 2018, arXiv 1802.01561, eq. 1 and §4.2.
  """
  _check_bt(rewards=rewards, values=values, log_rhos=log_rhos, action_mask=action_mask)
  c, m, r_c, v_c = _action_chain(rewards, values, action_mask)  # compacted: next = k + 1
  ratio = jnp.exp(jnp.minimum(_compact(log_rhos.astype(_F32), c), 30.0))
  rho = jnp.minimum(rho_clip, ratio)
  trace = gamma * _per_row(lam, m.shape[0]) * jnp.minimum(c_clip, ratio)
  delta = jnp.where(c.valid, rho * (r_c + gamma * _shift_left(v_c) - v_c), 0.0)
  vs_c = reverse_linear_scan(jnp.where(c.valid, trace, 0.0), delta, method=method) + v_c
  pg_c = rho * (r_c + gamma * _shift_left(vs_c) - v_c)
  return _expand(vs_c, c, m), _expand(pg_c, c, m)


# ------------------------------------------------------------------------ outcome baselines


def _group_matrix(group_ids: jax.Array) -> jax.Array:
  """[B, B] float32, 1 where rows i and j share a group."""
  return (group_ids[:, None] == group_ids[None, :]).astype(_F32)


def grpo_advantages(
  rewards: jax.Array, group_ids: jax.Array, *, scale_by_std: bool = True, eps: float = 1e-6
) -> jax.Array:
  """Group-normalized outcome advantages: (R − mean_G R) / (std_G R + eps), or Dr.GRPO's R − mean.

  The std is the unbiased sample std (as verl/TRL); a group of one gets advantage 0 (sao_jax's
  config rejects GRPO at G = 1 instead of training on that).

  Args:
    rewards: [B] float rewards.
    group_ids: [B] int group ids (rows sampled from one prompt share one).
    scale_by_std: divide by the group std (GRPO); False gives Dr.GRPO.
    eps: added to the std.

  Returns:
    [B] float32 advantages (broadcast over a row's action tokens by the caller).

  References:
    GRPO, DeepSeekMath arXiv 2402.03300 §4.1.2; Dr.GRPO, arXiv 2503.20783.
  """
  r = rewards.astype(_F32)
  same = _group_matrix(group_ids)  # [B, B]
  count = jnp.sum(same, axis=1)
  mean = same @ r / count
  adv = r - mean
  if scale_by_std:
    var = same @ jnp.square(r) / count - jnp.square(mean)
    var = jnp.maximum(var, 0.0) * count / jnp.maximum(count - 1.0, 1.0)
    adv = adv / (jnp.sqrt(var) + eps)
  return jnp.where(count > 1, adv, 0.0)


def rloo_advantages(rewards: jax.Array, group_ids: jax.Array) -> jax.Array:
  """Leave-one-out baseline: A_i = R_i − mean of the other rewards in i's group (0 for G = 1).

  Args:
    rewards: [B] float rewards.
    group_ids: [B] int group ids.

  Returns:
    [B] float32 advantages.

  References:
    Kool et al. 2019 (buy 4 REINFORCE samples); Ahmadian et al. 2024, arXiv 2402.14740.
  """
  r = rewards.astype(_F32)
  same = _group_matrix(group_ids)
  count = jnp.sum(same, axis=1)
  others = (same @ r - r) / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(count > 1, r - others, 0.0)


class RunningMeanState(NamedTuple):
  """Ring buffer of the last `window` rewards (a TrainState leaf).

  Attributes:
    rewards: [window] float32 ring; slot k holds reward number k (mod window).
    count: [] int32 total rewards ever pushed.
  """

  rewards: jax.Array
  count: jax.Array


def init_running_mean(window: int) -> RunningMeanState:
  """An empty running-mean baseline over the last `window` rewards."""
  if window < 1:
    raise ValueError(f"window: must be >= 1, got {window}")
  return RunningMeanState(jnp.zeros((window,), _F32), jnp.zeros((), jnp.int32))


def running_mean_advantages(
  state: RunningMeanState, rewards_b: jax.Array, valid_b: jax.Array
) -> tuple[jax.Array, RunningMeanState]:
  """A = r − mean of the last `window` rewards seen BEFORE this batch; then pushes the batch.

  Cold start: while no reward has been seen the baseline is this batch's mean valid reward.
  Invalid rows (padding) get advantage 0 and are not pushed. Valid rewards are pushed in row order.

  Args:
    state: from `init_running_mean` or a previous call.
    rewards_b: [B] float rewards.
    valid_b: [B] bool, rows that hold a real trajectory.

  Returns:
    (advantages_b [B] float32, new_state).

  References:
    SAO (arXiv 2607.07508) running-mean ablation: window of the last 128 rewards.
  """
  window = state.rewards.shape[0]
  r = rewards_b.astype(_F32)
  ok = valid_b.astype(bool)
  n_hist = jnp.minimum(state.count, window).astype(_F32)
  hist_mean = jnp.sum(state.rewards) / jnp.maximum(n_hist, 1.0)  # unfilled slots are 0
  batch_mean = jnp.sum(jnp.where(ok, r, 0.0)) / jnp.maximum(jnp.sum(ok), 1)
  baseline = jnp.where(n_hist > 0, hist_mean, batch_mean)
  adv = jnp.where(ok, r - baseline, 0.0)
  # Slot of each pushed reward; only the last `window` of this batch are written (unique slots).
  order = jnp.cumsum(ok) - 1  # [B] index among valid rows
  n_new = jnp.sum(ok)
  keep = ok & (n_new - 1 - order < window)
  slot = jnp.where(keep, (state.count + order) % window, window)  # `window` = out of range: dropped
  ring = state.rewards.at[slot].set(r, mode="drop")
  return adv, RunningMeanState(ring, state.count + n_new.astype(jnp.int32))
