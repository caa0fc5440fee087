"""Decoder throughput and model FLOP utilization (MFU) against the matmul peak measured in the run.

  python benchmarks/bench_model.py                       # tiny and smollm2_135m, batch 8 x 128
  python benchmarks/bench_model.py --models=smollm2_135m --batch=4 --seq=512

For each model: forward (`Policy.token_logprobs`, the training log-prob path through the fused
kernel) and forward+backward (its gradient w.r.t. all parameters) tokens/s, and MFU = model FLOPs
/ time / peak. The peak is the float32 GEMM rate XLA reaches on this machine (best of 1024^3 and
2048^3 products), measured right before and right after every timed model call: each model
timing is paired with the better of its two neighbouring peaks, so a machine shared with other
jobs slows both sides of the ratio alike. The table gives the best time (tokens/s) and the median
of the paired MFUs.

Model FLOPs per token (PaLM appendix B convention, full T x T attention as computed): forward
2 * P_matmul + 4 * L * T * N * H, forward+backward three times that; P_matmul counts every weight
matrix including the LM head (for MoE: the k active experts and the router), not the embedding
gather. Random weights (speed does not depend on values).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sao_jax import models

_GEMMS = {}


def _time(fn, *args) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - t0


def gemm_peak(repeats: int = 2) -> float:
  """Best float32 GEMM FLOP/s over n = 1024 and 2048 (square products), `repeats` tries each."""
  best = 0.0
  for n in (1024, 2048):
    if n not in _GEMMS:
      a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
      _GEMMS[n] = (jax.jit(jnp.dot), a, a + 1.0)
      _time(*_GEMMS[n])  # compile
    best = max(best, max(2 * n**3 / _time(*_GEMMS[n]) for _ in range(repeats)))
  return best


def paired(fn, args, flops: float, repeats: int) -> tuple[float, float, float]:
  """(best seconds, median paired MFU, best peak FLOP/s) of `fn(*args)` over `repeats` calls."""
  jax.block_until_ready(fn(*args))  # compile + warm up
  times, mfus, peaks = [], [], []
  before = gemm_peak()
  for _ in range(repeats):
    t = _time(fn, *args)
    after = gemm_peak()
    peak = max(before, after)
    times.append(t)
    mfus.append(flops / t / peak)
    peaks.append(peak)
    before = after
  return min(times), statistics.median(mfus), max(peaks)


def flops_per_token(cfg: models.ModelConfig, seq: int) -> float:
  """Forward model FLOPs per token: 2 * matmul params + full-T attention scores and values."""
  d, n, k, h, layers = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
  attn = d * h * (n + 2 * k) + n * h * d
  mlp = 3 * d * cfg.mlp_dim
  if cfg.is_moe:
    mlp = cfg.experts_per_token * 3 * d * cfg.moe_mlp_dim + d * cfg.num_experts
  matmul_params = layers * (attn + mlp) + d * cfg.vocab_size
  return 2 * matmul_params + 4 * layers * seq * n * h


def bench_model(name: str, batch: int, seq: int, repeats: int) -> dict[str, float]:
  """Forward and forward+backward timings (see `paired`) for one preset."""
  cfg = models.get_preset(name)
  policy = models.Policy(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(0), (batch, seq), 0, cfg.vocab_size)
  fwd = jax.jit(lambda m, t: m.token_logprobs(t)[0])
  fwd_bwd = jax.jit(nnx.grad(lambda m, t: jnp.mean(m.token_logprobs(t)[0])))
  flops = flops_per_token(cfg, seq) * batch * seq
  out = dict(params=sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(policy))))
  out["fwd"], out["fwd_mfu"], p1 = paired(fwd, (policy, tokens), flops, repeats)
  out["fwd_bwd"], out["fwd_bwd_mfu"], p2 = paired(fwd_bwd, (policy, tokens), 3 * flops, repeats)
  out["peak"] = max(p1, p2)
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="tiny,smollm2_135m")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=5)
  args = ap.parse_args()
  tokens = args.batch * args.seq
  print(
    f"backend {jax.default_backend()}, {os.cpu_count()} CPUs, float32, "
    f"batch {args.batch} x {args.seq} tokens, {args.repeats} timed calls each"
  )
  print("| model | params | fwd tok/s | fwd+bwd tok/s | fwd MFU | fwd+bwd MFU | GEMM peak |")
  print("|---|---|---|---|---|---|---|")
  for name in args.models.split(","):
    r = bench_model(name, args.batch, args.seq, args.repeats)
    print(
      f"| {name} | {r['params'] / 1e6:.2f}M | {tokens / r['fwd']:,.0f} | "
      f"{tokens / r['fwd_bwd']:,.0f} | {100 * r['fwd_mfu']:.0f}% | "
      f"{100 * r['fwd_bwd_mfu']:.0f}% | {r['peak'] / 1e9:.1f} GFLOP/s |",
      flush=True,
    )


if __name__ == "__main__":
  main()
