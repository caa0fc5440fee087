"""Tests for sao_jax.train_lib: rollout metrics, the lag ring, task grouping, summaries."""

import numpy as np
import pytest

from sao_jax import testing, train_lib, types
from sao_jax.replay.testing import make_trajectory


def _trajs():
  a = make_trajectory("a", length=8, version=3, oldest_version=1, seed=0)
  b = make_trajectory("b", length=12, version=3, seed=1)
  a.reward, b.reward = 1.0, 0.0
  a.metadata.update(turns=2, finish_reason="answer", r_quality=1.0, r_style=1, style="cute")
  b.metadata.update(turns=4, finish_reason="max_turns", r_quality=0.0, truncated=True)
  return [a, b]


def test_rollout_metrics_by_hand():
  trajs = _trajs()
  batch = types.make_batch(trajs, seq_len=16)
  m = train_lib.rollout_metrics(trajs, batch, version=5)
  assert m["reward/mean"] == 0.5 and m["reward/std"] == 0.5
  assert m["response/turns"] == 3.0 and m["response/tokens"] == 10.0
  assert m["finish/answer"] == m["finish/max_turns"] == 0.5
  lags = np.concatenate([5 - t.policy_versions[t.action_mask] for t in trajs])
  assert m["policy_lag/max"] == 4 and m["policy_lag/mean"] == pytest.approx(lags.mean())
  assert m["batch/padding_fraction"] == pytest.approx(1 - 20 / 32)
  # Numeric env metadata is averaged (missing counts as 0); strings and booleans are not.
  assert m["env/r_quality"] == 0.5 and m["env/r_style"] == 0.5
  assert not any(k in m for k in ("env/style", "env/truncated", "env/turns", "env/finish_reason"))


def test_lag_ring_serves_version_v_minus_k():
  ring = train_lib.LagRing(2, {"w": np.zeros(2)})
  for v in range(1, 6):
    assert ring.get(v)[0] == max(v - 2, 0)
    ring.push(v, {"w": np.full(2, float(v))})
    ring.push(v, {"w": np.full(2, -1.0)})  # same version again: ignored
  version, params = ring.get(6)
  assert version == 4 and params["w"].tolist() == [4.0, 4.0]
  assert ring.versions == [3, 4, 5] and len(ring.params) == 3


def test_next_tasks_repeats_prompts_in_groups():
  c = testing.tiny_config("grpo")
  c.batch_size, c.group_size = 8, 4
  it = iter([{"id": f"t{i}"} for i in range(10)])
  tasks, groups = train_lib.next_tasks(it, c)
  assert [t["id"] for t in tasks] == ["t0"] * 4 + ["t1"] * 4
  assert groups == ["t0#0"] * 4 + ["t1#1"] * 4


def test_append_lines_and_summary(tmp_path):
  path = str(tmp_path / "log.txt")
  train_lib.append_lines(path, ["a", "b"])
  train_lib.append_lines(path, ["c"])
  assert (tmp_path / "log.txt").read_text() == "a\nb\nc\n"
  s = dict(
    algo="sao", steps=40, policy_version=35, workdir="runs/x", eval_sft=0.03, eval_final=0.98
  )
  assert train_lib.format_summary(s).splitlines()[1:] == [
    "  eval pass@1 after SFT: 0.030",
    "  eval pass@1 after RL:  0.980",
  ]
