"""The training entry point: `python -m sao_jax.train --config=experiments/X.py[:args] --workdir=DIR`.

Reads top to bottom (style.md rule 4): parse and validate the config, create the workdir and write
the resolved `config.json`, start the metric writer, then train.
"""

from __future__ import annotations

import os
import sys

from absl import flags, logging
from ml_collections import config_flags

from sao_jax import cli, metrics
from sao_jax import config as config_lib

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment file and args, e.g. experiments/quickstart.py:cpu", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory (checkpoints, metrics, config.json)."
)


def main(argv):
  del argv
  if _CONFIG.value is None:
    raise config_lib.ConfigError("spec", "pass --config=experiments/<name>.py[:args]")
  config = config_lib.validate(_CONFIG.value)
  workdir = _WORKDIR.value or os.path.join("runs", "default")
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config_lib.to_json(config))
  logging.info("workdir %s, algo %s, mode %s", workdir, config.algo, config.mode)
  with metrics.MetricWriter(workdir):
    print(
      "error: the training loop is not implemented yet (learner issue); config validated and "
      f"written to {workdir}/config.json",
      file=sys.stderr,
    )
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
