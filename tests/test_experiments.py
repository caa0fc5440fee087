"""Every experiment file loads, validates, and documents its command (levanter-style)."""

import glob
import os

import pytest

from sao_jax import algos
from sao_jax import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = sorted(glob.glob(os.path.join(REPO, "experiments", "*.py")))


def test_there_are_experiments():
  assert any(p.endswith("quickstart.py") for p in EXPERIMENTS)


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
def test_experiment_loads_and_validates(path):
  c = config_lib.load(path)
  config_lib.validate(c, num_devices=8)
  with open(path) as f:
    doc = f.read().split('"""')[1]
  assert "make train" in doc or "python -m sao_jax.train" in doc, "docstring must give the command"


@pytest.mark.parametrize("path", EXPERIMENTS, ids=os.path.basename)
@pytest.mark.parametrize("algo", sorted(algos.ALGOS))
def test_experiment_accepts_every_algo(path, algo):
  c = config_lib.load(f"{path}:algo={algo}")
  assert c.algo == algo
  config_lib.validate(c, num_devices=8)
