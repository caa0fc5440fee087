"""MetricWriter writes jsonl and tensorboard events that read back exactly; timers add up."""

import math
import time

import numpy as np

from sao_jax import metrics


def test_write_and_read_back(tmp_path):
  with metrics.MetricWriter(str(tmp_path)) as w:
    for step in range(3):
      w.write(step, {"reward": 0.5 * step, "loss": np.float32(1.25), "nan": float("nan")})
    w.write_histograms(2, {"policy_lag": np.array([0, 1, 1, 3])})
    w.write_text("sample", "hello", 2)

  rows = metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert [r["reward"] for r in rows] == [0.0, 0.5, 1.0]
  assert all(r["loss"] == 1.25 for r in rows)
  assert all(math.isnan(r["nan"]) for r in rows)

  tb = metrics.read_tensorboard_scalars(str(tmp_path / "tb"))
  assert tb["reward"] == [(0, 0.0), (1, 0.5), (2, 1.0)]
  assert [s for s, _ in tb["loss"]] == [0, 1, 2]


def test_jsonl_appends_across_writers(tmp_path):
  with metrics.MetricWriter(str(tmp_path), tensorboard=False) as w:
    w.write(0, {"a": 1})
  with metrics.MetricWriter(str(tmp_path), tensorboard=False) as w:
    w.write(1, {"a": 2})
  assert [r["a"] for r in metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))] == [1.0, 2.0]


def test_timers_accumulate_and_reset():
  t = metrics.Timers()
  with t.measure("a"):
    time.sleep(0.02)
  with t.measure("a"):
    time.sleep(0.02)
  t.add("b", 1.5)
  s = t.summary()
  assert 0.035 < s["time/a"] < 0.5
  assert s["time/b"] == 1.5
  assert s["time/wall"] >= s["time/a"]
  assert "time/a" not in t.summary()


def test_progress_bar_is_silent_off_terminal(capsys):
  with metrics.ProgressBar(10, enabled=False) as bar:
    bar.update(1, reward=0.5)
  out = capsys.readouterr()
  assert out.out == "" and out.err == ""
