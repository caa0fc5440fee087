"""sao_jax.advantages: hand-computed values, numpy serial references, and invariants."""

import collections

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import advantages as adv_lib

# Jitted once with traced gamma / lam, so hypothesis examples of one shape share a compile.
METHODS = ("associative", "serial")
# One jitted function per method, with traced gamma / lam, so examples of one shape share a compile.
_SKIP_GAE = {
  method: jax.jit(
    lambda r, v, m, gamma, lam, method=method: adv_lib.skip_observation_gae(
      r, v, m, gamma=gamma, lam=lam, method=method
    )
  )
  for method in METHODS
}

# -------------------------------------------------------------------------- numpy references


def _np_skip_gae(r, v, m, gamma, lam):
  """Serial skip-observation GAE in numpy (verl's loop; observation rewards move back)."""
  b, t = r.shape
  lam = np.broadcast_to(np.asarray(lam, np.float64), (b,))
  adv = np.zeros((b, t))
  for i in range(b):
    next_v = next_a = pending = 0.0
    for k in reversed(range(t)):
      if not m[i, k]:
        pending += r[i, k]
        continue
      delta = r[i, k] + pending + gamma * next_v - v[i, k]
      next_a = delta + gamma * lam[i] * next_a
      next_v, pending, adv[i, k] = v[i, k], 0.0, next_a
  return adv, np.where(m, adv + v, 0.0)


def _np_vtrace(r, v, log_rho, m, gamma, lam, rho_clip, c_clip):
  """IMPALA V-trace over the action tokens of each row (serial)."""
  vs, pg = np.zeros(r.shape), np.zeros(r.shape)
  for i in range(r.shape[0]):
    idx = np.flatnonzero(m[i])
    ratio = np.exp(log_rho[i, idx])
    rho, c = np.minimum(rho_clip, ratio), lam * np.minimum(c_clip, ratio)
    val = np.append(v[i, idx], 0.0)
    acc, out = 0.0, np.zeros(len(idx) + 1)
    for k in reversed(range(len(idx))):
      acc = rho[k] * (r[i, idx[k]] + gamma * val[k + 1] - val[k]) + gamma * c[k] * acc
      out[k] = val[k] + acc
    vs[i, idx] = out[:-1]
    pg[i, idx] = rho * (r[i, idx] + gamma * out[1:] - val[:-1])
  return vs, pg


def _random_trajectories(rng, b, t):
  """Rows of: prompt prefix, several action/observation segments, then padding."""
  m = np.zeros((b, t), bool)
  for i in range(b):
    k = int(rng.integers(1, t // 4))
    end = int(rng.integers(t // 2, t + 1))
    while k < end:
      seg = int(rng.integers(1, 6))
      m[i, k : min(k + seg, end)] = True
      k += seg + int(rng.integers(0, 5))  # an observation of 0-4 tokens
  r = np.zeros((b, t))
  for i in range(b):
    idx = np.flatnonzero(m[i])
    if idx.size:
      r[i, idx[-1]] = rng.normal()
  return r, rng.normal(size=(b, t)), m


# ----------------------------------------------------------------------------------- GAE


def test_skip_observation_gae_hand_computed():
  # prompt | a a | obs obs | a | pad ; values off the action tokens must not matter (9.0).
  m = jnp.array([[0, 1, 1, 0, 0, 1, 0]], bool)
  v = jnp.array([[9.0, 0.5, 0.6, 9.0, 9.0, 0.7, 9.0]])
  r = jnp.array([[0.0, 0, 0, 0, 0, 1.0, 0]])
  # A5 = 1 - .7 = .3 ; A2 = .9*.7 - .6 + .72*.3 = .246 ; A1 = .9*.6 - .5 + .72*.246 = .21712
  for method in METHODS:
    a, ret = _SKIP_GAE[method](r, v, m, 0.9, 0.8)
    np.testing.assert_allclose(a[0], [0, 0.21712, 0.246, 0, 0, 0.3, 0], atol=1e-6)
    np.testing.assert_allclose(ret[0], [0, 0.71712, 0.846, 0, 0, 1.0, 0], atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_gae_hand_computed(method):
  m = jnp.array([[0, 1, 1, 1, 0]], bool)
  r, v = jnp.array([[0.0, 0, 0, 1, 0]]), jnp.array([[9.0, 0.5, 0.6, 0.7, 9.0]])
  a, ret = adv_lib.gae(r, v, m, gamma=0.9, lam=0.8, method=method)
  np.testing.assert_allclose(a[0], [0, 0.21712, 0.246, 0.3, 0], atol=1e-6)
  np.testing.assert_allclose(ret[0], [0, 0.71712, 0.846, 1.0, 0], atol=1e-6)


def test_reward_on_observation_moves_to_previous_action():
  m = jnp.array([[0, 1, 1, 0, 0, 1, 0]], bool)
  v = jnp.zeros((1, 7))
  r = jnp.array([[5.0, 0, 0, 0.5, 0.25, 1.0, 2.0]])  # 5.0 on the prompt has no action: ignored
  for method in METHODS:
    a, _ = _SKIP_GAE[method](r, v, m, 1.0, 1.0)
    np.testing.assert_allclose(a[0], [0, 3.75, 3.75, 0, 0, 3.0, 0], atol=1e-6)


@pytest.mark.parametrize("per_row_lam", [False, True])
def test_skip_observation_gae_matches_numpy_serial(per_row_lam):
  rng = np.random.default_rng(0)
  r, v, m = _random_trajectories(rng, 6, 64)
  r[m == 0] = rng.normal(size=(m == 0).sum()) * (rng.random((m == 0).sum()) < 0.1)
  lam = rng.uniform(0.5, 1.0, size=6) if per_row_lam else 0.95
  want_a, want_r = _np_skip_gae(r, v, m, 0.99, lam)
  lam_j = jnp.asarray(lam, jnp.float32)
  args = (jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32), jnp.asarray(m))
  for a, ret in (_SKIP_GAE[method](*args, 0.99, lam_j) for method in METHODS):
    np.testing.assert_allclose(a, want_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_r, rtol=1e-5, atol=1e-5)


def test_no_observations_equals_plain_gae():
  rng = np.random.default_rng(1)
  m = np.zeros((6, 64), bool)
  for i, (s, e) in enumerate([(1, 64), (5, 30), (10, 11), (3, 25), (2, 63), (60, 64)]):
    m[i, s:e] = True  # prompt prefix, one contiguous action span, padding
  r, v = rng.normal(size=(6, 64)) * m, rng.normal(size=(6, 64))  # rewards on action tokens
  args = (jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32), jnp.asarray(m))
  for method in METHODS:
    got = _SKIP_GAE[method](*args, 0.97, 0.9)
    want = jax.jit(lambda *x, method=method: adv_lib.gae(*x, gamma=0.97, lam=0.9, method=method))(
      *args
    )
    for x, y in zip(got, want, strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
  n_actions=st.integers(1, 12),
  obs=st.lists(st.integers(0, 4), min_size=12, max_size=12),
  gamma=st.floats(0.5, 1.0),
  lam=st.floats(0.0, 1.0),
  seed=st.integers(0, 10_000),
)
def test_inserting_observations_leaves_action_advantages_unchanged(
  n_actions, obs, gamma, lam, seed
):
  rng = np.random.default_rng(seed)
  r_act, v_act = rng.normal(size=n_actions), rng.normal(size=n_actions)
  # Row 0: prompt + actions only. Row 1: the same actions with observations (random values and
  # zero rewards) inserted after each action; both padded to the same length.
  rows = [
    [(0.0, 7.0, False)] + [(r_act[k], v_act[k], True) for k in range(n_actions)],
    [(0.0, 7.0, False)],
  ]
  for k in range(n_actions):
    rows[1].append((r_act[k], v_act[k], True))
    rows[1] += [(0.0, rng.normal(), False)] * obs[k]
  t = 64  # fixed T (padding), so every example reuses one compile
  rows += [[]] * 4  # empty rows: the batch shape (6, 64) is shared with other tests' compile
  r, v, m = (np.array([[x[j] for x in row] + [pad] * (t - len(row)) for row in rows])
             for j, pad in ((0, 0.0), (1, 0.0), (2, False)))  # fmt: skip
  for method in METHODS:
    a, ret = _SKIP_GAE[method](*(jnp.asarray(x, jnp.float32) for x in (r, v)), jnp.asarray(m),
                               gamma, lam)  # fmt: skip
    a, ret = np.asarray(a), np.asarray(ret)
    np.testing.assert_allclose(a[1][m[1]], a[0][m[0]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret[1][m[1]], ret[0][m[0]], rtol=1e-5, atol=1e-5)


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(seed=st.integers(0, 10_000))
def test_gamma_lambda_one_returns_final_reward(seed):
  rng = np.random.default_rng(seed)
  r, v, m = _random_trajectories(rng, 6, 64)
  final = r.sum(axis=1, keepdims=True)  # the outcome reward sits on the last action token
  for method in METHODS:
    _, ret = _SKIP_GAE[method](*(jnp.asarray(x, jnp.float32) for x in (r, v)), jnp.asarray(m),
                               1.0, 1.0)  # fmt: skip
    np.testing.assert_allclose(np.asarray(ret)[m], np.broadcast_to(final, m.shape)[m], atol=1e-5)
    assert np.all(np.asarray(ret)[~m] == 0)


def test_associative_scan_long_sequence():
  rng = np.random.default_rng(2)
  r, v, m = _random_trajectories(rng, 2, 2048)
  args = (jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32), jnp.asarray(m))
  got = _SKIP_GAE["associative"](*args, 1.0, 0.999)
  want = _SKIP_GAE["serial"](*args, 1.0, 0.999)
  for x, y in zip(got, want, strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)


def test_response_mask():
  m = jnp.array([[0, 1, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], bool)
  want = [[0, 1, 1, 1, 1, 1, 0, 0], [0] * 8]
  np.testing.assert_array_equal(adv_lib.response_mask(m), np.array(want, bool))


def test_method_auto_and_bad_method():
  assert adv_lib.resolve_method("auto") == ("serial" if jax.default_backend() == "cpu"
                                            else "associative")  # fmt: skip
  with pytest.raises(ValueError, match="method"):
    adv_lib.gae(jnp.zeros((1, 3)), jnp.zeros((1, 3)), jnp.ones((1, 3), bool), gamma=1.0, lam=1.0,
                method="blelloch")  # fmt: skip


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match="B, T"):
    adv_lib.skip_observation_gae(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3), bool),
                                 gamma=1.0, lam=1.0)  # fmt: skip


# ------------------------------------------------------------------------- λ and whitening


def test_length_adaptive_lambda():
  m = jnp.array([[1] * 10 + [0] * 2, [1] * 1 + [0] * 11, [0] * 12, [1] * 12], bool)
  lam = adv_lib.length_adaptive_lambda(m, alpha=1.5)
  np.testing.assert_allclose(lam, [1 - 1 / 15, 1 - 1 / 1.5, 0.0, 1 - 1 / 18], rtol=1e-6)
  assert lam.dtype == jnp.float32 and lam.shape == (4,)
  # VAPO's alpha = 0.05: short responses clip at 0.
  np.testing.assert_allclose(adv_lib.length_adaptive_lambda(m, alpha=0.05), [0, 0, 0, 0])


def test_masked_whiten():
  rng = np.random.default_rng(3)
  x, m = rng.normal(3.0, 2.0, size=(4, 9)), rng.random((4, 9)) < 0.6
  w = np.asarray(adv_lib.masked_whiten(jnp.asarray(x, jnp.float32), jnp.asarray(m)))
  want = (x - x[m].mean()) / np.sqrt(x[m].var(ddof=1) + 1e-8)
  np.testing.assert_allclose(w[m], want[m], rtol=1e-5)
  assert np.all(w[~m] == 0)


# ----------------------------------------------------------------------------------- V-trace


@pytest.mark.parametrize("method", METHODS)
def test_vtrace_on_policy_equals_skip_gae(method):
  rng = np.random.default_rng(4)
  r, v, m = _random_trajectories(rng, 6, 64)
  args = (jnp.asarray(r, jnp.float32), jnp.asarray(v, jnp.float32))
  vtrace = jax.jit(lambda *x: adv_lib.vtrace_targets(*x, gamma=0.99, lam=0.9, method=method))
  vs, _ = vtrace(*args, jnp.zeros((6, 64)), jnp.asarray(m))
  _, ret = _SKIP_GAE["serial"](*args, jnp.asarray(m), 0.99, 0.9)
  np.testing.assert_allclose(vs, ret, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_vtrace_off_policy_matches_numpy(method):
  rng = np.random.default_rng(5)
  r, v, m = _random_trajectories(rng, 6, 64)
  log_rho = rng.normal(scale=0.7, size=r.shape)
  vtrace = jax.jit(
    lambda *x: adv_lib.vtrace_targets(
      *x, gamma=0.95, lam=0.9, rho_clip=1.2, c_clip=0.8, method=method
    )
  )
  vs, pg = vtrace(*(jnp.asarray(x, jnp.float32) for x in (r, v, log_rho)), jnp.asarray(m))
  want_vs, want_pg = _np_vtrace(r, v, log_rho, m, 0.95, 0.9, 1.2, 0.8)
  np.testing.assert_allclose(vs, want_vs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(pg, want_pg, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------ outcome baselines


def _np_group_stats(r, g, scale_by_std):
  out = np.zeros_like(r)
  for gid in np.unique(g):
    idx = g == gid
    if idx.sum() < 2:
      continue
    out[idx] = r[idx] - r[idx].mean()
    if scale_by_std:
      out[idx] /= r[idx].std(ddof=1) + 1e-6
  return out


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_grpo_advantages(scale_by_std):
  rng = np.random.default_rng(6)
  r, g = rng.normal(size=16), rng.permutation(np.repeat(np.arange(4), 4))
  g[0] = 99  # a singleton group: advantage 0
  got = adv_lib.grpo_advantages(jnp.asarray(r), jnp.asarray(g), scale_by_std=scale_by_std)
  np.testing.assert_allclose(got, _np_group_stats(r, g, scale_by_std), rtol=1e-5, atol=1e-6)


def test_grpo_hand_computed_and_equal_rewards():
  got = adv_lib.grpo_advantages(jnp.array([1.0, 0.0, 1.0, 1.0]), jnp.array([0, 0, 1, 1]))
  np.testing.assert_allclose(got, [np.sqrt(0.5), -np.sqrt(0.5), 0, 0], rtol=1e-5)  # .5 / std


def test_rloo_advantages():
  r, g = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 3.0]), np.array([0, 0, 0, 1, 1, 2])
  got = adv_lib.rloo_advantages(jnp.asarray(r), jnp.asarray(g))
  np.testing.assert_allclose(got, [0.5, -1.0, 0.5, -1.0, 1.0, 0.0], rtol=1e-6)


def test_running_mean_matches_deque():
  rng = np.random.default_rng(7)
  state, window = adv_lib.init_running_mean(5), collections.deque(maxlen=5)
  step = jax.jit(adv_lib.running_mean_advantages)
  total = 0
  for b in (3, 8, 1, 6, 4):
    r, ok = rng.normal(size=8), rng.permutation(np.arange(8) < b)  # b valid rows, others padding
    got, state = step(state, jnp.asarray(r, jnp.float32), jnp.asarray(ok))
    base = np.mean(window) if window else r[ok].mean()
    np.testing.assert_allclose(np.asarray(got), np.where(ok, r - base, 0.0), rtol=1e-5, atol=1e-6)
    window.extend(r[ok])
    total += b
    assert int(state.count) == total
  assert sorted(np.asarray(state.rewards)) == pytest.approx(sorted(window), rel=1e-6)


def test_init_running_mean_rejects_empty_window():
  with pytest.raises(ValueError, match="window"):
    adv_lib.init_running_mean(0)
