"""Two processes x 4 fake CPU devices (jax.distributed, one global mesh) give the same learner step
as one process with 8 devices."""

import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run(n: int, tmp_path) -> list[dict]:
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  outs = [tmp_path / f"n{n}_p{i}.json" for i in range(n)]
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        os.path.join(HERE, "multihost_step.py"),
        str(i),
        str(n),
        str(port),
        str(outs[i]),
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(n)
  ]
  logs = [p.communicate(timeout=600)[0] for p in procs]
  for p, log in zip(procs, logs, strict=True):
    assert p.returncode == 0, log[-3000:]
  return [json.loads(o.read_text()) for o in outs]


@pytest.mark.timeout(900)
def test_two_processes_match_one(tmp_path):
  (single,) = _run(1, tmp_path)
  multi = _run(2, tmp_path)
  assert single["num_devices"] == 8 and single["num_processes"] == 1
  for r in multi:
    assert r["num_devices"] == 8 and r["num_processes"] == 2
    for k in ("policy_loss", "value_loss", "param_abs_sum"):
      assert r[k] == pytest.approx(single[k], rel=1e-5, abs=1e-7), k
