"""Benchmark: fused token log-probs (memory and time) and skip-observation GAE (time vs T).

Part 1, for (N, D, V) up to the Qwen3 vocabulary: forward + backward of
`sum(a * logp) + sum(b * entropy)` w.r.t. hidden and lm_head, for
  naive   materialized [N, V] logits (kernels.fused_logprobs.reference),
  xla     the chunked XLA path (kernels.fused_token_logprobs, impl="xla"),
  pallas  the Pallas kernels (interpret mode on CPU: small sizes only).
Memory is XLA's compiled temporary allocation (`jit(f).lower(...).compile().memory_analysis()`,
parameters and outputs excluded), so it needs no memory to measure. Time is the best of a few runs,
only where the run fits this machine (`--max-run-gflop`), together with the max relative error
against the naive path where that runs too.

Part 2: skip-observation GAE (jit, best of a few runs) for T = 1k ... 128k: the associative-scan
implementation against the serial `lax.scan` reference.

Usage:
  python benchmarks/bench_loss.py            # full grid (about 15 min on 2 CPU cores)
  python benchmarks/bench_loss.py --quick    # small grid (about two minutes)
  python benchmarks/bench_loss.py --only gae --gae-batch 1 16 64
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from kernels.fused_logprobs import fused_token_logprobs, token_logprobs_reference
from sao_jax import advantages

jax.config.update("jax_default_matmul_precision", "highest")

GRID_FULL = [
  (1024, 256, 32768),
  (2048, 512, 65536),
  (4096, 1024, 151936),
  (8192, 2048, 151936),
  (32768, 2048, 151936),
]
GRID_QUICK = [(512, 128, 4096), (2048, 256, 32768)]
GAE_T_FULL = [1024, 4096, 16384, 65536, 131072]
GAE_T_QUICK = [1024, 16384]
PALLAS_MAX_GFLOP = 30.0  # interpreted Pallas is a correctness harness on CPU, not a fast path


def _objective(fn):
  def loss(h, w, t, g):
    logp, ent = fn(h, w, t)
    return jnp.sum(g[0] * logp) + jnp.sum(g[1] * ent)

  return jax.jit(jax.value_and_grad(loss, (0, 1)))


PATHS = {
  "naive": _objective(token_logprobs_reference),
  "xla": _objective(lambda h, w, t: fused_token_logprobs(h, w, t, impl="xla")),
  "pallas": _objective(lambda h, w, t: fused_token_logprobs(h, w, t, impl="pallas")),
}


def _abstract(n, d, v):
  f32 = jnp.float32
  return (
    jax.ShapeDtypeStruct((n, d), f32),
    jax.ShapeDtypeStruct((d, v), f32),
    jax.ShapeDtypeStruct((n,), jnp.int32),
    jax.ShapeDtypeStruct((2, n), f32),
  )


def _concrete(n, d, v, seed=0):
  rng = np.random.default_rng(seed)
  return (
    jnp.asarray(rng.normal(size=(n, d)), jnp.float32),
    jnp.asarray(rng.normal(size=(d, v)) / np.sqrt(d), jnp.float32),
    jnp.asarray(rng.integers(0, v, size=n), jnp.int32),
    jnp.asarray(rng.normal(size=(2, n)), jnp.float32),
  )


def _best_time(fn, *args, repeats=3):
  jax.block_until_ready(fn(*args))  # compile + warm up
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def _rel_err(a, b):
  return max(
    float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(y)), 1e-30))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
  )


def bench_logprobs(grid, max_run_gflop, max_run_gb):
  rows = []
  for n, d, v in tqdm.tqdm(grid, desc="fused log-probs"):
    gflop = 2 * n * d * v / 1e9  # one logits matmul
    naive_out = None
    for path in ("naive", "xla", "pallas"):
      if path == "pallas" and gflop > PALLAS_MAX_GFLOP:
        continue
      temp = PATHS[path].lower(*_abstract(n, d, v)).compile().memory_analysis().temp_size_in_bytes
      secs = err = None
      fits = path != "naive" or temp / 1e9 <= max_run_gb
      if gflop <= max_run_gflop and fits:
        args = _concrete(n, d, v)
        secs = _best_time(PATHS[path], *args, repeats=2)
        out = PATHS[path](*args)
        if path == "naive":
          naive_out = out
        elif naive_out is not None:
          err = _rel_err(out, naive_out)
      rows.append((n, d, v, path, temp, secs, err))
  return rows


def bench_gae(ts, batch):
  rows = []
  for t in tqdm.tqdm(ts, desc="skip-observation GAE"):
    rng = np.random.default_rng(0)
    mask = jnp.asarray((rng.random((batch, t)) < 0.7) & (np.arange(t) > 16))
    r = jnp.asarray(rng.normal(size=(batch, t)), jnp.float32) * mask
    v = jnp.asarray(rng.normal(size=(batch, t)), jnp.float32)
    out = {}
    for name in ("associative", "serial"):
      f = jax.jit(
        lambda r, v, m, name=name: advantages.skip_observation_gae(
          r, v, m, gamma=1.0, lam=0.999, method=name
        )
      )
      t0 = time.perf_counter()
      f.lower(r, v, mask).compile()
      compile_s = time.perf_counter() - t0
      out[name] = (_best_time(f, r, v, mask, repeats=5), compile_s)
    rows.append((batch, t, *out["associative"], *out["serial"]))
  return rows


def _fmt_bytes(x):
  return f"{x / 2**30:.3f} GiB" if x >= 2**30 else f"{x / 2**20:.1f} MiB"


def print_logprob_table(rows):
  print("\n| N | D | V | path | temp memory | vs naive | fwd+bwd time | max rel err vs naive |")
  print("|---|---|---|---|---|---|---|---|")
  naive = {(n, d, v): temp for n, d, v, p, temp, _, _ in rows if p == "naive"}
  for n, d, v, path, temp, secs, err in rows:
    ratio = f"{100 * temp / naive[n, d, v]:.2f}%" if naive.get((n, d, v)) else "-"
    t = f"{secs:.3f} s" if secs is not None else "not run"
    e = f"{err:.1e}" if err is not None else "-"
    print(f"| {n} | {d} | {v} | {path} | {_fmt_bytes(temp)} | {ratio} | {t} | {e} |")


def print_gae_table(rows):
  print("\n| B | T | associative run | (compile) | serial run | (compile) | serial / associative |")
  print("|---|---|---|---|---|---|---|")
  for b, t, a_run, a_c, s_run, s_c in rows:
    print(f"| {b} | {t} | {1e3 * a_run:.2f} ms | {a_c:.1f} s | {1e3 * s_run:.2f} ms | "
          f"{s_c:.1f} s | {s_run / a_run:.2f}x |")  # fmt: skip


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small grid")
  parser.add_argument("--max-run-gflop", type=float, default=200.0,
                      help="time only where the logits matmul is below this many GFLOP")  # fmt: skip
  parser.add_argument("--max-run-gb", type=float, default=12.0,
                      help="run the naive path only if its temporaries fit in this")  # fmt: skip
  parser.add_argument("--gae-batch", type=int, nargs="+", default=[1, 16])
  parser.add_argument("--only", choices=("logprobs", "gae"), help="run one part")
  args = parser.parse_args()
  print(f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs")
  if args.only != "gae":
    grid = GRID_QUICK if args.quick else GRID_FULL
    print_logprob_table(bench_logprobs(grid, args.max_run_gflop, args.max_run_gb))
  if args.only != "logprobs":
    ts = GAE_T_QUICK if args.quick else GAE_T_FULL
    print_gae_table([row for b in args.gae_batch for row in bench_gae(ts, b)])


if __name__ == "__main__":
  main()
