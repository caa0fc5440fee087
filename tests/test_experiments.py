"""Every experiment file loads, validates, documents its command, and has a laptop variant."""

import glob
import os

import pytest

from sao_jax import algos
from sao_jax import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = sorted(glob.glob(os.path.join(REPO, "experiments", "*.py")))
CPU_DEFAULT = ("quickstart.py",)  # experiments that are laptop-scale already


def _spec(path, *args):
  name = os.path.basename(path)
  args = [a for a in args if not (a == "cpu" and name in CPU_DEFAULT)]
  return f"{path}:{','.join(args)}" if args else path


def test_there_are_experiments():
  names = {os.path.basename(p) for p in EXPERIMENTS}
  assert {"quickstart.py", "aime.py", "swe_bench.py", "online_style.py", "smollm2_math.py"} <= names


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_experiment_loads_and_validates(path):
  c = config_lib.load(path)
  try:
    config_lib.validate(c, num_devices=8)
  except config_lib.ConfigError as e:  # paper-scale runs need weights and rollout hosts
    assert e.field == "model.path" and ":cpu" in str(e)
    c.model.path = "/ckpt/model"
    c.rollout.urls = "http://sglang-0:30000"
    config_lib.validate(c, num_devices=8)
  with open(path) as f:
    doc = f.read().split('"""')[1]
  assert "make train EXP=" in doc, "the docstring must give the command"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
@pytest.mark.parametrize("algo", sorted(algos.ALGOS))
def test_laptop_variant_accepts_every_algo(path, algo):
  c = config_lib.load(_spec(path, "cpu", f"algo={algo}"))
  assert c.algo == algo
  config_lib.validate(c, num_devices=8)
  assert c.rollout.engine == "embedded" and c.mode in ("sync", "lag")
