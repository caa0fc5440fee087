"""REPORT.md from synthetic runs: table numbers, collapse detection, claim verdicts, figures."""

import json
import os

import numpy as np

from sao_jax import report


def _write_run(out, name, rewards, evals, final, switches=None):
  d = os.path.join(out, "runs", name)
  os.makedirs(d)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for step, r in enumerate(rewards):
      row = {
        "step": step,
        "reward/mean": r,
        "critic/explained_variance": 0.1,
        "policy/dis_masked_below": 0.01,
        "policy/dis_masked_above": 0.02,
      }
      if step + 1 in evals:
        row["eval/pass_at_1"] = evals[step + 1]
      f.write(json.dumps(row) + "\n")
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({"steps": len(rewards), "eval_final": final}, f)
  if switches:
    with open(os.path.join(d, "config.json"), "w") as f:
      json.dump({"env": {"style_switch_steps": switches}}, f)


def test_collapse_step():
  assert report.collapse_step([(10, 0.5), (20, 0.8), (30, 0.3)]) == 30
  assert report.collapse_step([(10, 0.1), (20, 0.04)]) is None  # never good enough to collapse
  assert report.collapse_step([(10, 0.6), (20, 0.5)]) is None


def test_report_tables_and_claims(tmp_path):
  out = str(tmp_path)
  finals = {
    ("sao", 0): [0.9, 0.92],
    ("sao", 4): [0.9, 0.88],
    ("grpo", 0): [0.9, 0.9],
    ("grpo", 4): [0.3, 0.2],
    ("grpo_dis", 0): [0.8, 0.8],
    ("grpo_dis", 4): [0.7, 0.75],
  }
  for (algo, lag), values in finals.items():
    for seed, v in enumerate(values):
      evals = {10: 0.9, 20: v} if algo == "grpo" and lag == 4 else {10: v}
      _write_run(out, f"claims_{algo}_k{lag}_s{seed}", np.linspace(0, v, 20), evals, v)
  for seed in range(2):
    _write_run(out, f"sft_quickstart_s{seed}", [0.0], {}, 0.05)
    _write_run(out, f"style_sao_s{seed}", [0.5] * 10 + [0.6] * 10, {}, 0.6, switches=[5, 10])
    _write_run(out, f"style_running_mean_s{seed}", [0.2] * 20, {}, 0.2, switches=[5, 10])
  path = report.write_report(
    out,
    algos=["sao", "grpo", "grpo_dis"],
    lags=[0, 4],
    seeds=[0, 1],
    style_algos=["sao", "running_mean"],
    wall_s=120,
  )
  with open(path) as f:
    text = f.read()
  assert "| sao | 0.910 ± 0.010 | 0.890 ± 0.010 | none |" in text
  assert "| grpo | 0.900 ± 0.000 | 0.250 ± 0.050 | 20 (k=4, s0), 20 (k=4, s1) |" in text
  assert "| SFT (start of every run) | 0.050 ± 0.000 | 0.050 ± 0.000 | – |" in text
  assert "The 18 runs took" in text  # 12 claims, 2 SFT, 4 style
  assert "| grpo | 0.900 | 0.900 | 0.300 | 0.200 |" in text  # per seed: k=0 s0, s1, k=4 s0, s1
  assert "GRPO without DIS degrades under lag while SAO stays stable** — holds" in text
  assert "SAO ≥ GRPO+DIS at an equal number of samples** — holds" in text
  assert "`sao_no_faster_value` costs score** — not measured" in text
  assert "adapts faster than the running mean** — holds" in text
  for name in ("reward_mean.png", "dis_masked.png", "style_reward.png"):
    assert os.path.getsize(os.path.join(out, "figures", name)) > 1000
