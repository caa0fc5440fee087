"""Tests of the in-process replay queue (sao_jax/replay/{base,memory,wire,testing}.py).

Every validation rule, dedup under concurrency, staleness at arrival and while queued, backpressure,
close, the checkpoint round trip, the stats accounting and the wire encoding, with exact numbers.
"""

import contextlib
import io
import json
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as config_lib
from sao_jax.replay import (
  QUEUE_FULL,
  InMemoryQueue,
  QueueClosed,
  flatten_stats,
  make_queue,
  window_metrics,
  wire,
)
from sao_jax.replay import replay_pb2 as pb
from sao_jax.replay.testing import MALFORMED_KINDS, make_trajectory, malformed
from sao_jax.types import Trajectory

VOCAB, MAX_LEN = 100, 64


def _queue(capacity=16, lag=4, version=10):
  return InMemoryQueue(capacity, max_policy_lag=lag, vocab_size=VOCAB, max_len=MAX_LEN,
                       version=version)  # fmt: skip


def _traj(uid, version=10, oldest=None, length=24, seed=0):
  return make_trajectory(uid, length=length, vocab_size=VOCAB, version=version,
                         oldest_version=oldest, seed=seed)  # fmt: skip


def _assert_same(a: Trajectory, b: Trajectory):
  assert (a.uid, a.prompt_id, a.group_id, a.env, a.reward) == (
    b.uid, b.prompt_id, b.group_id, b.env, b.reward,
  )  # fmt: skip
  for f in ("tokens", "action_mask", "rollout_logprobs", "policy_versions"):
    x, y = getattr(a, f), getattr(b, f)
    assert x.dtype == y.dtype and x.shape == y.shape, f
    np.testing.assert_array_equal(x, y, err_msg=f)
  assert a.metadata == b.metadata


def _accounting(stats):
  """accepted == queued + consumed + (dropped while queued)."""
  dropped_queued = stats["dropped_stale"] - stats["rejected"].get("stale", 0)
  return stats["accepted"] == stats["queued"] + stats["consumed"] + dropped_queued


# ---------------------------------------------------------------- validation and dedup


@pytest.mark.parametrize("kind", sorted(MALFORMED_KINDS))
def test_each_validation_rule_rejects_with_its_reason(kind):
  q = _queue()
  bad, reason = malformed(_traj("u1"), kind, vocab_size=VOCAB, max_len=MAX_LEN)
  assert q.put(bad) == (False, reason)
  s = q.stats()
  assert s["rejected"] == {reason: 1}
  assert (s["accepted"], s["queued"], len(q)) == (0, 0, 0)
  # The rejection does not burn the uid: a fixed trajectory with the same uid goes in.
  if kind != "missing_uid":
    assert q.put(_traj("u1")) == (True, None)


def test_token_bound_is_exclusive():
  t = _traj("a")
  t.tokens[-1] = VOCAB - 1
  assert _queue().put(t) == (True, None)


def test_duplicates_are_rejected_once_accepted_even_after_consumption():
  q = _queue()
  assert q.put(_traj("a")) == (True, None)
  assert q.put(_traj("a", seed=3)) == (False, "duplicate")
  q.get_batch(1)
  assert q.put(_traj("a")) == (False, "duplicate")
  s = q.stats()
  assert (s["accepted"], s["duplicates"], s["rejected"]) == (1, 2, {"duplicate": 2})


def test_concurrent_puts_of_one_uid_accept_exactly_one():
  q = _queue(capacity=64)
  results, barrier = [], threading.Barrier(8)

  def producer(i):
    barrier.wait()
    results.append(q.put(_traj("same", seed=i)))

  threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
  for th in threads:
    th.start()
  for th in threads:
    th.join()
  assert sorted(results, key=str) == [(False, "duplicate")] * 7 + [(True, None)]
  assert len(q) == 1


def test_version_from_future_follows_set_version():
  q = _queue(version=3)
  assert q.put(_traj("a", version=4)) == (False, "version_from_future")
  q.set_version(4)
  assert q.put(_traj("a", version=4)) == (True, None)
  # get_batch's current_version raises the queue's version, never lowers it.
  q.get_batch(1, current_version=6)
  assert q.version == 6
  q.put(_traj("b", version=6))
  q.get_batch(1, current_version=2)
  assert q.version == 6


# ---------------------------------------------------------------- staleness


def test_stale_on_arrival_boundary():
  q = _queue(lag=4, version=10)
  assert q.put(_traj("lag4", version=10, oldest=6)) == (True, None)  # 10 - 6 = 4: kept
  assert q.put(_traj("lag5", version=10, oldest=5)) == (False, "stale")  # 5 > 4: dropped
  s = q.stats()
  assert (s["dropped_stale"], s["rejected"], s["accepted"]) == (1, {"stale": 1}, 1)


def test_queued_items_go_stale_on_version_bump_and_oldest_token_counts():
  q = _queue(lag=4, version=5)
  q.put(_traj("v3", version=3))
  q.put(_traj("v4", version=4))
  q.put(_traj("mixed", version=5, oldest=2))  # newest tokens are fresh, the oldest is not
  q.put(_traj("v5", version=5))
  batch = q.get_batch(2, current_version=8)  # lags 5, 4, 6, 3: v3 and mixed are stale
  assert [t.uid for t in batch] == ["v4", "v5"]
  s = q.stats()
  assert (s["dropped_stale"], s["consumed"], s["queued"]) == (2, 2, 0)
  assert s["lag_histogram"] == {4: 1, 3: 1}
  assert _accounting(s)


def test_waiting_consumer_rechecks_staleness_after_set_version():
  q = _queue(lag=1, version=1)
  q.put(_traj("old", version=0))
  q.set_version(2)  # 'old' now has lag 2 > 1
  with pytest.raises(TimeoutError):
    q.get_batch(1, timeout=0.05)
  assert q.stats()["dropped_stale"] == 1 and len(q) == 0


def test_set_version_drops_stale_items_and_unblocks_producers():
  q = _queue(capacity=1, lag=1, version=5)
  assert q.put(_traj("a", version=4)) == (True, None)
  out = []
  producer = threading.Thread(target=lambda: out.append(q.put(_traj("b", version=5))))
  producer.start()
  time.sleep(0.1)
  assert out == []
  q.set_version(6)  # 'a' now has lag 2 > 1; 'b' has lag 1
  producer.join(5)
  assert out == [(True, None)]
  assert [t.uid for t in q.get_batch(1, timeout=1)] == ["b"]
  assert q.stats()["dropped_stale"] == 1


def test_no_action_tokens_is_never_stale():
  t = _traj("obs_only")
  t.action_mask[:] = False
  t.policy_versions[:] = -1
  t.rollout_logprobs[:] = 0
  q = _queue(lag=0, version=0)
  assert q.put(t) == (True, None)
  assert [x.uid for x in q.get_batch(1, current_version=100)] == ["obs_only"]
  assert q.stats()["lag_histogram"] == {}


# ---------------------------------------------------------------- batches, backpressure, close


def test_get_batch_is_fifo_and_all_or_nothing():
  q = _queue()
  for i in range(3):
    q.put(_traj(f"t{i}"))
  with pytest.raises(TimeoutError, match="3 of 5"):
    q.get_batch(5, timeout=0.05)
  assert len(q) == 3
  assert [t.uid for t in q.get_batch(2)] == ["t0", "t1"]
  assert [t.uid for t in q.get_batch(1)] == ["t2"]
  with pytest.raises(ValueError, match="capacity"):
    q.get_batch(17)


def test_backpressure_blocks_producer_until_room():
  q = _queue(capacity=2)
  q.put(_traj("a"))
  q.put(_traj("b"))
  out = []
  producer = threading.Thread(target=lambda: out.append(q.put(_traj("c"))))
  producer.start()
  time.sleep(0.2)
  assert producer.is_alive() and len(q) == 2 and out == []
  assert [t.uid for t in q.get_batch(1)] == ["a"]
  producer.join(5)
  assert out == [(True, None)]
  assert [t.uid for t in q.get_batch(2)] == ["b", "c"]
  assert q.stats()["put_wait_s"] >= 0.15


def test_put_timeout_is_not_a_rejection_and_uid_stays_free():
  q = _queue(capacity=1)
  q.put(_traj("a"))
  assert q.put(_traj("b"), timeout=0.05) == (False, QUEUE_FULL)
  s = q.stats()
  assert (s["put_timeouts"], s["rejected"]) == (1, {})
  q.get_batch(1)
  assert q.put(_traj("b"), timeout=0.05) == (True, None)


def test_cancelled_put_gives_up_without_counting():
  q = _queue(capacity=1)
  q.put(_traj("a"))
  stop = threading.Event()
  threading.Timer(0.15, stop.set).start()
  t0 = time.monotonic()
  assert q.put(_traj("b"), cancel=stop.is_set) == (False, "cancelled")
  assert 0.1 < time.monotonic() - t0 < 1.0
  s = q.stats()
  assert (s["put_timeouts"], s["rejected"], s["accepted"]) == (0, {}, 1)


def test_close_wakes_blocked_producer_and_consumer():
  full, empty = _queue(capacity=1), _queue()
  full.put(_traj("a"))
  out, errors = [], []
  producer = threading.Thread(target=lambda: out.append(full.put(_traj("b"))))

  def consume():
    try:
      empty.get_batch(1)
    except QueueClosed as e:
      errors.append(e)

  consumer = threading.Thread(target=consume)
  producer.start()
  consumer.start()
  time.sleep(0.1)
  full.close()
  empty.close()
  producer.join(5)
  consumer.join(5)
  assert out == [(False, "closed")] and len(errors) == 1
  # A closed queue still hands out what it holds.
  assert [t.uid for t in full.get_batch(1)] == ["a"]


def test_queue_age_is_measured():
  q = _queue()
  q.put(_traj("a"))
  time.sleep(0.1)
  q.put(_traj("b"))
  q.get_batch(2)
  s = q.stats()
  age_a = s["age_max_s"]
  age_b = 2 * s["age_mean_s"] - age_a  # the mean is over exactly the two consumed items
  assert 0.1 <= age_a < 5.0
  assert 0.0 <= age_b <= age_a - 0.1 + 1e-6  # 'b' was queued 0.1 s after 'a'
  assert s["age_p50_s"] == pytest.approx((age_a + age_b) / 2)


def test_make_queue_reads_the_run_config():
  c = config_lib.base_config()
  c.replay.capacity, c.replay.max_policy_lag, c.max_seq_len = 8, 2, 40
  q = make_queue(c, vocab_size=VOCAB, version=3)
  assert (q.capacity, q.max_policy_lag, q.max_len, q.vocab_size, q.version) == (8, 2, 40, VOCAB, 3)
  assert q.put(_traj("long", version=3, length=41)) == (False, "too_long")


def test_bad_constructor_arguments_name_the_field():
  with pytest.raises(ValueError, match="capacity"):
    InMemoryQueue(0, max_policy_lag=1)
  with pytest.raises(ValueError, match="max_policy_lag"):
    InMemoryQueue(4, max_policy_lag=-1)


def test_accounting_invariant_under_random_operations():
  rng = np.random.default_rng(0)
  q = InMemoryQueue(8, max_policy_lag=2, vocab_size=VOCAB, max_len=MAX_LEN)
  version = 0
  for step in range(300):
    op = rng.integers(4)
    if op <= 1:
      v = int(rng.integers(max(0, version - 3), version + 2))  # sometimes stale or future
      q.put(_traj(f"u{rng.integers(120)}", version=v, seed=step), timeout=0)
    elif op == 2:
      with contextlib.suppress(TimeoutError):  # empty, or everything queued was stale
        q.get_batch(1, current_version=version, timeout=0)
    else:
      version += 1
      q.set_version(version)
    assert _accounting(q.stats()), step


# ---------------------------------------------------------------- checkpoint state


def _npz_json_round_trip(state):
  """What a checkpoint does: arrays through npz, meta through JSON."""
  buf = io.BytesIO()
  np.savez(buf, **state["arrays"])
  buf.seek(0)
  with np.load(buf) as z:
    arrays = {k: z[k] for k in z.files}
  return {"arrays": arrays, "meta": json.loads(json.dumps(state["meta"]))}


def test_state_round_trip_restores_contents_seen_uids_and_counters():
  q = _queue(capacity=32)
  trajs = [_traj(f"t{i}", length=int(8 + 5 * i), seed=i) for i in range(10)]
  trajs[3].metadata = {"turns": 3, "finish": "length", "latency_s": np.float32(1.5)}
  for t in trajs:
    q.put(t)
  q.put(_traj("t0"))  # a duplicate
  consumed = q.get_batch(4)
  state = q.state_dict()
  assert all(isinstance(a, np.ndarray) and a.ndim == 1 for a in state["arrays"].values())
  assert state["arrays"]["tokens"].shape == (sum(len(t) for t in trajs[4:]),)

  restored = _queue(capacity=32, version=0)
  restored.load_state_dict(_npz_json_round_trip(state))
  assert restored.version == 10 and len(restored) == 6
  stats_a, stats_b = q.stats(), restored.stats()
  for key in ("accepted", "rejected", "duplicates", "consumed", "lag_histogram", "dropped_stale"):
    assert stats_a[key] == stats_b[key], key
  # Every uid seen before the checkpoint is refused, queued or consumed alike.
  for t in trajs:
    assert restored.put(t) == (False, "duplicate")
  rest = restored.get_batch(6)
  for got, want in zip(rest, trajs[4:], strict=True):
    _assert_same(got, want)
  assert not {t.uid for t in consumed} & {t.uid for t in rest}


def test_empty_state_round_trip_and_corrupt_state_is_refused():
  q = _queue()
  state = q.state_dict()
  r = _queue()
  r.load_state_dict(_npz_json_round_trip(state))
  assert len(r) == 0
  q.put(_traj("a"))
  bad = q.state_dict()
  bad["arrays"]["tokens"] = bad["arrays"]["tokens"][:-1]
  with pytest.raises(ValueError, match="tokens"):
    r.load_state_dict(bad)


# ---------------------------------------------------------------- metrics


def test_flatten_stats_hand_computed():
  stats = {"accepted": 7, "rejected": {"duplicate": 2, "stale": 1}, "dropped_stale": 3,
           "lag_histogram": {0: 1, 2: 3}, "age_mean_s": 0.5}  # fmt: skip
  assert flatten_stats(stats) == {
    "replay/accepted": 7.0,
    "replay/rejected/duplicate": 2.0,
    "replay/rejected/stale": 1.0,
    "replay/dropped_stale": 3.0,
    "replay/lag/0": 0.25,
    "replay/lag/2": 0.75,
    "replay/lag_mean": 1.5,
    "replay/age_mean_s": 0.5,
  }


def test_window_metrics_hand_computed():
  prev = {"get_wait_s": 1.0, "put_wait_s": 2.0, "accepted": 10, "consumed": 8, "dropped_stale": 0}
  cur = {"get_wait_s": 1.5, "put_wait_s": 6.0, "accepted": 30, "consumed": 28, "dropped_stale": 2}
  assert window_metrics(prev, cur, 2.0, num_producers=4) == {
    "replay/learner_wait_fraction": 0.25,
    "replay/producer_blocked_fraction": 0.5,
    "replay/accepted_per_s": 10.0,
    "replay/consumed_per_s": 10.0,
    "replay/dropped_stale_per_s": 1.0,
  }
  with pytest.raises(ValueError, match="elapsed_s"):
    window_metrics(prev, cur, 0.0)


# ---------------------------------------------------------------- wire


def test_wire_round_trip_is_exact_and_little_endian():
  t = _traj("w", length=40, seed=5)
  t.metadata = {"s": "x", "f": 0.25, "i": 7, "b": True, "np": np.float32(1.5)}
  msg = pb.Trajectory.FromString(wire.to_proto(t).SerializeToString())
  back = wire.from_proto(msg)
  assert back.metadata == {"s": "x", "f": 0.25, "i": 7, "b": 1, "np": 1.5}
  back.metadata = t.metadata
  _assert_same(back, t)
  small = Trajectory("u", "p", "g", "e", [1, 256], [False, True], [0.0, -1.0], [-1, 3], 0.0)
  m = wire.to_proto(small)
  assert m.tokens == b"\x01\x00\x00\x00\x00\x01\x00\x00"
  assert m.action_mask == b"\x00\x01"
  assert m.policy_versions == b"\xff\xff\xff\xff\x03\x00\x00\x00"
  assert m.rollout_logprobs == np.array([0.0, -1.0], "<f4").tobytes()


def test_wire_refuses_jax_arrays():
  t = _traj("j")
  t.tokens = jnp.asarray(t.tokens)
  with pytest.raises(TypeError, match=r"Trajectory.tokens is a jax.*numpy"):
    wire.to_proto(t)
  t = _traj("j")
  t.metadata = {"loss": jnp.float32(1.0)}
  with pytest.raises(TypeError, match="metadata"):
    wire.to_proto(t)


@pytest.mark.parametrize(
  "field,value,reason",
  [
    ("tokens", b"\x01\x00\x00", "bad_encoding:tokens"),
    ("rollout_logprobs", b"\x00" * 5, "bad_encoding:rollout_logprobs"),
    ("action_mask", b"\x00\x02", "bad_encoding:action_mask"),
  ],
)
def test_wire_bad_bytes_give_reasons(field, value, reason):
  msg = wire.to_proto(_traj("b"))
  setattr(msg, field, value)
  assert wire.from_proto(msg) == reason


def test_wire_unset_metadata_value_is_refused():
  msg = wire.to_proto(_traj("m"))
  msg.metadata["empty"].CopyFrom(pb.MetadataValue())
  assert wire.from_proto(msg) == "bad_encoding:metadata"


def test_malformed_helper_breaks_a_copy_with_the_reason_validate_gives():
  base = _traj("k")
  for kind, reason in MALFORMED_KINDS.items():
    bad, r = malformed(base, kind, vocab_size=VOCAB, max_len=MAX_LEN)
    assert r == reason
    got = bad.validate(vocab_size=VOCAB, max_len=MAX_LEN, current_version=10)
    assert got == (None if kind == "missing_uid" else reason), kind  # uid is the queue's check
    assert base.validate(vocab_size=VOCAB, max_len=MAX_LEN) is None  # the original is untouched
