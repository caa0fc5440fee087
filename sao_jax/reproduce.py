"""`make reproduce`: the paper's claims at CPU scale, written up in `results/REPORT.md`.

  python -m sao_jax.reproduce --out=results [--seeds=0,1,2] [--lags=0,4,16] [--steps=40]
      [--skip_claims | --skip_style]  # the studies are independent: run them as two processes

Two studies, each run in lag mode (deterministic: a rerun gives the same numbers on this machine):

1. Claims study on the quickstart task (math with a Python tool, tiny model). One SFT checkpoint per
   seed (exported, then shared by every algorithm of that seed), then RL for SAO, SAO DIS-only,
   GRPO, GRPO+DIS, the running-mean baseline and the two SAO ablations, under policy lag
   k in `--lags`, with equal samples per step (16 single rollouts, or 2 prompts x 8 for GRPO).
2. Online-style study (`experiments/online_style.py:cpu`): the preferred style switches twice; SAO
   (critic baseline) vs the running mean (window 128).

Every run lives in `OUT/runs/<name>/` and is skipped when its summary exists, so an interrupted
reproduction continues where it stopped. The report is rebuilt from the runs' metrics.jsonl files
(`--report_only` rebuilds it without training).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from absl import app, flags, logging

from sao_jax import config as config_lib
from sao_jax import report, train, train_lib

CLAIM_ALGOS = (
  "sao",
  "sao_dis_only",
  "grpo",
  "grpo_dis",
  "running_mean",
  "sao_no_faster_value",
  "sao_no_frozen_attention",
)
STYLE_ALGOS = ("sao", "running_mean")

_OUT = flags.DEFINE_string("out", "results", "Output directory (runs/, figures/, REPORT.md).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds.")
_LAGS = flags.DEFINE_list("lags", ["0", "4", "16"], "Policy lags k of the claims study.")
_ALGOS = flags.DEFINE_list("algos", list(CLAIM_ALGOS), "Algorithms of the claims study.")
_STEPS = flags.DEFINE_integer("steps", 40, "RL steps per claims run.")
_STYLE_STEPS = flags.DEFINE_integer("style_steps", 90, "RL steps per online-style run.")
_SKIP_STYLE = flags.DEFINE_bool("skip_style", False, "Skip the online-style study.")
_SKIP_CLAIMS = flags.DEFINE_bool(
  "skip_claims", False, "Skip the claims study (e.g. to run the two studies in two processes)."
)
_SFT_STEPS = flags.DEFINE_integer(
  "sft_steps", None, "Override the experiments' SFT steps (smoke tests)."
)
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Rebuild REPORT.md from existing runs.")


def _repo() -> str:
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(name: str, config: config_lib.ConfigDict, out: str) -> dict[str, Any]:
  """Trains `config` in OUT/runs/<name> unless its summary.json exists; returns the summary."""
  workdir = os.path.join(out, "runs", name)
  path = os.path.join(workdir, "summary.json")
  if os.path.exists(path):
    with open(path) as f:
      return json.load(f)
  config_lib.validate(config)
  t0 = time.time()
  summary = train.train(config, workdir, progress=False)
  summary["wall_s"] = time.time() - t0
  with open(path, "w") as f:
    json.dump(summary, f, indent=1, default=float)
  logging.info("%s: eval %.3f in %.0f s", name, summary["eval_final"], summary["wall_s"])
  return summary


def sft_checkpoint(experiment: str, args: str, seed: int, out: str) -> str:
  """SFT once per (experiment, seed); returns the exported HF directory every RL run starts from."""
  config = config_lib.load(os.path.join(_repo(), "experiments", f"{experiment}.py:{args}"))
  config.seed, config.total_steps = seed, 0
  if _SFT_STEPS.value is not None:
    config.sft.steps = _SFT_STEPS.value
  run_once(f"sft_{experiment}_s{seed}", config, out)
  return os.path.join(out, "runs", f"sft_{experiment}_s{seed}", "sft_model")


def rl_config(
  experiment: str, args: str, *, sft_dir: str, seed: int, lag: int, steps: int
) -> config_lib.ConfigDict:
  """An RL run from a shared SFT checkpoint, in lag mode (k = 0 is plain sync)."""
  c = config_lib.load(os.path.join(_repo(), "experiments", f"{experiment}.py:{args}"))
  c.seed, c.total_steps = seed, steps
  c.mode, c.policy_lag = "lag", lag
  c.replay.max_policy_lag = max(c.replay.max_policy_lag, lag)
  c.model.path, c.sft.steps = sft_dir, 0
  c.checkpoint_every = 0
  return c


def claims_study(
  out: str, seeds: Sequence[int], lags: Sequence[int], algos: Sequence[str], steps: int
):
  for seed in seeds:
    sft_dir = sft_checkpoint("quickstart", "", seed, out)
    for lag in lags:
      for algo in algos:
        c = rl_config(
          "quickstart", f"algo={algo}", sft_dir=sft_dir, seed=seed, lag=lag, steps=steps
        )
        run_once(f"claims_{algo}_k{lag}_s{seed}", c, out)


def style_study(out: str, seeds: Sequence[int], steps: int):
  for seed in seeds:
    sft_dir = sft_checkpoint("online_style", "cpu", seed, out)
    for algo in STYLE_ALGOS:
      c = rl_config(
        "online_style", f"cpu,algo={algo}", sft_dir=sft_dir, seed=seed, lag=0, steps=steps
      )
      run_once(f"style_{algo}_s{seed}", c, out)


def main(argv):
  del argv
  train_lib.quiet_library_logs()
  out = _OUT.value
  seeds, lags = [int(s) for s in _SEEDS.value], [int(k) for k in _LAGS.value]
  t0 = time.time()
  if not _REPORT_ONLY.value:
    if not _SKIP_CLAIMS.value:
      claims_study(out, seeds, lags, _ALGOS.value, _STEPS.value)
    if not _SKIP_STYLE.value:
      style_study(out, seeds, _STYLE_STEPS.value)
  path = report.write_report(
    out,
    algos=_ALGOS.value,
    lags=lags,
    seeds=seeds,
    style_algos=STYLE_ALGOS,
    wall_s=time.time() - t0,
  )
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
