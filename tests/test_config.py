"""Config parsing, algorithm defaults, validation errors, and the CLI's one-line failures."""

import json
import subprocess
import sys
import time

import pytest

from sao_jax import algos
from sao_jax import config as config_lib

REPO = __file__.rsplit("/tests/", 1)[0]


def test_parse_arg_types_and_unknown_keys():
  a = config_lib.parse_arg("cpu,algo=grpo,seed=3,lr=0.5", cpu=False, algo="sao", seed=0, lr=1.0)
  assert (a.cpu, a.algo, a.seed, a.lr) == (True, "grpo", 3, 0.5)
  with pytest.raises(config_lib.ConfigError, match=r"arg\.sede"):
    config_lib.parse_arg("sede=3", seed=0)
  with pytest.raises(config_lib.ConfigError, match="integer"):
    config_lib.parse_arg("seed=x", seed=0)


@pytest.mark.parametrize("name", sorted(algos.ALGOS))
def test_every_algo_validates_with_its_defaults(name):
  c = config_lib.apply_algo(config_lib.base_config(), name)
  c.batch_size = 16
  config_lib.validate(c, num_devices=8)
  for key, value in algos.ALGOS[name].defaults.items():
    section, _, field = key.rpartition(".")
    assert (c[section] if section else c)[field] == value


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("loss.eps_low", 1.2, "loss.eps_low"),
    ("loss.eps_low", 0.0, "loss.eps_low"),
    ("algo", "reinforce", "config.algo: unknown"),
    ("mode", "fast", "config.mode"),
    ("batch_size", 12, "config.batch_size: 12 is not divisible by the mesh"),
    ("rollout.temperature", 0.0, "rollout.temperature"),
    ("model.dtype", "float16", "model.dtype"),
    ("env.style_sentences", 5, "env.style_sentences"),
    ("rollout.decode_windows", "64,x", "rollout.decode_windows"),
    ("rollout.decode_windows", "100000", "rollout.decode_windows"),
  ],
)
def test_validate_names_the_bad_field(field, value, match):
  c = config_lib.base_config()
  section, _, f = field.rpartition(".")
  (c[section] if section else c)[f] = value
  with pytest.raises(config_lib.ConfigError, match=match):
    config_lib.validate(c, num_devices=8)


def test_grpo_with_group_of_one_is_an_error():
  c = config_lib.apply_algo(config_lib.base_config(), "grpo")
  c.group_size = 1
  with pytest.raises(config_lib.ConfigError, match="config.group_size: grpo needs group_size >= 2"):
    config_lib.validate(c, num_devices=1)


@pytest.mark.parametrize("algo", ["grpo", "grpo_dis", "rloo"])
def test_group_algorithms_are_refused_in_async_mode(algo):
  # Async workers push single trajectories (each its own group): GRPO would train on zeros.
  c = config_lib.apply_algo(config_lib.base_config(), algo)
  c.mode = "async"
  with pytest.raises(config_lib.ConfigError, match=f"config.mode: {algo} needs whole groups"):
    config_lib.validate(c, num_devices=1)
  c.mode = "sync"
  config_lib.validate(c, num_devices=1)


def test_mesh_shape_resolves_free_axis():
  c = config_lib.base_config()
  c.mesh.fsdp = 2
  assert config_lib.mesh_shape(c, 8) == {"data": 4, "fsdp": 2, "tensor": 1, "expert": 1}
  c.mesh.tensor = 3
  with pytest.raises(config_lib.ConfigError, match="mesh.data"):
    config_lib.mesh_shape(c, 8)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 1, 1
  assert config_lib.mesh_size(c, 8) == 1
  c.mesh.data = 16
  with pytest.raises(config_lib.ConfigError, match="need 16 devices, only 8"):
    config_lib.mesh_size(c, 8)


def test_load_spec_with_args():
  c = config_lib.load(f"{REPO}/experiments/quickstart.py:algo=grpo,steps=3")
  assert (c.algo, c.total_steps, c.group_size) == ("grpo", 3, 8)
  with pytest.raises(config_lib.ConfigError, match="no experiment file"):
    config_lib.load("experiments/nope.py")


def _train(*args, tmp_path):
  return subprocess.run(
    [sys.executable, "-m", "sao_jax.train", *args, f"--workdir={tmp_path}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=120,
  )


def test_cli_rejects_misspelled_override_in_one_line(tmp_path):
  r = _train("--config=experiments/quickstart.py", "--config.not_a_field=1", tmp_path=tmp_path)
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == ["error: config.not_a_field: no such field"]
  r = _train("--config=experiments/quickstart.py", "--config.loss.eps_lo=0.2", tmp_path=tmp_path)
  assert r.stderr.strip() == (
    "error: config.loss.eps_lo: no such field; did you mean config.loss.eps_low?"
  )


def test_cli_rejects_invalid_value_in_one_line(tmp_path):
  r = _train("--config=experiments/quickstart.py", "--config.loss.eps_low=1.5", tmp_path=tmp_path)
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == ["error: config.loss.eps_low: must be in (0, 1), got 1.5"]


def test_config_json_is_written_before_training(tmp_path):
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "sao_jax.train",
      "--config=experiments/quickstart.py:steps=0",
      f"--workdir={tmp_path}",
    ],
    cwd=REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.time() + 120
    while not (tmp_path / "config.json").exists() and time.time() < deadline:
      time.sleep(0.2)
    time.sleep(0.2)
    saved = json.loads((tmp_path / "config.json").read_text())
  finally:
    proc.kill()
    proc.wait()
  assert saved["algo"] == "sao" and saved["total_steps"] == 0
  assert saved["loss"]["eps_low"] == 0.3 and saved["mesh"]["rules"][0] == [
    "batch",
    ["data", "fsdp"],
  ]


def test_int_list():
  assert config_lib.int_list("128, 512") == (128, 512) == config_lib.int_list("128 512")
  assert config_lib.int_list("") == ()
  with pytest.raises(ValueError):
    config_lib.int_list("64,x")
