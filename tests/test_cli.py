"""Tests for sao_jax.cli: override checking, one-line config errors, and that every module imports
into one process (flag definitions must not collide)."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

import sao_jax
from sao_jax import cli, config


def test_every_module_imports_together():
  # absl flags live in one global registry: two modules defining --config at import time collide
  # with DuplicateFlagError, which broke test collection once (sao_jax.actor next to sao_jax.train).
  names = [m.name for m in pkgutil.walk_packages(sao_jax.__path__, "sao_jax.")]
  assert "sao_jax.actor" in names and "sao_jax.train" in names
  for name in sorted(names):
    importlib.import_module(name)


def test_check_overrides_accepts_real_fields():
  cli.check_overrides(
    ["prog", "--config=experiments/quickstart.py", "--config.optim.policy.lr=1e-4"]
  )
  cli.check_overrides(["prog", "--config", "experiments/quickstart.py", "--config.algo=grpo"])
  cli.check_overrides(["prog", "--config.algo=grpo"])  # no spec: nothing to check against


def test_check_overrides_suggests_closest_field():
  with pytest.raises(config.ConfigError, match=r"did you mean config\.optim\.policy\.lr"):
    cli.check_overrides(
      ["prog", "--config=experiments/quickstart.py", "--config.optim.policy.lrr=1"]
    )


@pytest.mark.parametrize("module", ["sao_jax.train", "sao_jax.actor"])
def test_bad_override_exits_2_with_one_line(module):
  p = subprocess.run(
    [sys.executable, "-m", module, "--config=experiments/quickstart.py", "--config.nope=1"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert p.returncode == 2
  lines = p.stderr.strip().splitlines()
  assert lines[-1].startswith("error: ") and "nope" in lines[-1]
  assert "Traceback" not in p.stderr
