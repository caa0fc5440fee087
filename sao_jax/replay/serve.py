"""A standalone ReplayService for tests and tools.

    python -m sao_jax.replay.serve --port 0 --auth-token T --vocab-size 320 \
        [--capacity 1024] [--max-policy-lag 4] [--max-len N] [--host 127.0.0.1]

Prints the bound port (one line, flushed; `--port 0` picks a free one), then serves an in-memory
queue until SIGINT or SIGTERM. Nothing consumes from this queue: once full, producers block.
Read its counters with `ReplayClient(addr, auth_token=T).stats()`. The token may also come from
$SAO_REPLAY_TOKEN.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from sao_jax.replay.memory import InMemoryQueue
from sao_jax.replay.server import DEFAULT_MAX_MESSAGE_BYTES, ReplayServer


def _parse(argv: list[str] | None) -> argparse.Namespace:
  p = argparse.ArgumentParser(
    prog="python -m sao_jax.replay.serve", description=__doc__.split("\n")[0]
  )
  p.add_argument("--port", type=int, default=0, help="port to bind (0: a free one)")
  p.add_argument("--host", default="127.0.0.1", help="interface ('0.0.0.0' for remote actors)")
  p.add_argument("--auth-token", default=os.environ.get("SAO_REPLAY_TOKEN", ""),
                 help="shared Bearer token (default: $SAO_REPLAY_TOKEN)")  # fmt: skip
  p.add_argument("--vocab-size", type=int, required=True, help="token ids must be below this")
  p.add_argument("--capacity", type=int, default=1024, help="queue capacity in trajectories")
  p.add_argument("--max-policy-lag", type=int, default=4, help="staleness bound in versions")
  p.add_argument("--max-len", type=int, default=None, help="most tokens per trajectory")
  p.add_argument("--version", type=int, default=0, help="the learner's policy version")
  p.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
  args = p.parse_args(argv)
  if not args.auth_token:
    p.error("--auth-token (or $SAO_REPLAY_TOKEN) is required")
  return args


def main(argv: list[str] | None = None) -> int:
  """Serves until SIGINT/SIGTERM; returns the exit code (argparse exits with 2 on bad flags)."""
  args = _parse(argv)
  queue = InMemoryQueue(args.capacity, max_policy_lag=args.max_policy_lag,
                        vocab_size=args.vocab_size, max_len=args.max_len, version=args.version)  # fmt: skip
  server = ReplayServer(queue, auth_token=args.auth_token, host=args.host, port=args.port,
                        max_message_bytes=args.max_message_bytes)  # fmt: skip
  port = server.start()
  print(port, flush=True)
  done = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: done.set())
  while not done.wait(1.0):
    pass
  queue.close()
  server.stop(grace=1.0)
  return 0


if __name__ == "__main__":
  sys.exit(main())
