"""`ReplayClient`: the producer side of the gRPC ReplayService, for rollout hosts.

A client pushes scored trajectories to a learner's ReplayService with the shared token, an explicit
message size limit (a trajectory too large to send is refused locally with reason "too_large", so
it cannot break the stream), and retries with exponential backoff and jitter while the learner is
unreachable (UNAVAILABLE: restarting, not yet up, queue closed). A retry re-sends the whole call;
the server accepts each uid once, so a "duplicate" answer on a retry for a uid this call already
sent means an earlier attempt delivered it, and it is counted as accepted (`resent`).

    client = ReplayClient("learner:50051", auth_token=token)
    accepted, reason = client.put(traj)          # mirrors ReplayQueue.put
    result = client.push(trajs)                  # one stream; result.rejections has the reasons
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterable

import grpc

from sao_jax.replay import replay_pb2 as pb
from sao_jax.replay import replay_pb2_grpc as pb_grpc
from sao_jax.replay import wire
from sao_jax.replay.base import QUEUE_FULL
from sao_jax.replay.server import DEFAULT_MAX_MESSAGE_BYTES, bearer_metadata
from sao_jax.types import Trajectory

_RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class ReplayAuthError(PermissionError):
  """The server refused the token (UNAUTHENTICATED)."""


class ReplayUnavailable(ConnectionError):
  """The server stayed unreachable through every retry, or failed the call for good."""


@dataclasses.dataclass
class PushResult:
  """Outcome of one `push`.

  Attributes:
    accepted: trajectories the queue took (including `resent` ones).
    rejections: (index in the pushed sequence, uid, reason) for each refused trajectory.
    resent: "duplicate" answers on a retry for uids an earlier attempt of this call had sent.
    version: the learner's policy version when the call ended.
    attempts: calls made (1 + retries).
  """

  accepted: int = 0
  rejections: list[tuple[int, str, str]] = dataclasses.field(default_factory=list)
  resent: int = 0
  version: int = -1
  attempts: int = 0


class ReplayClient:
  """Pushes trajectories to a ReplayService and reads its Stats / Health.

  Args:
    address: "host:port" of the learner's ReplayService.
    auth_token: the shared token (`authorization: Bearer <token>`).
    max_message_bytes: largest message sent or received (match the server's).
    max_retries: retries of a call while the server is UNAVAILABLE (None: forever).
    backoff_s: first retry delay; doubles per retry up to `max_backoff_s`, with jitter.
    max_backoff_s: the longest delay between retries.
  """

  def __init__(self, address: str, *, auth_token: str,
               max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, max_retries: int | None = 10,
               backoff_s: float = 0.1, max_backoff_s: float = 5.0):  # fmt: skip
    self.address = address
    self.max_message_bytes = max_message_bytes
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_backoff_s = max_backoff_s
    self._metadata = bearer_metadata(auth_token)
    self._channel = grpc.insecure_channel(
      address,
      options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # Reconnect quickly after a learner restart; our own retry loop paces the calls.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", int(max_backoff_s * 1000)),
      ],
    )
    self._stub = pb_grpc.ReplayServiceStub(self._channel)

  # ------------------------------------------------------------------ pushing

  def push(self, trajs: Iterable[Trajectory], *, timeout: float | None = None) -> PushResult:
    """Streams trajectories to the queue in one call (retried as a whole while UNAVAILABLE).

    Args:
      trajs: trajectories with numpy fields.
      timeout: deadline in seconds per attempt (a full queue makes the call slow); None: none.

    Returns:
      A PushResult; every refused trajectory appears in `rejections` with its reason.

    Raises:
      ReplayAuthError: the token was refused.
      TimeoutError: an attempt passed `timeout` (some trajectories may have been accepted).
      ReplayUnavailable: retries ran out, or the server failed the call (e.g. over its size limit).
      TypeError: a field is not numpy (style rule 9).
    """
    result = PushResult()
    sent: list[tuple[int, pb.Trajectory]] = []  # (index in trajs, message)
    for index, traj in enumerate(trajs):
      msg = wire.to_proto(traj)
      if msg.ByteSize() > self.max_message_bytes:
        result.rejections.append((index, traj.uid, "too_large"))
      else:
        sent.append((index, msg))
    summary = self._call(lambda: self._stub.Push(
      iter([m for _, m in sent]), metadata=self._metadata, timeout=timeout), result)  # fmt: skip
    result.accepted = summary.accepted
    result.version = summary.version
    first_index = {}  # uid -> its first position in `sent`
    for k, (_, msg) in enumerate(sent):
      first_index.setdefault(msg.uid, k)
    for r in summary.rejections:
      if r.reason == "duplicate" and result.attempts > 1 and first_index.get(r.uid) == r.index:
        result.accepted += 1  # an earlier attempt of this very call delivered it
        result.resent += 1
      else:
        result.rejections.append((sent[r.index][0], r.uid, r.reason))
    result.rejections.sort()
    return result

  def put(self, traj: Trajectory, timeout: float | None = None) -> tuple[bool, str | None]:
    """Pushes one trajectory; the same contract as `ReplayQueue.put`.

    Args:
      traj: the trajectory.
      timeout: deadline in seconds (backpressure); on expiry returns (False, "queue_full").

    Returns:
      (True, None) if accepted, else (False, reason).
    """
    try:
      result = self.push([traj], timeout=timeout)
    except TimeoutError:
      return False, QUEUE_FULL
    if result.accepted:
      return True, None
    return False, result.rejections[0][2]

  def _call(self, fn, result: PushResult | None = None):
    """Runs `fn` (one RPC), retrying with backoff while the server is UNAVAILABLE."""
    attempt = 0
    while True:
      attempt += 1
      if result is not None:
        result.attempts = attempt
      try:
        return fn()
      except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
          raise ReplayAuthError(f"replay server {self.address}: {e.details()}") from e
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
          raise TimeoutError(f"replay server {self.address}: deadline exceeded") from e
        retries_left = self.max_retries is None or attempt <= self.max_retries
        if code not in _RETRYABLE or not retries_left:
          raise ReplayUnavailable(
            f"replay server {self.address}: {code.name} after {attempt} attempt(s): {e.details()}"
          ) from e
      delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
      time.sleep(delay * random.uniform(0.5, 1.0))

  # ------------------------------------------------------------------ reading

  def stats(self, timeout: float | None = 10.0) -> dict:
    """The server's `ReplayQueue.stats()` plus "unauthenticated" (refused calls)."""
    reply = self._call(
      lambda: self._stub.Stats(pb.StatsRequest(), metadata=self._metadata, timeout=timeout)
    )
    out = {f.name: getattr(reply, f.name) for f in pb.StatsReply.DESCRIPTOR.fields}
    out["rejected"] = dict(reply.rejected)
    out["lag_histogram"] = dict(reply.lag_histogram)
    return out

  def health(self, timeout: float = 2.0) -> bool:
    """True if the server answers and its queue is open (one attempt, no retries)."""
    try:
      return self._stub.Health(pb.HealthRequest(), timeout=timeout).serving
    except grpc.RpcError:
      return False

  def wait_ready(self, timeout: float = 30.0) -> None:
    """Blocks until the server answers Health as serving; raises ReplayUnavailable otherwise."""
    deadline = time.monotonic() + timeout
    while not self.health(timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
      if time.monotonic() >= deadline:
        raise ReplayUnavailable(f"replay server {self.address} not ready after {timeout} s")
      time.sleep(0.1)

  def close(self) -> None:
    """Closes the channel (in-flight calls are cancelled)."""
    self._channel.close()

  def __enter__(self) -> ReplayClient:
    return self

  def __exit__(self, *exc):
    self.close()
