"""The training loop end to end on the tiny model: resume is exact, lag mode is reproducible,
non-finite steps stop the run with a checkpoint, and algorithms run in sync and lag modes."""

import json

import numpy as np
import pytest

from sao_jax import algos, checkpoint, envs, testing, train
from sao_jax import config as config_lib


def _config(algo="sao", mode="sync", lag=0, steps=2, **kw):
  c = testing.tiny_config(algo, mode=mode, policy_lag=lag, total_steps=steps, **kw)
  return config_lib.validate(c)


def _jsonl(workdir):
  with open(f"{workdir}/metrics.jsonl") as f:
    return [json.loads(line) for line in f]


def _params(workdir):
  ckpt = checkpoint.Checkpointer(f"{workdir}/checkpoints")
  step = ckpt.latest_step()
  import orbax.checkpoint as ocp  # the raw arrays, whatever the sharding

  tree = ocp.CheckpointManager(f"{workdir}/checkpoints").restore(
    step, args=ocp.args.Composite(state=ocp.args.StandardRestore())
  )["state"]
  return step, tree


def test_resume_is_exact_and_lag_mode_reproducible(tmp_path):
  """6 steps straight == 3 steps, stop, restart, 3 more (lag mode, k = 1), bit for bit."""
  straight = _config(mode="lag", lag=1, steps=6, checkpoint_every=3)
  train.train(straight, str(tmp_path / "a"), progress=False)
  first = _config(mode="lag", lag=1, steps=3)
  train.train(first, str(tmp_path / "b"), progress=False)
  s = train.train(_config(mode="lag", lag=1, steps=6), str(tmp_path / "b"), progress=False)
  assert s["steps"] == 6
  (sa, a), (sb, b) = _params(tmp_path / "a"), _params(tmp_path / "b")
  assert sa == sb == 6
  leaves_a, leaves_b = (np.asarray(x) for x in a), (np.asarray(x) for x in b)
  import jax

  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  del leaves_a, leaves_b
  rows_a = [r for r in _jsonl(tmp_path / "a") if "policy/loss" in r]
  rows_b = [r for r in _jsonl(tmp_path / "b") if "policy/loss" in r]
  assert [r["step"] for r in rows_a] == list(range(6)) == [r["step"] for r in rows_b]
  for ra, rb in zip(rows_a, rows_b, strict=True):
    for k in ("policy/loss", "critic/value_loss", "reward/mean", "policy_lag/mean"):
      assert ra[k] == rb[k], (ra["step"], k)
  # Lag 1: after the critic-only step, every action token is one version behind the learner.
  assert [r["policy_lag/mean"] for r in rows_a] == [0, 0, 1, 1, 1, 1]


def test_nonfinite_steps_stop_with_a_checkpoint(tmp_path, monkeypatch):
  make = envs.make

  def nan_rewards(env_config):
    factory = make(env_config)

    class Env:
      def __init__(self):
        self.env = factory()

      def reset(self, task):
        return self.env.reset(task)

      def step(self, action):
        r = self.env.step(action)
        return (
          r._replace(reward=float("nan"), done=True)
          if hasattr(r, "_replace")
          else type(r)(r.observation, float("nan"), True, r.info)
        )

      def close(self):
        self.env.close()

    f = lambda: Env()
    f.name, f.set_step = factory.name, factory.set_step
    return f

  monkeypatch.setattr(train.envs, "make", nan_rewards)
  with pytest.raises(RuntimeError, match="3 consecutive non-finite steps"):
    train.train(_config(steps=5, max_nonfinite_steps=3), str(tmp_path), progress=False)
  rows = _jsonl(tmp_path)
  assert [r["skipped"] for r in rows] == [1, 1, 1]
  assert checkpoint.Checkpointer(f"{tmp_path}/checkpoints").latest_step() == 3


_LOOP_FAST = {("sao", "sync"), ("sao", "lag"), ("grpo", "sync")}


@pytest.mark.parametrize(
  "algo,mode",
  [
    pytest.param(a, m, marks=() if (a, m) in _LOOP_FAST else pytest.mark.slow)
    for a in sorted(algos.ALGOS)
    for m in ("sync", "lag")
  ],
)
def test_algo_runs_two_steps(algo, mode, tmp_path):
  c = _config(algo, mode, lag=1 if mode == "lag" else 0)
  s = train.train(c, str(tmp_path), progress=False)
  rows = [r for r in _jsonl(tmp_path) if "policy/loss" in r]
  assert s["steps"] == 2 and len(rows) == 2
  assert all(np.isfinite(v) for r in rows for v in r.values())
  assert all(r["skipped"] == 0 for r in rows)
