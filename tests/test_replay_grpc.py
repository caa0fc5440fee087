"""Tests of the gRPC ReplayService (server.py, client.py, serve.py, gen.py) on localhost.

Authentication, per-trajectory rejection reasons over the wire, explicit size limits on both ends,
backpressure of a streaming Push, retries across a server restart, restart with restored contents
(no trajectory consumed twice), the standalone server, the generated modules being up to date, and
the load test of issue 8: 8 producers x 500 trajectories with 5% malformed, duplicates and an
unauthenticated client.
"""

import collections
import contextlib
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from sao_jax import config as config_lib
from sao_jax.replay import (
  InMemoryQueue,
  ReplayAuthError,
  ReplayClient,
  ReplayServer,
  ReplayUnavailable,
  gen,
  make_server,
  serve,
  wire,
)
from sao_jax.replay import replay_pb2_grpc as pb_grpc
from sao_jax.replay.testing import MALFORMED_KINDS, make_trajectory, malformed

VOCAB, MAX_LEN, VERSION, TOKEN = 100, 128, 10, "s3cret"
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _queue(capacity=64, version=VERSION):
  return InMemoryQueue(capacity, max_policy_lag=4, vocab_size=VOCAB, max_len=MAX_LEN,
                       version=version)  # fmt: skip


def _traj(uid, length=24, seed=0, version=VERSION):
  return make_trajectory(uid, length=length, vocab_size=VOCAB, version=version, seed=seed)


@pytest.fixture
def served():
  """(queue, server, client) on a free localhost port."""
  queue = _queue()
  server = ReplayServer(queue, auth_token=TOKEN)
  server.start()
  client = ReplayClient(server.address, auth_token=TOKEN, max_retries=2, backoff_s=0.05)
  yield queue, server, client
  client.close()
  server.stop(grace=0)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# ---------------------------------------------------------------- auth, validation, limits


def test_wrong_or_missing_token_is_unauthenticated_and_counted(served):
  queue, server, client = served
  with ReplayClient(server.address, auth_token="wrong") as bad:
    with pytest.raises(ReplayAuthError):
      bad.push([_traj("a")])
    with pytest.raises(ReplayAuthError):
      bad.stats()
  stub = pb_grpc.ReplayServiceStub(client._channel)
  with pytest.raises(grpc.RpcError) as e:
    stub.Push(iter([wire.to_proto(_traj("b"))]))  # no metadata at all
  assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
  assert len(queue) == 0
  stats = client.stats()
  assert (stats["unauthenticated"], stats["accepted"], stats["rejected"]) == (3, 0, {})
  assert client.health()  # health needs no token


def test_every_rejection_over_the_wire_carries_its_reason(served):
  queue, _, client = served
  trajs, expected = [], {}
  for i, kind in enumerate(sorted(MALFORMED_KINDS)):
    bad, reason = malformed(_traj(f"bad{i}", seed=i), kind, vocab_size=VOCAB, max_len=MAX_LEN)
    expected[len(trajs)] = reason
    trajs.append(bad)
    trajs.append(_traj(f"good{i}", seed=i))
  trajs.append(_traj("good0"))
  expected[len(trajs) - 1] = "duplicate"
  result = client.push(trajs)
  assert result.accepted == len(MALFORMED_KINDS) == len(queue)
  assert {index: reason for index, _, reason in result.rejections} == expected
  assert result.version == VERSION and result.attempts == 1
  stats = client.stats()
  assert stats["rejected"] == dict(collections.Counter(expected.values()))
  assert stats["duplicates"] == 1 and stats["accepted"] == len(MALFORMED_KINDS)


def test_bad_encoding_is_a_rejection_not_an_error(served):
  queue, _, client = served
  msg = wire.to_proto(_traj("x"))
  msg.tokens = msg.tokens[:-1]
  stub = pb_grpc.ReplayServiceStub(client._channel)
  summary = stub.Push(iter([msg, wire.to_proto(_traj("y"))]), metadata=client._metadata)
  assert summary.accepted == 1 and summary.rejected == 1
  assert (summary.rejections[0].index, summary.rejections[0].reason) == (0, "bad_encoding:tokens")
  assert queue.stats()["rejected"] == {"bad_encoding:tokens": 1}


def test_size_limits_on_both_ends():
  queue = _queue()
  with ReplayServer(queue, auth_token=TOKEN, max_message_bytes=64 * 1024) as server:
    big = _traj("big", length=20_000)  # ~180 KB on the wire
    # Client limit below the message: refused locally with a reason, the stream goes on.
    with ReplayClient(server.address, auth_token=TOKEN, max_message_bytes=64 * 1024) as client:
      result = client.push([_traj("a"), big, _traj("b")])
      assert result.accepted == 2 and result.rejections == [(1, "big", "too_large")]
    # Client limit above the server's: the server refuses the message (RESOURCE_EXHAUSTED).
    client = ReplayClient(server.address, auth_token=TOKEN, max_message_bytes=1 << 20)
    with client, pytest.raises(ReplayUnavailable, match="RESOURCE_EXHAUSTED"):
      client.push([big])
  assert [t.uid for t in queue.get_batch(2)] == ["a", "b"]


def test_stats_over_grpc_match_the_queue(served):
  queue, _, client = served
  client.push([_traj(f"t{i}", seed=i) for i in range(6)] + [_traj("t0")])
  queue.get_batch(4, current_version=VERSION + 1)
  local, remote = queue.stats(), client.stats()
  for key in ("accepted", "rejected", "duplicates", "dropped_stale", "queued", "consumed",
              "version", "capacity", "put_timeouts", "lag_histogram"):  # fmt: skip
    assert remote[key] == local[key], key
  assert remote["lag_histogram"] == {1: 4}
  assert remote["age_max_s"] == pytest.approx(local["age_max_s"])


def test_standard_grpc_health_service(served):
  health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
  health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
  _, _, client = served
  stub = health_pb2_grpc.HealthStub(client._channel)
  for service in ("", "sao_jax.replay.v1.ReplayService"):
    reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_make_server_reads_the_run_config(monkeypatch):
  c = config_lib.base_config()
  queue = _queue()
  assert make_server(queue, c) is None  # serve_address "" = in-process only
  c.replay.serve_address, c.replay.auth_token = "127.0.0.1:0", ""
  monkeypatch.delenv("SAO_REPLAY_TOKEN", raising=False)
  with pytest.raises(ValueError, match="auth_token"):
    make_server(queue, c)
  monkeypatch.setenv("SAO_REPLAY_TOKEN", TOKEN)
  server = make_server(queue, c)
  try:
    assert server.port > 0 and server.max_message_bytes == c.replay.max_message_bytes
    with ReplayClient(server.address, auth_token=TOKEN) as client:
      assert client.put(_traj("a")) == (True, None)
  finally:
    server.stop(grace=0)
  c.replay.serve_address = "no-port"
  with pytest.raises(ValueError, match="host:port"):
    make_server(queue, c)


# ---------------------------------------------------------------- backpressure and restarts


def test_streaming_push_is_slowed_by_a_full_queue_not_dropped():
  queue = _queue(capacity=4)
  with (
    ReplayServer(queue, auth_token=TOKEN) as server,
    ReplayClient(server.address, auth_token=TOKEN) as client,
  ):
    results = []
    pusher = threading.Thread(
      target=lambda: results.append(client.push([_traj(f"t{i}", seed=i) for i in range(10)]))
    )
    pusher.start()
    time.sleep(0.5)
    assert pusher.is_alive() and len(queue) == 4 and results == []
    got = queue.get_batch(4, timeout=5) + queue.get_batch(4, timeout=5)
    got += queue.get_batch(2, timeout=5)
    pusher.join(10)
  assert [t.uid for t in got] == [f"t{i}" for i in range(10)]
  assert results[0].accepted == 10 and results[0].rejections == []
  assert queue.stats()["put_timeouts"] == 0 and queue.stats()["put_wait_s"] > 0.3


def test_client_retries_until_the_server_comes_up():
  port = _free_port()
  queue = _queue()
  server = ReplayServer(queue, auth_token=TOKEN, port=port)
  starter = threading.Timer(0.6, server.start)
  starter.start()
  try:
    with ReplayClient(f"127.0.0.1:{port}", auth_token=TOKEN, backoff_s=0.05,
                      max_backoff_s=0.2) as client:  # fmt: skip
      result = client.push([_traj("a"), _traj("b")])
    assert result.accepted == 2 and result.attempts > 1 and len(queue) == 2
  finally:
    starter.join()
    server.stop(grace=0)
  with ReplayClient(f"127.0.0.1:{port}", auth_token=TOKEN, max_retries=1, backoff_s=0.01) as c:
    t0 = time.monotonic()
    with pytest.raises(ReplayUnavailable, match="UNAVAILABLE after 2 attempt"):
      c.push([_traj("c")])
    assert time.monotonic() - t0 < 5


class _ClosesOnceQueue(InMemoryQueue):
  """Answers "closed" to the first put of uid 'b' (a queue closing mid-stream), then recovers."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.tripped = False

  def put(self, traj, timeout=None, *, cancel=None):
    if traj.uid == "b" and not self.tripped:
      self.tripped = True
      return False, "closed"
    return super().put(traj, timeout, cancel=cancel)


def test_retry_after_a_broken_stream_counts_own_deliveries_as_accepted():
  queue = _ClosesOnceQueue(16, max_policy_lag=4, vocab_size=VOCAB, max_len=MAX_LEN, version=VERSION)
  with (
    ReplayServer(queue, auth_token=TOKEN) as server,
    ReplayClient(server.address, auth_token=TOKEN, backoff_s=0.01) as client,
  ):
    result = client.push([_traj("a"), _traj("b"), _traj("a")])
  # Attempt 1 delivered 'a' and broke at 'b' (UNAVAILABLE); attempt 2 re-sent everything.
  assert (result.attempts, result.accepted, result.resent) == (2, 2, 1)
  assert result.rejections == [(2, "a", "duplicate")]  # the genuine in-call duplicate stays one
  assert [t.uid for t in queue.get_batch(2)] == ["a", "b"]


def test_server_restart_restores_contents_and_consumes_nothing_twice():
  port = _free_port()
  queue = _queue()
  server = ReplayServer(queue, auth_token=TOKEN, port=port)
  server.start()
  client = ReplayClient(f"127.0.0.1:{port}", auth_token=TOKEN, backoff_s=0.05, max_backoff_s=0.2)
  first = [_traj(f"a{i}", seed=i) for i in range(20)]
  assert client.push(first).accepted == 20
  consumed_before = [t.uid for t in queue.get_batch(8)]
  state = queue.state_dict()  # the learner's checkpoint
  server.stop(grace=0)  # the learner dies
  queue.close()

  restored = _queue(version=0)
  restored.load_state_dict(state)
  server2 = ReplayServer(restored, auth_token=TOKEN, port=port)
  server2.start()
  try:
    # Actors re-send what they had (all duplicates now) plus new work, over the same client.
    result = client.push(first + [_traj(f"b{i}", seed=i) for i in range(5)])
    assert result.accepted == 5
    assert collections.Counter(r for _, _, r in result.rejections) == {"duplicate": 20}
    consumed_after = [t.uid for t in restored.get_batch(17, timeout=5)]
  finally:
    client.close()
    server2.stop(grace=0)
  assert not set(consumed_before) & set(consumed_after)
  assert consumed_after == [f"a{i}" for i in range(8, 20)] + [f"b{i}" for i in range(5)]
  assert restored.stats()["consumed"] == 25 and len(restored) == 0


# ---------------------------------------------------------------- standalone server, codegen


def test_serve_cli_prints_port_and_serves_until_sigterm():
  proc = subprocess.Popen(
    [sys.executable, "-m", "sao_jax.replay.serve", "--port", "0", "--auth-token", TOKEN,
     "--vocab-size", str(VOCAB), "--capacity", "8", "--max-policy-lag", "2"],
    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
  )  # fmt: skip
  try:
    port = int(proc.stdout.readline())
    with ReplayClient(f"127.0.0.1:{port}", auth_token=TOKEN) as client:
      client.wait_ready(10)
      good, bad = _traj("a", version=0), _traj("b", version=1)  # the server is at version 0
      result = client.push([good, bad])
      stats = client.stats()
    assert result.accepted == 1 and result.rejections == [(1, "b", "version_from_future")]
    assert (stats["capacity"], stats["queued"], stats["version"]) == (8, 1, 0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
  finally:
    proc.kill()
    proc.wait()


def test_serve_cli_requires_a_token(monkeypatch, capsys):
  monkeypatch.delenv("SAO_REPLAY_TOKEN", raising=False)
  with pytest.raises(SystemExit) as e:
    serve.main(["--vocab-size", "10"])
  assert e.value.code == 2 and "--auth-token" in capsys.readouterr().err


def test_generated_modules_are_up_to_date(tmp_path):
  for path in gen.generate(tmp_path):
    committed = ROOT / "sao_jax" / "replay" / path.name
    assert path.read_text() == committed.read_text(), (
      f"run `python -m sao_jax.replay.gen`: {path.name}"
    )


# ---------------------------------------------------------------- the load test of issue 8


def _valid(p: int, i: int):
  """Producer p's i-th valid trajectory; lengths 8..127, deterministic so copies are identical."""
  return _traj(f"p{p}-{i}", length=8 + (p * 1000 + i) * 7919 % (MAX_LEN - 8), seed=p * 1000 + i)


def _producer_workload(p: int, n: int, rng: np.random.Generator):
  """n trajectories for producer p: 5% malformed, 20 copies of producer p+1's, the rest new.

  Returns:
    (trajectories in a shuffled order, for each the expected reason, "dup" or None for valid).
  """
  kinds = sorted(MALFORMED_KINDS)
  n_bad, n_dup = n // 20, 20
  trajs = [_valid(p, i) for i in range(n - n_bad - n_dup)]
  reasons = [None] * len(trajs)
  for i in range(n_bad):
    bad, reason = malformed(_traj(f"p{p}-bad{i}", seed=i), kinds[(p + i) % len(kinds)],
                            vocab_size=VOCAB, max_len=MAX_LEN)  # fmt: skip
    trajs.append(bad)
    reasons.append(reason)
  trajs += [_valid((p + 1) % 8, i) for i in range(n_dup)]  # either copy may arrive first
  reasons += ["dup"] * n_dup
  order = rng.permutation(n)
  return [trajs[k] for k in order], [reasons[k] for k in order]


def _run_load(workloads, capacity=64):
  """Producers, an intruder with a wrong token, and a late consumer against one server.

  Returns:
    (PushResults per producer, the intruder's errors, consumed uids, queue stats, refused calls).
  """
  queue = _queue(capacity=capacity, version=VERSION)
  server = ReplayServer(queue, auth_token=TOKEN, max_workers=16)
  server.start()
  results, errors, consumed, done = {}, [], [], threading.Event()

  def produce(p):
    trajs, _ = workloads[p]
    with ReplayClient(server.address, auth_token=TOKEN) as client:
      results[p] = [client.push(trajs[k : k + 50]) for k in range(0, len(trajs), 50)]

  def intrude():
    with ReplayClient(server.address, auth_token="guess") as client:
      for k in range(5):
        try:
          client.push([_traj(f"evil{k}")])
        except ReplayAuthError as e:
          errors.append(e)

  def consume():  # a learner that starts late, then takes batches while producers run
    time.sleep(0.5)  # the queue fills up meanwhile: producers must be held back, not dropped
    while not done.is_set() or len(queue) >= 32:
      with contextlib.suppress(TimeoutError):
        consumed.extend(t.uid for t in queue.get_batch(32, timeout=0.05))

  threads = [threading.Thread(target=produce, args=(p,)) for p in range(len(workloads))]
  threads.append(threading.Thread(target=intrude))
  consumer = threading.Thread(target=consume)
  for th in [*threads, consumer]:
    th.start()
  for th in threads:
    th.join(120)
  done.set()
  consumer.join(30)
  if len(queue):
    consumed.extend(t.uid for t in queue.get_batch(len(queue)))
  stats = queue.stats()
  server.stop(grace=0)
  return results, errors, consumed, stats, server.servicer.unauthenticated


def test_load_8_producers_x_500_with_malformed_duplicates_and_an_intruder():
  workloads = [_producer_workload(p, 500, np.random.default_rng(p)) for p in range(8)]
  results, errors, consumed, stats, unauthenticated = _run_load(workloads)
  valid = {
    t.uid for trajs, reasons in workloads for t, r in zip(trajs, reasons, strict=True) if r is None
  }
  assert len(valid) == 8 * 455
  # Accepted == valid unique, exactly, by every count; each consumed once.
  assert sum(r.accepted for rs in results.values() for r in rs) == len(valid)
  assert stats["accepted"] == len(valid) and len(consumed) == len(valid)
  assert set(consumed) == valid and stats["consumed"] == len(valid)
  # Every rejection has its reason: malformed ones the reason of their defect, and exactly one of
  # the two copies of each duplicated uid is refused as "duplicate".
  outcomes = collections.defaultdict(list)
  for p, rs in results.items():
    trajs, reasons = workloads[p]
    got = {50 * k + i: reason for k, r in enumerate(rs) for i, _, reason in r.rejections}
    assert all(r.attempts == 1 and r.resent == 0 for r in rs)
    for i, (t, expected) in enumerate(zip(trajs, reasons, strict=True)):
      if expected in (None, "dup"):
        outcomes[t.uid].append(got.get(i))
      else:
        assert got.get(i) == expected, (p, i, t.uid)
  dup_uids = [u for u, o in outcomes.items() if len(o) == 2]
  assert len(dup_uids) == 8 * 20
  assert all(collections.Counter(outcomes[u]) == {"duplicate": 1, None: 1} for u in dup_uids)
  malformed_counts = collections.Counter(
    r for trajs, reasons in workloads for r in reasons if r not in (None, "dup")
  )
  assert stats["rejected"] == {**malformed_counts, "duplicate": 8 * 20}
  assert sum(malformed_counts.values()) == 8 * 25
  assert stats["put_wait_s"] > 0.2 and stats["put_timeouts"] == 0  # backpressure, no drops
  # The intruder got nothing in.
  assert len(errors) == 5 and not any(u.startswith("evil") for u in consumed)
  assert unauthenticated == 5
