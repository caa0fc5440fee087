"""`python -m sao_jax.actor` on localhost: `sao_jax.serve` (tiny model) as the engine, a ReplayServer
in this process as the learner's queue. Two actors push; one is killed and the other keeps going;
the learner "restarts" (queue state saved, server down, restored on the same port) and the actor
reconnects with nothing consumed twice; SIGTERM prints counters that match what the learner got.
Also the actor's push adapter (ReplayClientQueue) on its own: retries across a restart, counted
once, cancellable, and backpressure."""

import collections
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from sao_jax.actor import ReplayClientQueue
from sao_jax.replay import CANCELLED, InMemoryQueue, ReplayClient, ReplayServer
from sao_jax.replay.testing import make_trajectory

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKEN, VOCAB, MAX_LEN = "actor-token", 272, 128  # the tiny preset's vocabulary (byte tokenizer)
ENV = {**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}  # one CPU device per subprocess

EXPERIMENT = """
from sao_jax import config as config_lib


def get_config(arg=None):
  c = config_lib.base_config()
  c.max_seq_len = 128
  c.model.preset, c.model.tokenizer = "tiny", "byte"
  c.env.name, c.env.tool_format, c.env.max_turns = "math_tool", "compact", 2
  c.data.num_train = 2000
  c.rollout.max_new_tokens, c.rollout.concurrency = 8, 3
  return c
"""


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _queue(capacity=24):
  return InMemoryQueue(capacity, max_policy_lag=4, vocab_size=VOCAB, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def engine_url():
  """`python -m sao_jax.serve` with the random tiny model, warmed up."""
  proc = subprocess.Popen(
    [sys.executable, "-m", "sao_jax.serve", "--model=preset:tiny", "--tokenizer=byte", "--port=0",
     f"--max-len={MAX_LEN}", "--num-slots=8"],
    stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
  )  # fmt: skip
  try:
    url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
    yield url
  finally:
    proc.terminate()
    proc.wait(timeout=30)


def _actor(tmp_path, engine_url, replay_port, actor_id, token=TOKEN):
  exp = tmp_path / "exp.py"
  exp.write_text(EXPERIMENT)
  log = open(tmp_path / f"{actor_id}.log", "w")  # noqa: SIM115 (closed with the process)
  return subprocess.Popen(
    [sys.executable, "-m", "sao_jax.actor", f"--replay=127.0.0.1:{replay_port}",
     f"--engine={engine_url}", f"--config={exp}", f"--auth-token={token}",
     f"--actor-id={actor_id}", "--log-every=5", "--grace=20"],
    stdout=subprocess.PIPE, stderr=log, text=True, env=ENV, cwd=ROOT,
  )  # fmt: skip


class Learner:
  """Consumes batches in a thread and records who produced each consumed uid."""

  def __init__(self, queue):
    self.queue, self.consumed, self.by_actor = queue, [], collections.Counter()
    self.lock = threading.Lock()  # held from taking a batch to recording it
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self):
    while not self._stop.is_set():
      with self.lock:
        try:
          batch = self.queue.get_batch(2, timeout=0.2)
        except Exception:  # timeout, or the queue closed under us (restart): try again
          batch = []
        self.consumed += [t.uid for t in batch]
        self.by_actor.update(t.metadata["actor"] for t in batch)
      time.sleep(0.01)

  def wait_for(self, actor, n, timeout=240):
    deadline = time.monotonic() + timeout
    while self.by_actor[actor] < n:
      assert time.monotonic() < deadline, f"{actor}: {self.by_actor[actor]} < {n} consumed"
      time.sleep(0.1)

  def stop(self):
    self._stop.set()
    self._thread.join(5)


def test_two_actors_kill_one_restart_the_learner(tmp_path, engine_url):
  port = _free_port()
  queue = _queue()
  server = ReplayServer(queue, auth_token=TOKEN, port=port).__enter__()
  learner = Learner(queue)
  a = _actor(tmp_path, engine_url, port, "a")
  b = _actor(tmp_path, engine_url, port, "b")
  try:
    learner.wait_for("a", 4)
    learner.wait_for("b", 4)
    a.kill()  # mid-run: only its in-flight episodes are lost
    assert a.wait(30) == -signal.SIGKILL
    time.sleep(0.5)  # a push the server had fully received lands now
    with learner.lock:
      a_total = learner.by_actor["a"] + len(_uids_of(queue, "a"))
    b_at_kill = learner.by_actor["b"]
    learner.wait_for("b", b_at_kill + 6)  # the other actor keeps going

    # The learner restarts: it stops consuming (b fills the queue), stops serving, checkpoints its
    # queue, and comes back on the same port with the queue restored.
    learner.stop()
    deadline = time.monotonic() + 60
    while len(queue) < 6 and time.monotonic() < deadline:
      time.sleep(0.05)
    server.stop(grace=0)
    state = queue.state_dict()
    restored_uids = list(state["meta"]["uids"])
    consumed_before = list(learner.consumed)
    queue.close()
    time.sleep(1.5)  # actor b's pushes fail meanwhile
    queue = _queue()
    queue.load_state_dict(state)
    server = ReplayServer(queue, auth_token=TOKEN, port=port).__enter__()
    learner2 = Learner(queue)
    learner2.wait_for("b", 8)  # b reconnected and delivers again

    b.send_signal(signal.SIGTERM)
    out, _ = b.communicate(timeout=60)
    assert b.returncode == 0, (tmp_path / "b.log").read_text()[-2000:]
    learner2.stop()
  finally:
    for p in (a, b):
      if p.poll() is None:
        p.kill()
    server.stop(grace=0)

  summary = json.loads(out.strip().splitlines()[-1])
  remaining = _peek(queue)
  consumed_after = learner2.consumed
  # Restored trajectories were consumed after the restart, and nothing was consumed twice.
  assert len(restored_uids) >= 6
  assert set(restored_uids) <= set(consumed_after) | {t.uid for t in remaining}
  all_consumed = consumed_before + consumed_after
  assert len(all_consumed) == len(set(all_consumed))
  # Nothing of the killed actor arrived after its death, and nothing it delivered was lost.
  assert learner.by_actor["a"] + learner2.by_actor["a"] + len(_uids_of(queue, "a")) == a_total
  # b's own count of accepted trajectories equals what the learner received from it.
  b_received = learner.by_actor["b"] + learner2.by_actor["b"] + len(_uids_of(queue, "b"))
  assert summary["accepted"] == b_received
  assert summary["actor"] == "b" and summary["failed"] == 0 and summary["in_flight"] == 0
  assert summary["push"]["unavailable"] >= 1  # it did see the learner down, and retried
  assert summary["episodes_started"] == summary["accepted"] + sum(summary["dropped"].values())


def _peek(queue):
  """The trajectories queued now (from the checkpoint view; nothing is consumed)."""
  state = queue.state_dict()
  return [type("T", (), {"uid": u, "metadata": m}) for u, m in
          zip(state["meta"]["uids"], state["meta"]["metadata"], strict=True)]  # fmt: skip


def _uids_of(queue, actor):
  return {t.uid for t in _peek(queue) if t.metadata["actor"] == actor}


def test_actor_with_a_wrong_token_exits_1_with_the_reason(tmp_path, engine_url):
  port = _free_port()
  with ReplayServer(_queue(), auth_token=TOKEN, port=port) as server:
    proc = _actor(tmp_path, engine_url, port, "intruder", token="wrong")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert server.servicer.unauthenticated >= 1 and server.queue.stats()["accepted"] == 0
  log = (tmp_path / "intruder.log").read_text()
  assert "rollout worker 0 failed: ReplayAuthError" in log
  assert json.loads(out.strip().splitlines()[-1])["failed"] == 1


# ---------------------------------------------------------------- the push adapter on its own


def _traj(uid):
  return make_trajectory(uid, length=24, vocab_size=VOCAB, version=0)


def test_client_queue_retries_across_a_restart_and_counts_once():
  port = _free_port()
  queue = _queue()
  server = ReplayServer(queue, auth_token=TOKEN, port=port).__enter__()
  client = ReplayClient(f"127.0.0.1:{port}", auth_token=TOKEN, max_retries=0)
  sink = ReplayClientQueue(client, poll_s=1.0, backoff_s=0.05, max_backoff_s=0.2)
  assert sink.put(_traj("x")) == (True, None) and sink.version == 0
  assert sink.put(_traj("x")) == (False, "duplicate")  # a genuine duplicate stays one
  server.stop(grace=0)

  result = {}
  t = threading.Thread(target=lambda: result.update(r=sink.put(_traj("y"))))
  t.start()
  time.sleep(0.8)  # attempts fail while the learner is down
  assert t.is_alive() and sink.counters["unavailable"] >= 1
  server = ReplayServer(queue, auth_token=TOKEN, port=port).__enter__()
  t.join(10)
  assert result["r"] == (True, None)
  # An attempt whose delivery is uncertain, answered "duplicate", is our own delivery.
  assert sink._outcome(_Result(0, [(0, "z", "duplicate")]), maybe_delivered=True) == (True, None)
  assert sink.counters["resent"] == 1
  server.stop(grace=0)
  assert queue.stats()["accepted"] == 2 and sorted(t.uid for t in queue.get_batch(2)) == ["x", "y"]
  stop = threading.Event()
  threading.Timer(0.3, stop.set).start()
  assert sink.put(_traj("w"), cancel=stop.is_set) == (False, CANCELLED)  # down, then told to stop
  client.close()


def test_client_queue_waits_on_a_full_learner_queue():
  queue = _queue(capacity=1)
  with ReplayServer(queue, auth_token=TOKEN) as server:
    client = ReplayClient(server.address, auth_token=TOKEN, max_retries=0)
    sink = ReplayClientQueue(client, poll_s=0.3)
    assert sink.put(_traj("a")) == (True, None)
    threading.Timer(1.0, lambda: queue.get_batch(1)).start()
    t0 = time.monotonic()
    assert sink.put(_traj("b")) == (True, None)  # held until the learner took "a"
    assert time.monotonic() - t0 >= 0.9 and sink.counters["timeouts"] >= 2
    assert queue.stats()["accepted"] == 2
    client.close()


class _SlowThenDuplicate:
  """A client whose first `slow` pushes time out on our side (the first one lands: the learner's
  queue was full and took it late); every later one is answered "duplicate"."""

  def __init__(self, on_timeout, slow=1):
    self.calls, self.on_timeout, self.slow = 0, on_timeout, slow

  def push(self, trajs, timeout):
    self.calls += 1
    if self.calls <= self.slow:
      self.on_timeout()
      raise TimeoutError("deadline exceeded")
    return _Result(0, [(0, trajs[0].uid, "duplicate")])


def test_client_queue_told_to_stop_settles_an_uncertain_push():
  # SIGTERM right after a push timed out on our side although the learner took it: the actor must
  # still count it as accepted (the learner has it), not as cancelled.
  stop = threading.Event()
  sink = ReplayClientQueue(_SlowThenDuplicate(stop.set), poll_s=0.1)
  assert sink.put(_traj("u"), cancel=stop.is_set) == (True, None)
  assert sink.client.calls == 2 and sink.counters["resent"] == 1
  # The queue is still full when it stops: the settling push times out too (CI saw 64 counted vs
  # 65 received); it is retried until answered.
  stop.clear()
  sink = ReplayClientQueue(_SlowThenDuplicate(stop.set, slow=3), poll_s=0.1)
  assert sink.put(_traj("v"), cancel=stop.is_set) == (True, None)
  assert sink.client.calls == 4 and sink.counters["resent"] == 1


class _Result:
  def __init__(self, accepted, rejections, resent=0, version=0):
    self.accepted, self.rejections, self.resent, self.version = (
      accepted,
      rejections,
      resent,
      version,
    )
