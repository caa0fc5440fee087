"""The gRPC `ReplayService` (replay.proto): remote rollout hosts push into a learner's ReplayQueue.

`ReplayServer(queue, auth_token=...)` serves a queue the learner owns and reads from directly with
`queue.get_batch`. Every Push and Stats call must carry `authorization: Bearer <token>`, else it
is refused with UNAUTHENTICATED (and counted). Each streamed trajectory is decoded (numpy only),
validated and deduplicated by the queue, and answered in the PushSummary with a reason when
refused. Backpressure: while the queue is full the handler does not read the next message, so
gRPC flow control slows the producer; nothing is dropped. Message size limits are explicit on the
server (receive and send), and the client sets its own (stack.md: the 4 MiB default applies on both
ends). The transport is plaintext: run it on a private network (the token is not a substitute for
TLS on a public one).
"""

from __future__ import annotations

import concurrent.futures
import hmac
import os
import threading

import grpc

from sao_jax.replay import replay_pb2 as pb
from sao_jax.replay import replay_pb2_grpc as pb_grpc
from sao_jax.replay import wire
from sao_jax.replay.base import ReplayQueue

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVICE_NAME = "sao_jax.replay.v1.ReplayService"

try:  # grpc's standard health service, when grpcio-health-checking is installed
  from grpc_health.v1 import health as _health
  from grpc_health.v1 import health_pb2 as _health_pb2
  from grpc_health.v1 import health_pb2_grpc as _health_pb2_grpc
except ImportError:  # the service's own Health rpc still answers
  _health = None


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
  """The call metadata that authenticates with `token`."""
  return (("authorization", f"Bearer {token}"),)


def stats_reply(stats: dict, unauthenticated: int = 0) -> pb.StatsReply:
  """Builds a StatsReply from `ReplayQueue.stats()`."""
  reply = pb.StatsReply(unauthenticated=unauthenticated)
  for key, value in stats.items():
    if key in ("rejected", "lag_histogram"):
      getattr(reply, key).update({k: int(v) for k, v in value.items()})
    else:
      setattr(reply, key, value)
  return reply


def make_server(queue: ReplayQueue, config) -> ReplayServer | None:
  """The learner's ReplayServer from `config.replay` (None when `serve_address` is empty).

  Args:
    queue: the learner's queue.
    config: a run config; `replay.serve_address` is "host:port" (port 0: a free one), the token is
      `replay.auth_token` or else $SAO_REPLAY_TOKEN.

  Returns:
    A started server, or None for an in-process-only run.
  """
  r = config.replay
  if not r.serve_address:
    return None
  host, sep, port = r.serve_address.rpartition(":")
  if not sep or not port.isdigit():
    raise ValueError(f"replay.serve_address must be 'host:port', got {r.serve_address!r}")
  token = r.auth_token or os.environ.get("SAO_REPLAY_TOKEN", "")
  if not token:
    raise ValueError("replay.auth_token is empty and $SAO_REPLAY_TOKEN is not set")
  server = ReplayServer(queue, auth_token=token, host=host or "127.0.0.1", port=int(port),
                        max_message_bytes=r.max_message_bytes)  # fmt: skip
  server.start()
  return server


class ReplayServicer(pb_grpc.ReplayServiceServicer):
  """Implements ReplayService over a ReplayQueue.

  Args:
    queue: the queue that accepted trajectories go into.
    auth_token: the shared secret of `authorization: Bearer <token>`.
  """

  def __init__(self, queue: ReplayQueue, *, auth_token: str):
    if not auth_token:
      raise ValueError("auth_token must be a non-empty string")
    self.queue = queue
    self._expected = f"Bearer {auth_token}".encode()
    self._lock = threading.Lock()
    self.unauthenticated = 0

  def _authenticate(self, context: grpc.ServicerContext):
    for key, value in context.invocation_metadata():
      if key == "authorization" and hmac.compare_digest(value.encode(), self._expected):
        return
    with self._lock:
      self.unauthenticated += 1
    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong 'authorization: Bearer' token")

  def _put(self, traj, context: grpc.ServicerContext) -> tuple[bool, str | None]:
    """Puts with backpressure, giving up only when the client has gone or the queue closed."""
    accepted, reason = self.queue.put(traj, cancel=lambda: not context.is_active())
    if reason == "closed":
      # Not the trajectory's fault: tell the client to retry elsewhere or later.
      context.abort(grpc.StatusCode.UNAVAILABLE, "replay queue is closed")
    return accepted, reason

  def Push(self, request_iterator, context):
    """Stream of trajectories -> PushSummary with one Rejection per refused trajectory."""
    self._authenticate(context)
    summary = pb.PushSummary()
    for index, msg in enumerate(request_iterator):
      traj = wire.from_proto(msg)
      if isinstance(traj, str):
        self.queue.reject(traj)
        accepted, reason = False, traj
      else:
        accepted, reason = self._put(traj, context)
      if accepted:
        summary.accepted += 1
      else:
        summary.rejected += 1
        summary.rejections.add(index=index, uid=msg.uid, reason=reason)
    summary.version = self.queue.version
    return summary

  def Stats(self, request, context):
    """The queue's counters."""
    self._authenticate(context)
    return stats_reply(self.queue.stats(), self.unauthenticated)

  def Health(self, request, context):
    """Liveness (no token needed)."""
    return pb.HealthReply(serving=not self.queue.closed, version=self.queue.version)


class ReplayServer:
  """A gRPC server hosting ReplayService (and grpc.health.v1.Health when installed).

  Args:
    queue: the queue to fill; the caller keeps reading it.
    auth_token: the shared secret clients send as `authorization: Bearer <token>`.
    host: interface to bind ("127.0.0.1" local only; "0.0.0.0" or "[::]" for remote actors).
    port: port to bind; 0 picks a free one (see `.port` after `start`).
    max_message_bytes: largest message received or sent.
    max_workers: handler threads; each open Push stream holds one, so size it above the number of
      concurrent producers.
  """

  def __init__(self, queue: ReplayQueue, *, auth_token: str, host: str = "127.0.0.1",
               port: int = 0, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
               max_workers: int = 32):  # fmt: skip
    self.servicer = ReplayServicer(queue, auth_token=auth_token)
    self.queue = queue
    self.host = host
    self.max_message_bytes = max_message_bytes
    self._server = grpc.server(
      concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="replay"),
      options=[
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),  # a second server on a busy port must fail, not share it
      ],
    )
    pb_grpc.add_ReplayServiceServicer_to_server(self.servicer, self._server)
    self._health = None
    if _health is not None:
      self._health = _health.HealthServicer()
      _health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
    try:
      self.port = self._server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
      raise OSError(f"replay server: cannot bind {host}:{port}: {e}") from e
    if self.port == 0:
      raise OSError(f"replay server: cannot bind {host}:{port}")

  @property
  def address(self) -> str:
    """`host:port` for clients (a wildcard host is reached via localhost)."""
    host = "127.0.0.1" if self.host in ("0.0.0.0", "[::]", "") else self.host
    return f"{host}:{self.port}"

  def start(self) -> int:
    """Starts serving; returns the bound port."""
    self._server.start()
    if self._health is not None:
      for name in ("", SERVICE_NAME):
        self._health.set(name, _health_pb2.HealthCheckResponse.SERVING)
    return self.port

  def stop(self, grace: float | None = 1.0) -> None:
    """Stops serving; open streams are cancelled after `grace` seconds. The queue stays open."""
    if self._health is not None:
      self._health.enter_graceful_shutdown()
    self._server.stop(grace).wait()

  def wait(self, timeout: float | None = None) -> bool:
    """Blocks until the server terminates (or `timeout`); True if it did."""
    return self._server.wait_for_termination(timeout)

  def __enter__(self) -> ReplayServer:
    self.start()
    return self

  def __exit__(self, *exc):
    self.stop()
