"""Async mode end to end: in-process rollout workers, and the at-scale topology on localhost
(learner with its ReplayService, a `sao_jax.serve` engine, two `sao_jax.actor` processes)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sao_jax import config as config_lib
from sao_jax import testing, train

ROOT = testing.REPO
ENV = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # subprocesses: one CPU device


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if "policy/loss" in line]


def _consumed(workdir):
  with open(os.path.join(workdir, "consumed.txt")) as f:
    return f.read().split()


def test_async_trains_resumes_and_consumes_each_trajectory_once(tmp_path):
  kw = {"mode": "async", "replay.log_consumed": True, "checkpoint_every": 2}
  c = config_lib.validate(testing.tiny_config("sao", total_steps=3, **kw))
  train.train(c, str(tmp_path), progress=False)
  c = config_lib.validate(testing.tiny_config("sao", total_steps=5, **kw))
  s = train.train(c, str(tmp_path), progress=False)
  assert s["steps"] == 5
  rows = _rows(tmp_path)
  assert [r["step"] for r in rows] == list(range(5))
  uids = _consumed(tmp_path)
  assert len(uids) == 5 * c.batch_size == len(set(uids))
  for r in rows:
    assert r["async/lag_mean"] <= c.replay.max_policy_lag
    assert 0 <= r["async/learner_idle_fraction"] <= 1


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _wait(predicate, timeout, what, proc=None, log=None):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert proc is None or proc.poll() is None, (
      f"{what}: the process died\n{log.read_text()[-3000:]}"
    )
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.5)


@pytest.mark.timeout(1200)
def test_learner_serve_and_actors_on_localhost(tmp_path):
  """One actor is killed mid-run and training continues; the learner restarts from its checkpoint
  with the queued trajectories restored, the surviving actor reconnects, and no trajectory is
  consumed twice."""
  token, replay_port, work = "s3cret", _free_port(), tmp_path / "run"
  serve = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "sao_jax.serve",
      "--model=preset:tiny",
      "--tokenizer=byte",
      "--port=0",
      "--max-len=256",
      "--num-slots=16",
    ],
    stdout=subprocess.PIPE,
    text=True,
    env=ENV,
    cwd=ROOT,
  )
  procs = [serve]
  try:
    url = f"http://127.0.0.1:{int(serve.stdout.readline())}"
    overrides = [
      "--config.mode=async",
      "--config.rollout.engine=http",
      f"--config.rollout.urls={url}",
      "--config.rollout.num_workers=0",
      f"--config.replay.serve_address=127.0.0.1:{replay_port}",
      f"--config.replay.auth_token={token}",
      "--config.replay.log_consumed=True",
      "--config.sft.steps=0",
      "--config.batch_size=4",
      "--config.data.num_eval=4",
      "--config.checkpoint_every=2",
      "--config.loss.critic_only_steps=1",
      "--config.rollout.max_new_tokens=12",
      "--config.eval_every=0",
    ]

    def learner(steps):
      log = open(tmp_path / f"learner{steps}.log", "w")  # noqa: SIM115 (closed with the process)
      return subprocess.Popen(
        [
          sys.executable,
          "-m",
          "sao_jax.train",
          f"--config=experiments/quickstart.py:steps={steps}",
          f"--workdir={work}",
          *overrides,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=ENV,
        cwd=ROOT,
      )

    def actor(name):
      log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
      return subprocess.Popen(
        [
          sys.executable,
          "-m",
          "sao_jax.actor",
          f"--replay=127.0.0.1:{replay_port}",
          f"--engine={url}",
          "--config=experiments/quickstart.py",
          f"--auth-token={token}",
          f"--actor-id={name}",
          "--config.rollout.max_new_tokens=12",
          "--config.rollout.concurrency=4",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        env=ENV,
        cwd=ROOT,
        text=True,
      )

    first = learner(6)
    a, b = actor("a"), actor("b")
    procs += [first, a, b]
    _wait(
      lambda: os.path.exists(work / "metrics.jsonl") and len(_rows(work)) >= 2,
      600,
      "two learner steps",
      first,
      tmp_path / "learner6.log",
    )
    b.send_signal(signal.SIGKILL)  # an actor dies: only its in-flight episodes are lost
    assert first.wait(timeout=600) == 0, (tmp_path / "learner6.log").read_text()[-3000:]
    second = learner(9)  # the learner restarts from its checkpoint; actor a reconnects
    procs.append(second)
    assert second.wait(timeout=600) == 0, (tmp_path / "learner9.log").read_text()[-3000:]
    assert "resumed from step 6" in (tmp_path / "learner9.log").read_text()
    a.send_signal(signal.SIGTERM)
    counters = json.loads(a.communicate(timeout=60)[0].strip().splitlines()[-1])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert [r["step"] for r in _rows(work)] == list(range(9))
  uids = _consumed(work)
  assert len(uids) == 9 * 4 == len(set(uids))
  assert counters["accepted"] > 0
