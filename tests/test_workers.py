"""Rollout workers (async mode) over the in-memory queue, with a timed fake engine: continuous
fresh trajectories while versions advance, counters that add up, a clean stop, resume of the task
and seed streams, error reporting and retry; the async metrics helpers on their outputs."""

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from sao_jax import async_metrics
from sao_jax.envs.base import StepResult
from sao_jax.models.tokenizer import load_tokenizer
from sao_jax.replay import InMemoryQueue, QueueClosed
from sao_jax.rollout import AgentLoop, AgentSettings, GenerateResult, ServerError
from sao_jax.rollout.protocol import GenerateEngine
from sao_jax.rollout.weights import InProcessPublisher
from sao_jax.rollout.workers import (
  CANCELLED,
  LOST_IN_FLIGHT,
  RolloutWorkerError,
  RolloutWorkers,
  next_batch,
  publish_weights,
)

TOK = load_tokenizer("byte")
VOCAB = TOK.vocab_size


class FakeEngine(GenerateEngine):
  """Answers each request after `delay_s` with 3 tokens tagged with the version at submit time."""

  def __init__(self, delay_s=0.005, fail=None):
    self.version_now, self.delay_s, self.fail = 0, delay_s, fail
    self.requests = 0
    self._lock = threading.Lock()
    self._pending: dict[concurrent.futures.Future, object] = {}

  @property
  def version(self):
    return self.version_now

  def update_weights(self, params, version):
    self.version_now = version

  def submit(self, request):
    with self._lock:
      self.requests += 1
      n = self.requests
    if self.fail is not None and self.fail(n):
      raise ServerError(f"request {n} failed")
    future, version = concurrent.futures.Future(), self.version_now
    out = [65, 66, TOK.eos_id]
    result = GenerateResult(
      request.rid, out, [-0.5] * 3, [version] * 3, "stop", len(request.input_ids)
    )
    timer = threading.Timer(self.delay_s, lambda: future.done() or future.set_result(result))
    timer.daemon = True
    timer.start()
    return future

  def abort(self, rids=None):
    return 0

  def close(self):
    pass


class OneTurnEnv:
  def reset(self, task):
    return [{"role": "user", "content": task["problem"]}]

  def step(self, action):
    return StepResult(None, 1.0, True, {"finish_reason": "answer"})


def tasks(n=None):
  """Task records p0, p1, ... (endless when n is None) with a grain-like get/set_state."""

  class It:
    def __init__(self):
      self.i = 0

    def __iter__(self):
      return self

    def __next__(self):
      if n is not None and self.i >= n:
        raise StopIteration
      self.i += 1
      return {"id": f"p{self.i - 1}", "problem": "1+1"}

    def get_state(self):
      return {"i": self.i}

    def set_state(self, s):
      self.i = s["i"]

  return It()


def make_agent(engine, concurrency=4):
  settings = AgentSettings(max_turns=1, max_seq_len=128, max_new_tokens=8, concurrency=concurrency)
  return AgentLoop(engine, TOK, OneTurnEnv, settings, env_name="fake")


def queue(capacity=16, lag=2):
  return InMemoryQueue(capacity, max_policy_lag=lag, vocab_size=VOCAB, max_len=128)


def test_workers_feed_fresh_trajectories_while_versions_advance_and_stop_cleanly():
  engine, q = FakeEngine(), queue(capacity=16, lag=2)
  workers = RolloutWorkers(make_agent(engine), tasks(), q, num_workers=2, seed=5).start()
  publisher = InProcessPublisher(engine)
  seen = set()
  for version in range(12):  # a simulated learner: take 8, step, publish v + 1
    batch = workers.next_batch(8, version=version, timeout=30)
    for t in batch:
      assert t.uid not in seen and t.validate(vocab_size=VOCAB, current_version=version) is None
      seen.add(t.uid)
      assert version - t.oldest_version <= 2  # max_policy_lag holds for everything consumed
    publish_weights(publisher, None, version + 1, queue=q)
    assert engine.version == version + 1 and q.version == version + 1
  assert workers.stop(timeout=10) and workers.alive == 0
  st, qs = workers.stats(), q.stats()
  # Every episode is accounted for, and the queue agrees on what it accepted.
  assert st["in_flight"] == 0
  assert st["episodes_started"] == st["accepted"] + sum(st["dropped"].values())
  stale_queued = qs["dropped_stale"] - qs["rejected"].get("stale", 0)  # the rest was refused
  assert st["accepted"] == qs["accepted"] == qs["consumed"] + qs["queued"] + stale_queued
  assert st["dropped"].get("stale", 0) == qs["rejected"].get("stale", 0)
  assert set(st["dropped"]) <= {CANCELLED, LOST_IN_FLIGHT, "stale"}
  assert qs["consumed"] == 96 and publisher.count == 12 and publisher.stats()["max_s"] >= 0
  # The queue stayed full (workers outpace this learner), so workers spent time blocked.
  assert st["idle_s"] > 0
  accepted = q.stats()["accepted"]
  time.sleep(0.1)
  assert q.stats()["accepted"] == accepted  # nothing is put after stop()


def test_resume_continues_the_task_and_seed_streams():
  def run(state=None, batches=2):
    engine, q = FakeEngine(), queue(capacity=8)
    it = tasks()
    w = RolloutWorkers(make_agent(engine, concurrency=2), it, q, num_workers=1, seed=9)
    if state is not None:
      w.load_state_dict(state)
    w.start()
    got = [t for _ in range(batches) for t in w.next_batch(4, version=0, timeout=30)]
    w.stop(timeout=10)
    return got, w.state_dict()

  first, state = run()
  assert state["seed"] == 9 and state["data"]["i"] == state["episodes_started"][0] >= 8
  second, state2 = run(state)
  firsts = {t.prompt_id for t in first}
  # The resumed run starts at the saved task position and numbers its episodes on from there.
  assert min(int(t.prompt_id[1:]) for t in second) >= state["data"]["i"]
  assert not firsts & {t.prompt_id for t in second}
  assert not {t.uid for t in first} & {t.uid for t in second}
  assert state2["episodes_started"][0] > state["episodes_started"][0]
  # Same numbering from a fresh copy of the state: the same uids (seeds depend on the index only).
  third, _ = run(state)
  assert {t.uid for t in third} & {t.uid for t in second}
  with pytest.raises(ValueError, match="seed"):
    RolloutWorkers(make_agent(FakeEngine()), tasks(), queue(), seed=1).load_state_dict(state)


def test_a_crashed_worker_is_reported_to_the_learner():
  engine = FakeEngine(fail=lambda n: n > 6)  # every request after the 6th fails
  q = queue(capacity=64)
  workers = RolloutWorkers(make_agent(engine), tasks(), q, retry_on=(), seed=0).start()
  with pytest.raises(RolloutWorkerError, match="rollout worker 0 failed: ServerError") as e:
    next_batch(q, 32, version=0, workers=workers, poll_s=0.05, timeout=30)
  assert isinstance(e.value.__cause__, ServerError) and workers.stats()["failed"] == 1
  workers.stop(timeout=5)


def test_retryable_errors_restart_the_stream_and_lost_episodes_are_counted():
  fails = {3, 4, 11}
  engine = FakeEngine(fail=lambda n: n in fails)
  q = queue(capacity=64)
  # One episode in flight at a time, so each failed request fails its own stream.
  workers = RolloutWorkers(make_agent(engine, concurrency=1), tasks(), q, backoff_s=0.01, seed=0)
  workers.start()
  batch = workers.next_batch(20, version=0, timeout=30)
  workers.stop(timeout=5)
  st = workers.stats()
  assert len(batch) == 20 and st["errors"] == 3 and st["failed"] == 0
  assert st["dropped"][LOST_IN_FLIGHT] == 3  # each failed request loses its episode
  assert st["episodes_started"] == st["accepted"] + sum(st["dropped"].values())


def test_finite_tasks_end_the_workers_and_the_learner_hears_of_it():
  q = queue(capacity=64)
  workers = RolloutWorkers(make_agent(FakeEngine()), tasks(n=10), q, seed=0).start()
  assert len(workers.next_batch(10, version=0, timeout=30)) == 10
  with pytest.raises(QueueClosed, match="task iterator ran out"):
    workers.next_batch(1, version=0, poll_s=0.05, timeout=30)
  assert workers.stats()["episodes_started"] == 10


def test_async_metrics_windows():
  engine, q = FakeEngine(), queue(capacity=8, lag=1)
  workers = RolloutWorkers(make_agent(engine), tasks(), q, seed=0).start()
  meter = async_metrics.AsyncMetrics(q, workers=workers, publisher=InProcessPublisher(engine))
  for version in range(4):
    batch = workers.next_batch(4, version=version, timeout=30)
    publish_weights(meter.publisher, None, version + 1, queue=q)
  m = meter.collect()
  workers.stop(timeout=5)
  lags = async_metrics.batch_lags(batch, version=3)
  assert lags.shape == (4,) and lags.min() >= 0
  bm = async_metrics.batch_lag_metrics(batch, version=3, max_lag=1)
  assert abs(sum(v for k, v in bm.items() if k.startswith("policy_lag/batch_hist/")) - 1) < 1e-9
  hist = {k: v for k, v in m.items() if k.startswith("async/lag_hist/")}
  assert hist and abs(sum(hist.values()) - 1) < 1e-9
  assert m["async/consumed"] == 16 and m["async/weight_publishes"] == 4
  for k in ("async/learner_idle_fraction", "async/rollout_idle_fraction"):
    assert 0 <= m[k] <= 1
  assert m["async/queue_age_p90_s"] >= m["async/queue_age_p50_s"] >= 0
  assert np.isfinite(m["async/weight_publish_mean_s"])
