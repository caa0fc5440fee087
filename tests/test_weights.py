"""Weight publishing: versioned directories written atomically and cleaned up, interrupted writes
leave nothing behind, exported weights reload exactly; `/update_weights_from_disk` against
`python -m sao_jax.serve` on localhost makes the next generations carry the new version and match
the embedded engine given the same weights through InProcessPublisher."""

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from sao_jax import config as config_lib
from sao_jax import models
from sao_jax.rollout import Engine, GenerateRequest, HttpEngine
from sao_jax.rollout.weights import HttpPublisher, InProcessPublisher, make_publisher

ROOT = pathlib.Path(__file__).resolve().parents[1]
CFG = models.get_preset("tiny")
MAX_LEN = 64
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}


class RecordingEngine:
  """Records update calls; checks the version is complete on disk (under `root`) when called."""

  def __init__(self, root):
    self.root, self.calls = root, []

  def update_weights_from_disk(self, path, version):
    local = os.path.join(self.root, os.path.basename(path))
    assert sorted(os.listdir(local)) == ["config.json", "model.safetensors"]
    self.calls.append((path, version))


@pytest.fixture(scope="module")
def policies():
  return models.Policy(CFG, rngs=nnx.Rngs(0)), models.Policy(CFG, rngs=nnx.Rngs(1))


def _params(policy):
  graphdef, state = nnx.split(policy, nnx.Param)
  return graphdef, state


def test_versions_are_atomic_dirs_kept_newest_k_and_reload_exactly(tmp_path, policies):
  graphdef, state = _params(policies[1])
  engine = RecordingEngine(str(tmp_path))
  pub = HttpPublisher(str(tmp_path), engine, graphdef=graphdef, keep=2, engine_dir="/mnt/w")
  (tmp_path / "v9.tmp").mkdir()  # a write interrupted by a crash of an earlier run
  for v in (1, 2, 3, 4):
    assert pub.publish(state, v) > 0
  assert sorted(os.listdir(tmp_path)) == ["v3", "v4"]
  assert sorted(os.listdir(tmp_path / "v4")) == ["config.json", "model.safetensors"]
  # Engines are told the path as they mount it, in version order.
  assert engine.calls == [(f"/mnt/w/v{v}", v) for v in (1, 2, 3, 4)]
  st = pub.stats()
  assert (st["count"], st["version"]) == (4, 4)
  assert st["last_write_s"] > 0 and st["last_load_s"] >= 0
  assert st["max_s"] >= st["mean_s"] > 0 and st["last_s"] >= st["last_write_s"]
  reloaded = nnx.state(models.from_pretrained(str(tmp_path / "v4")), nnx.Param)
  assert jax.tree.structure(reloaded) == jax.tree.structure(state)
  for a, b in zip(jax.tree.leaves(reloaded), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Republishing a version replaces its directory; a Policy module is accepted as is.
  pub.publish(policies[0], 4)
  assert sorted(os.listdir(tmp_path)) == ["v3", "v4"]


def test_an_interrupted_write_leaves_no_version_behind(tmp_path, policies, monkeypatch):
  graphdef, state = _params(policies[0])
  engine = RecordingEngine(str(tmp_path))
  pub = HttpPublisher(str(tmp_path), engine, graphdef=graphdef, keep=3)
  pub.publish(state, 1)

  def dies_half_way(policy, path, dtype=None):
    os.makedirs(path, exist_ok=True)
    pathlib.Path(path, "model.safetensors").write_bytes(b"partial")
    raise OSError("disk full")

  monkeypatch.setattr(models, "export_hf", dies_half_way)
  with pytest.raises(OSError, match="disk full"):
    pub.publish(state, 2)
  assert sorted(os.listdir(tmp_path)) == ["v1"] and engine.calls == [(str(tmp_path / "v1"), 1)]
  assert pub.version == 1 and pub.count == 1
  with pytest.raises(ValueError, match="graphdef"):
    HttpPublisher(str(tmp_path), engine).publish(state, 3)
  with pytest.raises(ValueError, match="keep"):
    HttpPublisher(str(tmp_path), engine, keep=0)


def test_make_publisher_follows_the_rollout_engine(tmp_path):
  c = config_lib.base_config()
  engine = RecordingEngine(str(tmp_path))
  assert isinstance(make_publisher(c, engine), InProcessPublisher)
  c.rollout.engine, c.rollout.urls = "http", "http://127.0.0.1:1"
  with pytest.raises(ValueError, match="directory"):
    make_publisher(c, engine)
  pub = make_publisher(c, engine, directory=str(tmp_path / "w"))
  assert isinstance(pub, HttpPublisher) and (pub.keep, pub.engine_dir) == (2, str(tmp_path / "w"))


def test_http_publish_reaches_python_m_serve_and_matches_the_embedded_engine(tmp_path, policies):
  proc = subprocess.Popen(
    [sys.executable, "-m", "sao_jax.serve", "--model=preset:tiny", "--tokenizer=byte", "--port=0",
     f"--max-len={MAX_LEN}", "--num-slots=2", "--seed=0"],
    stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
  )  # fmt: skip
  old, new = policies
  graphdef, new_state = _params(new)
  local = Engine(old, num_slots=2, max_len=MAX_LEN, seed=0)
  try:
    url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
    client = HttpEngine(url, timeout_s=300)
    req = GenerateRequest([10, 20, 30, 40], max_new_tokens=8, temperature=0)
    before = client.generate([req])[0]
    assert before.versions == [0] * 8
    assert local.generate([req])[0].output_ids == before.output_ids  # same random tiny model

    pub = HttpPublisher(str(tmp_path / "weights"), url, graphdef=graphdef, keep=1)
    pub.publish(new_state, 3)
    after = client.generate([req])[0]
    assert after.versions == [3] * 8  # the next generation carries the new version
    assert after.output_ids != before.output_ids
    assert os.listdir(tmp_path / "weights") == ["v3"]

    InProcessPublisher(local).publish(new_state, 3)
    embedded = local.generate([req])[0]
    assert embedded.versions == [3] * 8 and embedded.output_ids == after.output_ids
    np.testing.assert_allclose(embedded.logprobs, after.logprobs, rtol=1e-5, atol=1e-6)
    pub.close()
    client.close()
  finally:
    local.close()
    proc.terminate()
    proc.wait(timeout=30)
