"""Latency of sandboxed runs: `python -m sao_jax.envs.sandbox_bench` prints a table.

Each run is `print(i)` through `sandbox.run_python` (a fresh process tree per run), at every
isolation level the host supports, one at a time and 16 at once from threads (as RL rollout
workers call it).
"""

import concurrent.futures
import time

import numpy as np

from sao_jax.envs import sandbox


def main(n: int = 32):
  """Prints the latency of trivial runs: sequential, and 16 at once (threads)."""
  levels = ["rlimit"] + (["bwrap"] if sandbox.isolation() == "bwrap" else [])
  print(f"{'isolation':<10}{'mode':<14}{'runs':>6}{'p50 ms':>9}{'p90 ms':>9}{'runs/s':>9}")
  for level in levels:
    for workers in (1, 16):
      job = lambda i: sandbox.run_python(f"print({i})", isolation_level=level).wall_s
      start = time.monotonic()
      with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        walls = np.array(list(pool.map(job, range(n))))
      rate = n / (time.monotonic() - start)
      mode = "sequential" if workers == 1 else f"{workers} threads"
      p50, p90 = np.percentile(walls, [50, 90]) * 1000
      print(f"{level:<10}{mode:<14}{n:>6}{p50:>9.0f}{p90:>9.0f}{rate:>9.1f}")


if __name__ == "__main__":
  main()
